"""The width suite: shapes, schedule, tokenizer, a micro suite end to end, resume, integrity.

End-to-end half (the unit half is tests/unit/test_suite.py).
"""

from __future__ import annotations

import dataclasses
import json

import torch
from support.suite import corpus, micro_config, micro_suite  # noqa: F401 (fixtures)

from lmgeom import load_model
from lmgeom.training.suite import train_suite
from lmgeom.training.suite_config import checkpoint_steps
from lmgeom.training.suite_manifest import suite_checkpoints


def test_micro_suite_saves_loadable_checkpoints(micro_suite, micro_config):
    root, manifest = micro_suite
    steps = checkpoint_steps(micro_config.steps, micro_config.n_regular)
    assert manifest["checkpoint_steps"] == steps == [0, 1, 2, 4, 8, 12]
    assert set(manifest["widths"]) == {"16", "32"}
    for w, v in manifest["widths"].items():
        assert v["status"] == "complete" and v["steps"] == steps
        assert v["shape"]["n_layers"] == 2
        for s in steps:
            folder = root / w / f"step{s}"
            assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    lm = load_model(root / "32" / "step12", device="cpu")
    assert lm.width == 32 and lm.n_blocks == 2 and lm.model_type == "gpt_neox"
    assert lm.hf_model.config.use_parallel_residual is True
    assert lm.identity["weights_sha256"] == manifest["widths"]["32"]["checkpoints"]["step12"]["weights_sha256"]
    # one tokenizer for every width and step
    toks = {(root / w / f"step{s}" / "tokenizer.json").read_text() for w in ("16", "32") for s in steps}
    assert len(toks) == 1
    assert manifest["tokenizer"]["vocab_size"] == 320
    assert manifest["data"]["data_hash"] and manifest["identical_weights"] == []
    assert (root / "16" / "width.json").is_file() and not (root / "16" / "_state").exists()


def test_resume_after_interruption_is_bit_identical(tmp_path, micro_suite, micro_config):
    root, _ = micro_suite
    part = tmp_path / "interrupted"
    m = train_suite(part, micro_config, progress=False, stop_after_steps=3)
    assert {v["status"] for v in m["widths"].values()} == {"partial"}
    state = part / "16" / "_state"
    # the one checkpoint format of lmgeom.training.checkpoint (also used by the fine-tuning)
    assert sorted(p.name for p in state.iterdir()) == [
        "optimizer.safetensors", "state.json", "trainable.safetensors"]
    assert json.loads((state / "state.json").read_text())["which"] == "all"
    assert json.loads((state / "state.json").read_text())["step"] == 2  # last checkpoint <= 3
    m = train_suite(part, micro_config, progress=False, stop_after_steps=4)  # a second kill
    m = train_suite(part, micro_config, progress=False)
    assert {v["status"] for v in m["widths"].values()} == {"complete"}
    full = {(c["width"], c["step"]): c["weights_sha256"] for c in suite_checkpoints(root)}
    resumed = {(c["width"], c["step"]): c["weights_sha256"] for c in suite_checkpoints(part)}
    assert resumed == full
    # a complete suite is skipped: rerunning changes nothing
    before = (part / "32" / "step12" / "model.safetensors").stat().st_mtime_ns
    train_suite(part, micro_config, progress=False)
    assert (part / "32" / "step12" / "model.safetensors").stat().st_mtime_ns == before


def test_make_hooks_see_every_step_of_every_width(tmp_path, micro_config):
    """train_suite's make_hooks: one hook set per width, called after each optimiser step
    (the weights already updated), with the width's own model and folder."""
    seen = []

    class Monitor:
        def __init__(self, width, model, folder):
            self.width, self.model, self.folder = width, model, folder
            self.last = [p.detach().clone() for p in model.parameters()]

        def step(self, step):
            now = [p.detach().clone() for p in self.model.parameters()]
            moved = any(not torch.equal(a, b) for a, b in zip(self.last, now))
            self.last = now
            seen.append((self.width, step, self.folder.name, moved))

    cfg = dataclasses.replace(micro_config, widths=(16, 32), tokens=4 * 64)
    train_suite(tmp_path / "s", cfg, progress=False, make_hooks=lambda *a: [Monitor(*a)])
    assert seen == [(w, s, str(w), True) for w in (16, 32) for s in (1, 2, 3, 4)]

