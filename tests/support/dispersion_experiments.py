"""Helpers and fixtures shared by tests/unit/test_dispersion_experiments.py and tests/e2e/test_dispersion_experiments_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest

import lmgeom
from lmgeom.experiments.dispersion import (
    ChunkMeasurements,
)
from lmgeom.texts.chunks import Chunks

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Language models map contexts to next-token distributions.",
    "def add(a, b): return a + b",
    "In 1905 Einstein published four papers that changed physics.",
    "Prices rose sharply in the third quarter, analysts said on Monday.",
    "Let x be a real number such that x^2 = 4. Then x = 2 or x = -2.",
]


def make_corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(SENTENCES, size=3, replace=False)) for _ in range(n)]


@pytest.fixture(scope="module")
def llama(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpora")
    paths = []
    for i, n in enumerate((40, 30)):
        p = d / f"c{i}.txt"
        p.write_text("\n".join(make_corpus(n, i)) + "\n")
        paths.append(str(p))
    return paths


def synthetic(n=120, n_layers=3, seed=0):
    rng = np.random.default_rng(seed)
    nll = rng.normal(3, 0.5, n)
    disp = np.stack([0.5 - 0.05 * nll * k + rng.normal(0, 0.05, n) for k in range(n_layers)])
    layers = tuple(str(i) for i in range(n_layers - 1)) + ("final",)
    ch = Chunks(np.zeros((n, 4), np.int64), np.arange(n), np.arange(n) * 4, n + 7, 4 * n, 4,
                False, None)
    return ChunkMeasurements("m", "builtin:x", layers, tuple(range(n_layers - 1)) + (n_layers,),
                             n_layers - 1, np.exp(nll), nll, disp, ch)

