"""The width suite: shapes, schedule, tokenizer, a micro suite end to end, resume, integrity."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lmgeom import load_model
from lmgeom.errors import CacheError, ConfigError
from lmgeom.training.schedule import BatchSchedule
from lmgeom.training.suite import train_suite
from lmgeom.training.suite_config import SuiteConfig, checkpoint_steps, model_shape
from lmgeom.training.suite_manifest import suite_checkpoints, write_manifest
from lmgeom.training.suite_width import ORDER_STREAM, build_model


def write_corpus(path: Path, n: int = 300, seed: int = 0) -> Path:
    """A small deterministic corpus with learnable structure (subject verb object adverb)."""
    rng = random.Random(seed)
    subj = ["The cat", "A dog", "The model", "My friend", "The river", "A scientist", "The parser"]
    verb = ["eats", "sees", "predicts", "likes", "crosses", "measures", "reads"]
    obj = ["the fish", "a ball", "the next token", "green apples", "the bridge", "the file"]
    adv = ["quickly", "today", "in the morning", "again", "carefully", "on Monday"]
    lines = [" ".join(f"{rng.choice(subj)} {rng.choice(verb)} {rng.choice(obj)} {rng.choice(adv)}."
                      for _ in range(3)) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "train.txt")


@pytest.fixture(scope="module")
def micro_config(corpus) -> SuiteConfig:
    return SuiteConfig.micro(texts=(str(corpus),))


@pytest.fixture(scope="module")
def micro_suite(tmp_path_factory, micro_config) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("suite") / "micro"
    manifest = train_suite(root, micro_config, progress=False)
    return root, manifest


# --------------------------------------------------------------------------- pure rules


def test_checkpoint_steps_are_pythia_like():
    assert checkpoint_steps(12, 3) == [0, 1, 2, 4, 8, 12]
    assert checkpoint_steps(384, 4) == [0, 1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 288, 384]
    assert checkpoint_steps(1, 0) == [0, 1]
    s = checkpoint_steps(1000, 8)
    assert s[0] == 0 and s[-1] == 1000 and s == sorted(set(s))
    assert {2 ** i for i in range(10)} <= set(s)


def test_model_shape_rule():
    c = SuiteConfig()
    assert model_shape(512, c) == {"width": 512, "n_layers": 6, "n_heads": 8, "head_dim": 64,
                                   "intermediate_size": 2048, "rotary_dims": 16}
    assert model_shape(64, c)["n_heads"] == 2 and model_shape(64, c)["head_dim"] == 32
    assert {model_shape(w, c)["n_layers"] for w in (64, 128, 256, 512)} == {6}
    with pytest.raises(ConfigError, match="heads"):
        model_shape(200, c)  # 200 // 64 = 3 heads do not divide 200
    with pytest.raises(ConfigError, match="rotary"):
        model_shape(72, c)  # 2 heads of 36 -> 9 rotary dims (must be even)
    with pytest.raises(ConfigError):
        SuiteConfig(widths=(64, 64))
    with pytest.raises(ConfigError, match="less than one step"):
        SuiteConfig(tokens=100)


def test_lr_schedule_warmup_and_cosine():
    c = SuiteConfig(tokens=100 * 2048, warmup_frac=0.05, lr=1e-3, min_lr_ratio=0.1)
    assert c.steps == 100 and c.warmup_steps == 5
    assert c.lr_at(1) == pytest.approx(2e-4)  # the first update is not a no-op
    assert c.lr_at(5) == pytest.approx(1e-3)
    assert c.lr_at(6) == pytest.approx(1e-3)
    assert c.lr_at(100) == pytest.approx(1e-4)
    lrs = [c.lr_at(u) for u in range(6, 101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_tokenizer_deterministic_byte_level(corpus):
    from lmgeom.training.tokenizer import EOS, tokenizer_sha256, train_tokenizer

    texts = corpus.read_text().splitlines()
    a = train_tokenizer(texts, 300)
    b = train_tokenizer(texts, 300)
    assert tokenizer_sha256(a) == tokenizer_sha256(b)
    assert len(a) == 300
    s = "Zebra ünïcode 🙂 def f(x):\n\treturn x"
    ids = a(s)["input_ids"]
    assert a.decode(ids) == s  # every byte encodes: lossless round trip
    assert a.eos_token == EOS and ids[0] != a.eos_token_id  # no BOS prepended
    with pytest.raises(ConfigError):
        train_tokenizer(texts, 100)


# --------------------------------------------------------------------------- micro suite


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


def test_micro_suite_validation_loss_decreases(micro_suite):
    _, manifest = micro_suite
    for w, v in manifest["widths"].items():
        cks = sorted(v["checkpoints"].values(), key=lambda c: c["step"])
        losses = [c["val_loss"] for c in cks]
        assert all(math.isfinite(x) for x in losses)
        assert losses[0] == pytest.approx(math.log(320), abs=0.6)  # ~uniform at init
        assert all(b < a for a, b in itertools.pairwise(losses)), (w, losses)
        assert [c["tokens"] for c in cks] == [s * 64 for s in v["steps"]]


def test_identical_data_order_and_init_across_widths(micro_suite):
    """Same seed: the two widths see the same batches; init differs only by shape."""
    a, b = (BatchSchedule([100], 4, 0, streams=(ORDER_STREAM,)) for _ in range(2))
    assert [a.batch(s).tolist() for s in range(60)] == [b.batch(s).tolist() for s in range(60)]
    seen = [i for s in range(25) for i in a.batch(s).tolist()]
    assert sorted(seen) == list(range(100))  # one epoch = every chunk once
    root, _ = micro_suite
    # the data order the suite used: the documented default_rng([seed, 2, epoch]) permutations
    perm = np.random.default_rng([0, 2, 0]).permutation(100)
    assert a.batch(1).tolist() == perm[4:8].tolist()
    # the same initial weights for a width trained twice (init under the seed, RNG untouched)
    tok = load_model(root / "16" / "step0", device="cpu").tokenizer
    before = torch.get_rng_state()
    m1, m2 = (build_model(16, SuiteConfig.micro(), tok) for _ in range(2))
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))


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


def test_identical_checkpoint_weights_warn(tmp_path, micro_suite, caplog):
    root, _ = micro_suite
    dup = tmp_path / "dup"
    shutil.copytree(root, dup, ignore=shutil.ignore_patterns(".lock"))
    shutil.copy(dup / "16" / "step1" / "model.safetensors", dup / "16" / "step2" / "model.safetensors")
    meta_p = dup / "16" / "step2" / "lmgeom_checkpoint.json"
    meta = json.loads(meta_p.read_text())
    meta["weights_sha256"] = json.loads((dup / "16" / "step1" / "lmgeom_checkpoint.json").read_text())["weights_sha256"]
    meta_p.write_text(json.dumps(meta))
    (dup / "manifest.json").unlink()  # a copy is not lmgeom's output: it would not be replaced
    with caplog.at_level(logging.WARNING, logger="lmgeom.training.suite"):
        m = write_manifest(dup)
    assert m["identical_weights"] == [["w16@step1", "w16@step2"]]
    assert any("identical weights" in r.message and "w16@step1" in r.message for r in caplog.records)


def test_other_settings_in_same_folder_refused(micro_suite, micro_config):
    root, _ = micro_suite
    with pytest.raises(CacheError, match="other settings"):
        train_suite(root, SuiteConfig.micro(texts=micro_config.texts, lr=1e-2), progress=False)


def test_cli_train_and_info(tmp_path, corpus, capsys):
    from lmgeom.cli import main

    out = tmp_path / "cli"
    rc = main(["suite", "train", "--micro", "--texts", str(corpus), "--widths", "16",
               "--tokens", "256", "--out", str(out), "--quiet"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert list(m["widths"]) == ["16"] and m["checkpoint_steps"] == [0, 1, 2, 3, 4]
    capsys.readouterr()
    assert main(["suite", "info", str(out), "--steps"]) == 0
    text = capsys.readouterr().out
    assert "step4" in text and "complete" in text
    assert main(["suite", "info", str(tmp_path / "nope")]) == 2
