"""``lmgeom train`` end to end on a tiny random model (full and LoRA, within and cross), the
data schedule, and resuming from a checkpoint.

End-to-end half (the unit half is tests/unit/test_train.py).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from lmgeom.cli import main
from lmgeom.experiments.base import experiment_for, run_experiment
from lmgeom.experiments.finetune import (
    FinetuneConfig,
    evaluate,
    prepare_data,
)

WORDS = {
    "prose": ("the cat sat on a mat while dogs ran far away from home into the big green "
              "field"),
    "code": "def f ( x ) : return x + 1 for i in range ( 10 ) : print ( i ) if x else None",
    "news": "prices rose sharply in the third quarter analysts said on monday in 1905",
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-texts")
    rng = random.Random(0)
    out = {}
    for name, line in WORDS.items():
        words = line.split()
        path = root / f"{name}.txt"
        path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(25))
                                  for _ in range(40)) + "\n")
        out[name] = str(path)
    return out


def _args(tiny, out, texts, *extra):
    argv = ["train", "--model", str(tiny), "--steps", "4", "--eval-every", "2",
            "--batch-size", "4", "--seq-len", "16", "--eval-chunks", "4", "--eval-batch-size", "4",
            "--out", str(out), "--quiet"]
    for t in texts:
        argv += ["--texts", t]
    return argv + list(extra)


def _read(out):
    import pandas as pd

    return pd.read_parquet(out / "train.parquet")


def test_full_finetune_end_to_end(tiny_dir, corpora, tmp_path):
    from safetensors.torch import load_file

    from lmgeom.models import load_model

    tiny = tiny_dir("llama")
    out = tmp_path / "full"
    rc = main(_args(tiny, out, [corpora["prose"]], "--full", "--aux", "push-away",
                    "--lambda", "0.5", "--eval-texts", corpora["news"]))
    assert rc == 0
    df = _read(out)
    assert set(df.arm) == {"push-away"}
    assert sorted(set(df.step)) == [0, 2, 4]
    assert set(df["eval"]) == {f"heldout:{corpora['prose']}", corpora["news"], "train"}
    ev = df[df["eval"] != "train"]
    assert set(ev.metric) == {"perplexity", "nll", "dispersion"}
    assert np.isfinite(df.value).all()
    ppl = ev[ev.metric == "perplexity"]
    nll = ev[ev.metric == "nll"]
    assert np.allclose(np.exp(nll.value.to_numpy()), ppl.value.to_numpy())
    # every evaluation figure carries a chunk-bootstrap interval around it
    assert (ev.ci_low <= ev.value + 1e-12).all() and (ev.value <= ev.ci_high + 1e-12).all()
    assert (ev[ev.metric == "perplexity"].ci_high > ev[ev.metric == "perplexity"].ci_low).all()
    assert set(df[df["eval"] == "train"].metric) == {"train_lm_loss", "train_dispersion", "train_aux"}
    # the saved model is a plain model folder lmgeom (and transformers) can load, with new weights
    folder = out / "arms" / "push-away" / "model"
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    tuned = load_model(folder, device="cpu")
    base = load_model(tiny, device="cpu")
    diff = [float((a - b).detach().abs().max()) for a, b in zip(tuned.hf_model.parameters(),
                                                         base.hf_model.parameters())]
    assert max(diff) > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["layer"] == "final"
    assert manifest["settings"]["method"] == "full" and manifest["settings"]["lam"] == 0.5
    assert (out / "report.html").is_file() and (out / "plots" / "train_curves.png").is_file()
    log = (out / "arms" / "push-away" / "train_log.csv").read_text().splitlines()
    assert len(log) == 1 + 4
    assert not (out / "arms" / "push-away" / "checkpoint").exists()  # removed once finished
    # the saved weights are the trained ones: step-4 perplexity reproduced from the folder

    cfg = FinetuneConfig(model=str(tiny), texts=(corpora["prose"],), batch_size=4, seq_len=16,
                         eval_chunks=4)
    _, sets = prepare_data(tuned, cfg)
    got = evaluate(tuned, sets, "final", batch_size=4)
    want = ppl[(ppl.step == 4) & (ppl["eval"] == f"heldout:{corpora['prose']}")].value.iloc[0]
    assert got[f"heldout:{corpora['prose']}"]["perplexity"] == pytest.approx(want, rel=1e-5)
    assert load_file(str(next(folder.glob("*.safetensors"))))


def test_lora_compare_cross_domain(tiny_dir, corpora, tmp_path):
    out = tmp_path / "lora"
    rc = main(_args(tiny_dir("llama"), out, [corpora["prose"], corpora["code"]], "--compare",
                    "--aux-mode", "cross", "--lambda", "2", "--lr", "3e-3", "--merge-lora"))
    assert rc == 0
    df = _read(out)
    assert list(dict.fromkeys(df.arm)) == ["none", "push-away", "squeeze"]
    pair = f"heldout:{corpora['prose']}|heldout:{corpora['code']}"
    cross = df[df.metric == "cross_dispersion"]
    assert set(cross["eval"]) == {pair}
    # step 0 is the same base model for every arm
    s0 = df[(df.step == 0)].pivot_table(index=["metric", "eval"], columns="arm", values="value")
    assert np.allclose(s0["none"], s0["push-away"]) and np.allclose(s0["none"], s0["squeeze"])
    # the same batches for every arm: the step-1 LM loss is identical (same init, same data)
    logs = {a: (out / "arms" / a / "train_log.csv").read_text().splitlines()[1].split(",")
            for a in ("none", "push-away", "squeeze")}
    assert logs["none"][1] == logs["push-away"][1] == logs["squeeze"][1]
    # the training-batch cross-domain distance moves apart / together
    tr = df[(df.metric == "train_dispersion") & (df.step == 4)].set_index("arm").value
    assert tr["push-away"] > tr["none"] > tr["squeeze"]
    # paired deltas vs the none arm: value = arm - none on the same chunks, CI brackets it
    for metric in ("perplexity", "dispersion"):
        dl = df[df.metric == f"{metric}_delta_vs_none"]
        assert set(dl.arm) == {"push-away", "squeeze"}
        last = df[(df.metric == metric) & (df.step == 4)].pivot_table(index="eval", columns="arm",
                                                                       values="value")
        for _, r in dl.iterrows():
            assert r.value == pytest.approx(last.loc[r["eval"], r.arm] - last.loc[r["eval"], "none"],
                                            rel=1e-6, abs=1e-9)  # float32 chunk means
            assert r.ci_low <= r.value <= r.ci_high
    # a finished run is read back on rerun, not retrained: same table, adapters untouched
    adapter = out / "arms" / "push-away" / "model" / "adapter_model.safetensors"
    mtime = adapter.stat().st_mtime_ns
    args = _args(tiny_dir("llama"), out, [corpora["prose"], corpora["code"]], "--compare",
                 "--aux-mode", "cross", "--lambda", "2", "--lr", "3e-3", "--merge-lora")
    assert main(args) == 0
    assert adapter.stat().st_mtime_ns == mtime
    df2 = _read(out)
    d1 = df[df.metric.str.endswith("_delta_vs_none")].set_index(["arm", "eval", "metric"]).value.sort_index()
    d2 = df2[df2.metric.str.endswith("_delta_vs_none")].set_index(["arm", "eval", "metric"]).value.sort_index()
    assert d1.index.equals(d2.index)
    np.testing.assert_array_equal(d2.to_numpy(), d1.to_numpy())
    for arm in ("none", "push-away", "squeeze"):
        ad = out / "arms" / arm / "model"
        assert (ad / "adapter_model.safetensors").is_file() and (ad / "adapter_config.json").is_file()
    html = (out / "report.html").read_text()
    assert "Perplexity and dispersion over training steps" in html
    # --merge-lora: a plain model folder with the adapter folded in (reproduces the final ppl)
    from lmgeom.models import load_model

    merged = load_model(out / "arms" / "push-away" / "merged", device="cpu")
    cfg = FinetuneConfig(model="x", texts=(corpora["prose"], corpora["code"]), batch_size=4,
                         seq_len=16, eval_chunks=4)
    _, sets = prepare_data(merged, cfg)
    got = evaluate(merged, sets, "final", batch_size=4)
    ppl = df[(df.metric == "perplexity") & (df.arm == "push-away") & (df.step == 4)]
    for name, m in got.items():
        want = ppl[ppl["eval"] == name].value.iloc[0]
        assert m["perplexity"] == pytest.approx(want, rel=1e-4)


def test_resume_continues_exactly(tiny_dir, corpora, tmp_path):
    from safetensors.torch import load_file

    tiny = tiny_dir("llama")
    ref, part = tmp_path / "ref", tmp_path / "part"
    extra = ("--aux", "squeeze", "--lambda", "1", "--max-tokens", "20", "--save-every", "1")
    assert main(_args(tiny, ref, [corpora["prose"]], *extra)) == 0
    assert main(_args(tiny, part, [corpora["prose"]], *extra, "--stop-after", "3")) == 0
    ck = part / "arms" / "squeeze" / "checkpoint"
    assert json.loads((ck / "state.json").read_text())["step"] == 3
    assert not (part / "report.html").exists()
    assert main(_args(tiny, part, [corpora["prose"]], *extra)) == 0
    a = load_file(str(ref / "arms" / "squeeze" / "model" / "adapter_model.safetensors"))
    b = load_file(str(part / "arms" / "squeeze" / "model" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7)
    da, db = _read(ref), _read(part)
    assert np.allclose(da.value.to_numpy(), db.value.to_numpy(), rtol=1e-6)
    la = (ref / "arms" / "squeeze" / "train_log.csv").read_text().splitlines()
    lb = (part / "arms" / "squeeze" / "train_log.csv").read_text().splitlines()
    assert [r.split(",")[:3] for r in la] == [r.split(",")[:3] for r in lb]
    # a finished run is read back, not retrained; another setting in the same folder is refused
    assert main(_args(tiny, part, [corpora["prose"]], *extra)) == 0
    assert main(_args(tiny, part, [corpora["prose"]], "--aux", "push-away")) == 2


def test_registered_experiment_matches_the_cli_and_runs_hooks(tiny_dir, corpora, tmp_path):
    """`lmgeom train` is the registered experiment "train": run_experiment on the config the
    CLI builds gives the same table; make_hooks' hooks see every step after the update."""
    from lmgeom.cli import build_parser
    from lmgeom.commands.train import config_from_args

    tiny = tiny_dir("llama")
    assert experiment_for("train") is FinetuneConfig
    argv = _args(tiny, tmp_path / "cli", [corpora["prose"]], "--full", "--lambda", "0.5")
    assert main(argv) == 0
    cfg = config_from_args(build_parser(["train"]).parse_args(argv))
    seen = []

    class Monitor:
        def __init__(self, arm, model, arm_dir):
            self.arm, self.model, self.arm_dir = arm, model, arm_dir

        def step(self, step):
            seen.append((self.arm, step, self.arm_dir.name))

    cfg.make_hooks = lambda arm, model, arm_dir: [Monitor(arm, model, arm_dir)]
    run = run_experiment(cfg, tmp_path / "api")
    assert seen == [("push-away", s, "push-away") for s in (1, 2, 3, 4)]
    a, b = _read(tmp_path / "cli"), run.result.rows()
    assert list(a.value) == list(b.value)  # bit for bit: the same run
    m = json.loads((tmp_path / "api" / "manifest.json").read_text())
    assert m["command"] == "train" and m["complete"] and (tmp_path / "api" / "report.html").is_file()
    # the hook is no setting: the same signature as the CLI's run
    assert m["signature"] == json.loads((tmp_path / "cli" / "manifest.json").read_text())["signature"]

