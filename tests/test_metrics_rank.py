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
    from lmgeom.metrics._rank import keyed_available, sort_backend

    def use(name):
        monkeypatch.setenv("LMGEOM_SORT", name)
        sort_backend.cache_clear()
        keyed_available.cache_clear()
        assert sort_backend() == name

    yield use
    monkeypatch.delenv("LMGEOM_SORT", raising=False)
    sort_backend.cache_clear()
    keyed_available.cache_clear()


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


def test_lmgeom_sort_numpy_keeps_the_null_loop_in_numpy(backend):
    """LMGEOM_SORT=numpy: no int32-key (torch) path; same nulls as the default."""
    import lmgeom.metrics as M
    from lmgeom.metrics._rank import keyed_available

    rng = np.random.default_rng(8)
    X = rng.standard_normal((80, 12)) * np.geomspace(3, 0.2, 12)
    V = M.readout_basis(rng.standard_normal((50, 12)), 3)
    default = M.subspace_pga_levels(X, V, ccr=(0, 2), n_null=5, seed=1)
    backend("numpy")
    assert not keyed_available()
    forced = M.subspace_pga_levels(X, V, ccr=(0, 2), n_null=5, seed=1)
    for m in (0, 2):
        np.testing.assert_allclose(forced[m].null, default[m].null, rtol=0, atol=1e-13)


# --- int32 keys (KeySorter / keyed_spearman): the null loop's exact-mode path ----------------


def keyed_rho(a, g):
    """Spearman of a against d = 1 - g through the int32-key path (keys laid out in a's
    reference order, as the null loop gathers them)."""
    from lmgeom.metrics._rank import KeySorter, distance_keys, keyed_spearman

    ref = RankReference(a, Sorter(a.size))
    order = ref.order.astype(np.int64)
    ks = KeySorter(a.size)
    gk = np.ascontiguousarray(g[order])
    distance_keys(gk, ks.keys, np.empty_like(gk))
    return keyed_spearman(ref, ks, lambda x: 1.0 - gk[x])


@pytest.mark.parametrize("n", [2, 3, 1000, 200_000])
def test_keyed_matches_scipy_on_continuous_data(n):
    rng = np.random.default_rng(n)
    a = rng.random(n)
    g = 1.0 - (a + rng.random(n))
    assert keyed_rho(a, g) == pytest.approx(spearmanr(a, 1.0 - g)[0], abs=1e-12)


def test_keyed_matches_scipy_with_ties_collisions_and_reference_only_ties():
    rng = np.random.default_rng(5)
    n = 20_000
    a = rng.random(n)
    a[:300] = a[300:600]  # ties in both (the duplicate-row pattern) ...
    a[5000:5040] = 0.5  # ... and ties in the reference only
    d = a + 0.05 * rng.random(n)
    d[:300] = d[300:600]
    d[7000:7400] = 0.75 + np.arange(400) * np.spacing(0.75)  # closer than 2**-29: collisions
    d[9000:9100] = 0.0  # a tie group at zero distance
    g = 1.0 - d
    dd = 1.0 - g
    got = keyed_rho(a, g)
    assert got == pytest.approx(spearmanr(a, dd)[0], abs=1e-12)
    assert got == pytest.approx(rho(a, dd), abs=1e-13)  # the 63-bit key path


def test_keyed_detects_a_constant_frame():
    from lmgeom.metrics._rank import ConstantVectorError as CVE

    with pytest.raises(CVE):
        keyed_rho(np.arange(10.0), np.full(10, 0.25))


def weighted_rho(gidx, a_entry, g_entry, max_fraction=0.5):
    """Spearman over the pairs (pair p reads entry gidx[p]) through the weighted path:
    reference a_entry[gidx], frame d = 1 - g_entry[gidx]."""
    from lmgeom.metrics._rank import (
        KeySorter,
        distance_keys,
        weighted_keyed_spearman,
        weighted_reference,
    )

    a = a_entry[gidx]
    ref = RankReference(a, Sorter(a.size))
    wr = weighted_reference(ref, gidx, max_fraction=max_fraction)
    assert wr is not None
    ks = KeySorter(wr.U)
    gk = np.ascontiguousarray(g_entry[wr.gram])
    distance_keys(gk, ks.keys, np.empty_like(gk))
    return weighted_keyed_spearman(wr, ks, lambda x: 1.0 - gk[x])


