"""Linear probes: separable vs random labels, baselines, determinism, errors."""

from __future__ import annotations

import numpy as np
import pytest

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def clusters():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((3, 20)) * 4.0
    y = np.repeat(np.array(["a", "b", "c"]), [60, 50, 40])
    X = centres[np.searchsorted(["a", "b", "c"], y)] + rng.standard_normal((150, 20))
    return X, y


def test_separable_labels_are_decoded(clusters):
    X, y = clusters
    r = M.probe_accuracy(X, y, folds=5, seed=0)
    assert r.mean > 0.97 and len(r.fold_accuracies) == 5
    assert r.majority_baseline == pytest.approx(60 / 150)
    assert (r.n, r.d, r.n_classes, r.folds) == (150, 20, 3, 5) and r.converged


def test_random_labels_stay_near_the_baseline(clusters):
    X, _ = clusters
    rng = np.random.default_rng(1)
    y = rng.permutation(np.repeat([0, 1], [90, 60]))
    r = M.probe_accuracy(X, y, folds=5, seed=0, C=0.1)
    assert r.majority_baseline == pytest.approx(0.6)
    assert r.mean < r.majority_baseline + 0.1


def test_deterministic_and_scale_invariant(clusters):
    X, y = clusters
    a = M.probe_accuracy(X, y, seed=3)
    b = M.probe_accuracy(X, y, seed=3)
    assert a == b
    c = M.probe_accuracy(X * 1000.0 + 5.0, y, seed=3)  # standardised features
    assert c.fold_accuracies == pytest.approx(a.fold_accuracies)
    assert a.std == pytest.approx(np.std(a.fold_accuracies, ddof=1))


def test_errors(clusters):
    X, y = clusters
    with pytest.raises(DataError, match="single class"):
        M.probe_accuracy(X, np.zeros(150))
    y2 = y.astype(object)
    y2[:3] = "rare"
    with pytest.raises(DataError, match=r"fewer members than folds=5.*'rare': 3"):
        M.probe_accuracy(X, y2)
    with pytest.raises(DataError, match="one label per row"):
        M.probe_accuracy(X, y[:-1])
    with pytest.raises(ConfigError, match="folds"):
        M.probe_accuracy(X, y, folds=1)
    with pytest.raises(ConfigError, match="C must"):
        M.probe_accuracy(X, y, C=0)
