"""Helpers and fixtures shared by tests/unit/test_hostile_stats.py and tests/e2e/test_hostile_stats_e2e.py."""

from __future__ import annotations

import random

import numpy as np
import pytest


def data(n: int = 120, d: int = 30, k: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.linspace(2.0, 0.2, d) + rng.standard_normal(d)
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    return X, V


def make_texts(n: int, seed: int = 0, end: str | None = None) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "model", "token", "river", "bridge", "market",
             "prices", "cat", "dog", "fish", "reads", "sees", "today", "quickly"]
    out = []
    for i in range(n):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(5, 11)))
        out.append(body + (end if end is not None else f" {i}."))
    return out


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return str(tiny_dir("llama"))

