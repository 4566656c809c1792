"""The width suite: shapes, schedule, tokenizer, a micro suite end to end, resume, integrity."""

from __future__ import annotations

import itertools
import json
import logging
import math
import shutil

import numpy as np
import pytest
import torch
from support.suite import corpus, micro_config, micro_suite  # noqa: F401 (fixtures)

from lmgeom import load_model
from lmgeom.errors import CacheError, ConfigError
from lmgeom.training.schedule import BatchSchedule
from lmgeom.training.suite import train_suite
from lmgeom.training.suite_config import SuiteConfig, checkpoint_steps, model_shape
from lmgeom.training.suite_manifest import write_manifest
from lmgeom.training.suite_width import ORDER_STREAM, build_model


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

