"""Helpers and fixtures shared by tests/unit/test_suite.py and tests/e2e/test_suite_e2e.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lmgeom.training.suite import train_suite
from lmgeom.training.suite_config import SuiteConfig


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

