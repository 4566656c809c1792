"""GeometryMonitor / GeometryCallback: training is bit-identical with and without the monitor, the
states are the model's own (agreement with ``output_hidden_states``), the rows are lmgeom's tidy
table that the sweep's figures read, and a real ``transformers.Trainer`` run logs through its
reporters (a TensorBoard event file read back) and writes the parquet.

End-to-end half (the unit half is tests/unit/test_monitor.py).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from support.monitor import (
    PROBE,
    Rows,
    dropout_llama,
    make_tok,
)

from lmgeom.monitor import GeometryCallback, GeometryMonitor


def _train(model, steps=20, *, monitor=None, extra_draw=False):
    """20 Adam steps on batches drawn from numpy's and Python's global generators (so those
    generators matter as much as torch's)."""
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(1, steps + 1):
        B, T = 4, 10 + random.randint(0, 4)
        ids = torch.from_numpy(np.random.randint(4, 256, size=(B, T))).long()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        if monitor is not None:
            monitor.step(step)
            assert model.training  # the mode is restored
        if extra_draw:
            torch.rand(1)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_training_is_bit_identical_with_and_without_the_monitor(tiny_dir):
    plain = _train(dropout_llama())
    model = dropout_llama()
    mon = GeometryMonitor(model, PROBE, tokenizer=make_tok(tiny_dir), every=4, k=8, n_null=20)
    watched = _train(model, monitor=mon)
    assert [t["step"] for t in mon.timings] == [4, 8, 12, 16, 20]
    assert all(torch.equal(plain[k], watched[k]) for k in plain)
    # the check can fail: one extra draw from the torch generator changes the trained weights
    drawn = _train(dropout_llama(), extra_draw=True)
    assert not all(torch.equal(plain[k], drawn[k]) for k in plain)
    # and the geometry did move during training
    df = mon.rows()
    z = df[(df.metric == "dispersion") & (df.layer == "final")].set_index("revision")["value"]
    assert list(z.index) == ["step4", "step8", "step12", "step16", "step20"]
    assert z.nunique() == 5


def test_rows_are_the_sweep_table_and_its_figures_read_them(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from lmgeom.experiments.sweep import tracked_layers, trajectory_rows
    from lmgeom.report.figures_sweep import plot_profiles, plot_trajectory
    from lmgeom.results.table import COLUMNS, frame, read_table

    model = AutoModelForCausalLM.from_pretrained(tiny_dir("llama"))
    mon = GeometryMonitor(model, PROBE, tokenizer=make_tok(tiny_dir), every=1, k=8, name="tiny")
    for step in (0, 1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.05)
        mon.step(step)
    path = mon.to_parquet(tmp_path / "geometry.parquet")
    df = read_table(path)
    assert tuple(df.columns) == COLUMNS
    assert set(df.revision) == {"step0", "step1", "step2"}
    assert plot_profiles(df, tmp_path / "plots")
    traj = trajectory_rows(df, tracked_layers(df, {}))
    assert traj and plot_trajectory(frame([*df.to_dict("records"), *traj]), tmp_path / "plots")
    mon.to_parquet(path)  # lmgeom's own file: replaced
    (tmp_path / "user.parquet").write_text("mine")
    with pytest.raises(Exception, match="did not write"):
        mon.to_parquet(tmp_path / "user.parquet")


def _trainer(tiny_dir, out, callback: bool, report_to):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), max_steps=20, per_device_train_batch_size=4,
                             logging_steps=5, report_to=report_to, save_strategy="no",
                             use_cpu=True, learning_rate=3e-3, disable_tqdm=True, seed=11)
    model = dropout_llama()
    trainer = Trainer(model=model, args=args, train_dataset=Rows(),
                      processing_class=make_tok(tiny_dir))
    cb = GeometryCallback(probe_texts=PROBE, every=5, k=8, layers="2,final") if callback else None
    if cb is not None:
        cb.attach(trainer)
    trainer.train()
    return model, trainer, cb


def test_trainer_run_logs_to_tensorboard_and_writes_the_parquet(tiny_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lmgeom.results.table import read_table

    model, _, _ = _trainer(tiny_dir, tmp_path / "run", True, ["tensorboard"])
    events = sorted((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    # the reporter's own convention prefixes training-time keys with "train/"
    assert {"train/geometry/pga_z/final", "train/geometry/dispersion/2", "train/loss"} <= set(tags)
    z_tb = {e.step: e.value for e in acc.Scalars("train/geometry/pga_z/final")}
    assert sorted(z_tb) == [0, 5, 10, 15, 20]
    # the Trainer's own loss logging is untouched at the steps the monitor also logs
    assert sorted(e.step for e in acc.Scalars("train/loss")) == [5, 10, 15, 20]
    df = read_table(tmp_path / "run" / "geometry.parquet")
    z = df[(df.metric == "pga_z") & (df.layer == "final")]
    assert {int(r[4:]): v for r, v in zip(z.revision, z.value)} == pytest.approx(z_tb, rel=1e-6)
    assert (z.seed == 0).all() and (z.setting == "ccr=1").all()
    # training with the callback is bit-identical to training without it
    plain, _, _ = _trainer(tiny_dir, tmp_path / "plain", False, [])
    a, b = model.state_dict(), plain.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)

