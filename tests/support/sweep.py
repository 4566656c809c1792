"""Helpers and fixtures shared by tests/unit/test_sweep.py and tests/e2e/test_sweep_e2e.py."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest


def make_texts(n: int = 24, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "model", "token", "river", "bridge", "market", "prices", "the", "a", "of", "to", "in", "cat", "dog", "fish", "reads", "sees", "predicts", "quickly", "today"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" {i}."
            for i in range(n)]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    from lmgeom.training.suite import train_suite
    from lmgeom.training.suite_config import SuiteConfig

    base = tmp_path_factory.mktemp("sweep")
    corpus = base / "train.txt"
    corpus.write_text("\n".join(make_texts(300, seed=1)) + "\n")
    root = base / "suite"
    manifest = train_suite(root, SuiteConfig.micro(texts=(str(corpus),), tokens=256), progress=False)
    texts_file = base / "texts.txt"
    texts_file.write_text("\n".join(make_texts()) + "\n")
    return root, manifest, texts_file


SWEEP_ARGS = ["--n-null", "10", "--ccr", "1,5", "--max-length", "24", "--quiet"]


@pytest.fixture(scope="module")
def swept(micro, tmp_path_factory):
    from lmgeom.cli import main

    root, _manifest, texts_file = micro
    out = tmp_path_factory.mktemp("sweep-out") / "run"
    rc = main(["sweep", "--suite", str(root), "--texts", str(texts_file), "--out", str(out),
               *SWEEP_ARGS])
    assert rc == 0
    return out, pd.read_parquet(out / "sweep.parquet"), json.loads((out / "manifest.json").read_text())

