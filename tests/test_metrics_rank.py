"""The packed-key Spearman machinery against scipy.stats.spearmanr, including exact ties and
values closer than the fixed-point key resolution (collision runs)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr

from lmgeom.metrics._rank import ConstantVectorError, RankReference, Sorter, spearman_to_reference


def rho(a, b):
    s = Sorter(a.size)
    return spearman_to_reference(RankReference(a, s), b, s)


@pytest.mark.parametrize("n", [2, 3, 17, 1000, 300_001])
def test_matches_scipy_on_continuous_data(n):
    rng = np.random.default_rng(n)
    a = rng.random(n)
    b = a + rng.random(n)
    assert rho(a, b) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)


def test_matches_scipy_with_many_ties_on_both_sides():
    rng = np.random.default_rng(0)
    a = np.round(rng.random(5000), 2)
    b = np.round(a + rng.random(5000), 1)
    assert rho(a, b) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)


def test_values_closer_than_the_key_resolution_are_ordered_exactly():
    rng = np.random.default_rng(1)
    base = 0.75
    tiny = base + np.arange(400) * np.spacing(base)  # ulp-adjacent: all share high key bits
    a = np.concatenate([tiny, [0.0, 2.0], rng.random(200)])
    rng.shuffle(a)
    b = a + 1e-3 * rng.standard_normal(a.size)
    b[::3] = np.nextafter(b[::3], 3.0)
    assert rho(a, b) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)
    assert rho(b, a) == pytest.approx(spearmanr(b, a)[0], abs=1e-12)


def test_reference_ranks_are_scipy_average_ranks():
    rng = np.random.default_rng(2)
    a = np.round(rng.random(3000), 3)
    ref = RankReference(a, Sorter(a.size))
    got = ref.centred_at(ref.posf.astype(np.int64)) + (a.size + 1) / 2
    np.testing.assert_array_equal(got, rankdata(a))


def test_constant_vector_is_detected():
    with pytest.raises(ConstantVectorError):
        rho(np.ones(10), np.arange(10.0))
    with pytest.raises(ConstantVectorError):
        rho(np.arange(10.0), np.full(10, 3.0))


def test_torch_worker_ranks_match_scipy():
    pytest.importorskip("torch")
    import torch

    from lmgeom.metrics._null_runner import TorchWorker

    rng = np.random.default_rng(3)
    a = np.round(rng.random(2000), 2)
    b = np.round(a + rng.random(2000), 2)
    w = TorchWorker(a.size, torch.device("cpu"), None)
    ref = w.reference(torch.tensor(a), "x")
    assert w.spearman(ref, torch.tensor(b), "x") == pytest.approx(spearmanr(a, b)[0], abs=1e-12)


@pytest.fixture
def backend(monkeypatch):
    """Force one sort backend for a test (LMGEOM_SORT), restoring the measured choice after."""
    from lmgeom.metrics._rank import sort_backend

    def use(name):
        monkeypatch.setenv("LMGEOM_SORT", name)
        sort_backend.cache_clear()
        assert sort_backend() == name

    yield use
    monkeypatch.delenv("LMGEOM_SORT", raising=False)
    sort_backend.cache_clear()


@pytest.mark.parametrize("kind", ["continuous", "ties", "negative", "ulp-close"])
def test_sort_backends_give_identical_correlations(backend, kind):
    """numpy's and torch's sort of the packed keys: the same order, so bit-identical results
    on both key paths (float bits for non-negative values, fixed point otherwise)."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    a = rng.random(20_000)
    b = a + rng.random(a.size)
    if kind == "ties":
        a, b = np.round(a, 2), np.round(b, 1)
    elif kind == "negative":
        a, b = a - 0.5, b - 1.0
    elif kind == "ulp-close":
        a[:500] = 0.75 + np.arange(500) * np.spacing(0.75)
    got = {}
    for name in ("numpy", "torch"):
        backend(name)
        got[name] = rho(a, b)
    assert got["numpy"] == got["torch"]
    assert got["numpy"] == pytest.approx(spearmanr(a, b)[0], abs=1e-12)


def test_sort_backend_is_measured_when_not_forced(backend, monkeypatch):
    from lmgeom.metrics._rank import sort_backend

    monkeypatch.delenv("LMGEOM_SORT", raising=False)
    sort_backend.cache_clear()
    assert sort_backend() in ("numpy", "torch")