@pytest.mark.parametrize("U,P", [(3, 7), (10, 60), (300, 5000), (20_000, 120_000)])
def test_weighted_matches_scipy_on_the_expanded_pairs(U, P):
    """Duplicate rows: P pairs reading U distinct entries; the weighted Spearman over the
    entries equals scipy's over the P expanded values (average ranks, ties in both)."""
    rng = np.random.default_rng(U)
    gidx = np.concatenate([np.arange(U), rng.integers(0, U, P - U)])  # every entry read
    rng.shuffle(gidx)
    a_entry = rng.random(U)
    if U > 1:
        a_entry[rng.integers(0, U, U // 10 + 1)] = a_entry[0]  # reference ties across entries
    g_entry = 1.0 - (a_entry + rng.random(U))
    if U > 2:
        g_entry[: U // 10 + 2] = 1.0 - 0.3  # frame ties across entries (exactly equal)
        close = slice(U // 2, U // 2 + min(U // 5, 300))
        g_entry[close] = 1.0 - (0.6 + np.arange(g_entry[close].size) * np.spacing(0.6))
    d = 1.0 - g_entry[gidx]
    a = a_entry[gidx]
    assert np.ptp(d) > 0 and np.ptp(a) > 0
    want = spearmanr(a, d)[0]
    assert weighted_rho(gidx, a_entry, g_entry, max_fraction=1.0) == pytest.approx(want,
                                                                                   abs=1e-12)
    assert weighted_rho(gidx, a_entry, g_entry, max_fraction=1.0) == pytest.approx(
        rho(a, d), abs=1e-13)  # the 63-bit key path over the pairs


def test_weighted_reference_declines_when_it_does_not_pay_or_does_not_describe_the_data():
    from lmgeom.metrics._rank import weighted_reference

    rng = np.random.default_rng(1)
    gidx = rng.integers(0, 100, 1000)
    a = rng.random(100)[gidx]
    ref = RankReference(a, Sorter(a.size))
    assert weighted_reference(ref, gidx) is not None
    assert weighted_reference(ref, np.arange(1000)) is None  # no duplicates: U = P
    b = a.copy()
    b[np.flatnonzero(gidx == gidx[0])[1:]] += 1.0  # not a function of the entry
    assert weighted_reference(RankReference(b, Sorter(b.size)), gidx) is None


def test_weighted_detects_a_constant_frame():
    from lmgeom.metrics._rank import ConstantVectorError as CVE

    gidx = np.array([0, 1, 1, 2, 2, 2])
    with pytest.raises(CVE):
        weighted_rho(gidx, np.arange(3.0), np.full(3, 0.25), max_fraction=1.0)


def test_distance_keys_are_a_monotone_function_of_the_distance():
    from lmgeom.metrics._rank import KEY_SCALE, distance_keys

    rng = np.random.default_rng(3)
    g = np.concatenate([rng.uniform(-1, 1, 5000), [1.0, -1.0, 1.0 + 2e-16, 0.0]])
    g = np.concatenate([g, np.nextafter(g, 2.0)])
    keys = np.empty(g.size, dtype=np.int32)
    distance_keys(g, keys, np.empty_like(g))
    d = 1.0 - g
    np.testing.assert_array_equal(keys, np.trunc(d * KEY_SCALE).astype(np.int32))
    o = np.argsort(d, kind="stable")
    assert np.all(np.diff(keys[o]) >= 0)  # never smaller for a larger distance
    assert keys.max() <= 2 * KEY_SCALE < 2 ** 31


# ---------------------------------------------------------------------- compiled kernel
def kernel_rho(a, d, gidx=None, src=None, c0=0.0, c1=1.0):
    """Spearman of the frame d against the reference a through the compiled kernel: pair t's
    value is c0 + c1 * src[gidx[t]] (default: d itself)."""
    from lmgeom.metrics._rank_kernel import SpearmanKernel

    ref = RankReference(a, Sorter(a.size))
    if src is None:
        src, gidx = d, np.arange(d.size)
    fo = gidx[ref.order.astype(np.int64)]
    return SpearmanKernel(a.size).spearman(ref.S, src, gidx, ref.positions32(), fo, c0, c1,
                                           *ref.centred2())


@pytest.mark.parametrize("n", [2, 3, 1000, 200_000, 300_000])  # 300k: the 4-pass radix
def test_kernel_matches_scipy_on_continuous_data(n):
    rng = np.random.default_rng(n)
    a = rng.random(n)
    d = a + rng.random(n)
    assert kernel_rho(a, d) == pytest.approx(spearmanr(a, d)[0], abs=1e-12)


@pytest.mark.parametrize("n", [20_000, 300_000])
def test_kernel_matches_scipy_with_ties_collisions_long_runs_and_reference_only_ties(n):
    """Duplicate-row ties (in both), ties in the reference only (outside the frame's runs:
    the tie-aware second pass), values closer than the key resolution (one run of 400 keys:
    the sorted branch), exact ties at zero and a tie group inside a run."""
    rng = np.random.default_rng(5)
    a = rng.random(n)
    a[:300] = a[300:600]
    a[5000:5040] = 0.5
    d = a + 0.05 * rng.random(n)
    d[:300] = d[300:600]
    d[7000:7400] = 0.75 + np.arange(400) * np.spacing(0.75)
    d[7400:7410] = 0.75 + 7 * np.spacing(0.75)  # exact ties inside the run
    d[9000:9100] = 0.0
    d[9100:9103] = 0.25 + np.array([0, 2, 1]) * np.spacing(0.25)  # a short unsorted run
    got = kernel_rho(a, d)
    assert got == pytest.approx(spearmanr(a, d)[0], abs=1e-12)
    assert got == pytest.approx(rho(a, d), abs=1e-13)  # the 63-bit key path


def test_kernel_reads_scaled_gram_entries_like_the_torch_path():
    """The null loop's source: pair t reads G' = -2**29 cos at gidx[t] of a Gram matrix, its
    value is 1 + G'/2**29 = fl(1 - cos); same rho as the int32 keys through torch."""
    from lmgeom.metrics._rank import KEY_SCALE

    rng = np.random.default_rng(9)
    n = 60
    Y = rng.standard_normal((n, 5))
    Y[50:] = Y[:10]  # duplicate rows: exact ties
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    G = (Y * -KEY_SCALE) @ Y.T
    i, j = np.tril_indices(n, -1)
    gidx = i * n + j
    d = 1.0 + G.ravel()[gidx] / KEY_SCALE
    a = d + 0.1 * rng.random(d.size)
    got = kernel_rho(a, d, gidx, G.ravel(), 1.0, 1.0 / KEY_SCALE)
    assert got == pytest.approx(spearmanr(a, d)[0], abs=1e-12)
    assert got == pytest.approx(keyed_rho(a, 1.0 - d), abs=1e-13)


def test_kernel_clamps_out_of_range_values_declines_nan_and_flags_a_constant_frame():
    """Distances below 0 (float32 rows: cos = 1 + 1 ulp) or of 4 and more share the end keys
    and are ordered by their exact values (same rho as scipy); NaN declines (None)."""
    from lmgeom.metrics._rank_kernel import MAX_PAIRS, SpearmanKernel

    a = np.arange(10.0)
    assert kernel_rho(a, np.full(10, 0.25)) == "constant"
    rng = np.random.default_rng(2)
    for bad in ([-1e-3, -1.19e-7, -2e-7], [4.0, 7.5, 1e9]):
        d = np.linspace(0.1, 1.0, 10)
        d[[3, 6, 8]] = bad
        assert kernel_rho(a, d) == pytest.approx(spearmanr(a, d)[0], abs=1e-15)
        big = rng.random(2000)
        big[rng.integers(0, 2000, 60)] = rng.choice(bad, 60)  # a run of more than 32
        ab = rng.random(2000)
        assert kernel_rho(ab, big) == pytest.approx(spearmanr(ab, big)[0], abs=1e-13)
    d = np.linspace(0.1, 1.0, 10)
    d[3] = np.nan
    assert kernel_rho(a, d) is None  # the caller takes the general path
    with pytest.raises(ValueError, match="pairs"):
        SpearmanKernel(MAX_PAIRS + 1)


def test_kernel_self_check_and_switch(monkeypatch):
    from lmgeom.metrics import _rank_kernel as rk

    assert rk._self_check()
    rk.kernel_available.cache_clear()
    monkeypatch.setenv("LMGEOM_RANK_KERNEL", "torch")
    assert not rk.kernel_available()
    rk.kernel_available.cache_clear()
    monkeypatch.delenv("LMGEOM_RANK_KERNEL")
    monkeypatch.setattr(rk, "_self_check", lambda: 1 / 0)  # a broken numba: torch path
    assert not rk.kernel_available()
    rk.kernel_available.cache_clear()
