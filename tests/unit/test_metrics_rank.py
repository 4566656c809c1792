"""The CPU ranking path (the compiled kernel, through the CPU worker) and the device path
(torch) against ``scipy.stats.spearmanr`` / ``rankdata`` and exact integer arithmetic: ties,
values closer than the key resolution, reference-only ties, weighted references (duplicate
rows), and sums past int64 (no pair limit)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr

from lmgeom.errors import ConfigError, DataError
from lmgeom.metrics._cpu_worker import CpuWorker
from lmgeom.metrics._rank_kernel import RankReference, SpearmanKernel, weighted_reference


def rho(a, b):
    w = CpuWorker(a.size, None)
    return w.spearman(w.reference(a, "x"), b, "x")


def reference(a):
    return CpuWorker(a.size, None).reference(a, "x")


def exact_rho(a, b):
    """Spearman in exact integers (twice the centred average ranks), one rounding at the end."""
    P = a.size
    ra = (2 * rankdata(a) - P - 1).astype(np.int64)
    rb = (2 * rankdata(b) - P - 1).astype(np.int64)

    def dot(x, y):  # chunks of 2**16 products stay far below 2**63
        return sum(int(s) for s in np.add.reduceat(x * y, np.arange(0, P, 1 << 16)))

    return dot(ra, rb) / math.sqrt(dot(ra, ra) * dot(rb, rb))


@pytest.mark.parametrize("n", [2, 3, 17, 1000, 300_001])  # 300k: the 4-pass radix sort
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
    assert rho(a, b) == exact_rho(a, b)


@pytest.mark.parametrize("n", [20_000, 300_000])
def test_ties_collisions_long_runs_and_reference_only_ties(n):
    """Duplicate-row ties (in both), ties in the reference only (outside the frame's tie
    groups: the tie-aware second pass), values closer than the key resolution (one run of 400
    keys: the merge-sort branch), exact ties at zero, a tie group inside a run, and a short
    unsorted run."""
    rng = np.random.default_rng(5)
    a = rng.random(n)
    a[:300] = a[300:600]
    a[5000:5040] = 0.5
    d = a + 0.05 * rng.random(n)
    d[:300] = d[300:600]
    d[7000:7400] = 0.75 + np.arange(400) * np.spacing(0.75)
    d[7400:7410] = 0.75 + 7 * np.spacing(0.75)
    d[9000:9100] = 0.0
    d[9100:9103] = 0.25 + np.array([0, 2, 1]) * np.spacing(0.25)
    got = rho(a, d)
    assert got == pytest.approx(spearmanr(a, d)[0], abs=1e-12)
    assert got == exact_rho(a, d)
    assert rho(d, a) == exact_rho(d, a)


def test_ulp_neighbours_zero_and_out_of_range_values_are_ordered_exactly():
    """ulp neighbours, signed zero and subnormals share keys and are ordered by value; values
    below 0 or of 4 and more are clamped to the end keys and still ordered exactly."""
    rng = np.random.default_rng(6)
    base = np.array([0.0, -0.0, 5e-324, 1e-300, 0.25, 1.0, 1.9999999999999998])
    near = np.concatenate([base, np.nextafter(base, 3.0), base])
    a = np.concatenate([near, rng.random(3000) * 2.0, [-1e-3, -1.2e-7, 4.0, 7.5, 1e9]])
    rng.shuffle(a)
    b = a.copy()
    rng.shuffle(b)
    b[::5] = a[::5]
    b[rng.integers(0, a.size, 60)] = -2e-7  # a run of more than 32 at the bottom key
    assert rho(a, b) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)
    assert rho(b, a) == exact_rho(b, a)


def test_reference_ranks_are_scipy_average_ranks():
    rng = np.random.default_rng(2)
    a = np.round(rng.random(3000), 3)
    ref = reference(a)
    np.testing.assert_array_equal(ref.centred_at(ref.posf) + (a.size + 1) / 2, rankdata(a))
    cf2, tied = ref.cf2, ref.tied
    np.testing.assert_array_equal(cf2[ref.posf], 2 * rankdata(a) - a.size - 1)
    assert int(np.unpackbits(tied).sum()) == ref.tie_pos.size


def test_constant_and_nan_vectors_are_data_errors():
    with pytest.raises(DataError, match="all pairwise distances are equal"):
        rho(np.ones(10), np.arange(10.0))
    with pytest.raises(DataError, match="all pairwise distances are equal"):
        rho(np.arange(10.0), np.full(10, 3.0))
    d = np.linspace(0.1, 1.0, 10)
    d[3] = np.nan
    with pytest.raises(DataError, match="not a number"):
        rho(np.arange(10.0), d)


def test_no_pair_limit_sums_past_int64_exactly():
    """P = 3e6 > 2**21 (the old int64 limit: 4 sum cf cg and c**3 - c pass 2**63 here), with a
    tie group of 2.5e6 values: the chunked two-word sums are exact (bit-equal to exact
    integer arithmetic)."""
    rng = np.random.default_rng(11)
    P = 3_000_000
    a = rng.integers(0, 50_000, P) / 50_000.0
    d = a + rng.random(P)
    d[rng.permutation(P)[:2_500_000]] = 0.5
    assert (P ** 3 > 2 ** 63) and (2_500_000 ** 3 > 2 ** 63)
    assert rho(a, d) == exact_rho(a, d)


def test_runner_refuses_more_pairs_than_int32_positions(monkeypatch):
    from lmgeom.metrics import _null_runner as nr

    monkeypatch.setattr(nr, "MAX_PAIRS", 100)
    with pytest.raises(ConfigError, match="pairs="):
        nr.Runner(101, label="layer 1")


# ------------------------------------------------------------- weighted references


def weighted_rho(gidx, a_entry, d_entry, max_fraction=0.5):
    """Spearman over the pairs (pair p reads entry gidx[p]) through the weighted kernel:
    reference a_entry[gidx], frame d_entry[gidx]; rho as the CPU worker forms it."""
    ref = reference(a_entry[gidx])
    wr = weighted_reference(ref, gidx, max_fraction=max_fraction)
    assert wr is not None
    got = SpearmanKernel(wr.U).weighted(d_entry, wr.gram, wr.w, wr.a2, wr.P, 0.0, 1.0)
    if isinstance(got, str):
        return got
    P = wr.P
    return (got[0] / 4.0) / math.sqrt(wr.S * (P * (P * P - 1.0) / 12.0 - got[1] / 12.0))


@pytest.mark.parametrize("U,P", [(3, 7), (10, 60), (300, 5000), (20_000, 120_000)])
def test_weighted_matches_scipy_on_the_expanded_pairs(U, P):
    """Duplicate rows: P pairs reading U distinct entries; the weighted Spearman over the
    entries equals the exact one over the P expanded values (average ranks, ties in both,
    ties across entries, runs of equal keys)."""
    rng = np.random.default_rng(U)
    gidx = np.concatenate([np.arange(U), rng.integers(0, U, P - U)])  # every entry read
    rng.shuffle(gidx)
    a_entry = rng.random(U)
    a_entry[rng.integers(0, U, U // 10 + 1)] = a_entry[0]  # reference ties across entries
    d_entry = a_entry + rng.random(U)
    if U > 2:
        d_entry[: U // 10 + 2] = 0.3  # frame ties across entries (exactly equal)
        close = slice(U // 2, U // 2 + min(U // 5, 300))
        d_entry[close] = 0.6 + np.arange(d_entry[close].size) * np.spacing(0.6)
    a, d = a_entry[gidx], d_entry[gidx]
    got = weighted_rho(gidx, a_entry, d_entry, max_fraction=1.0)
    assert got == pytest.approx(spearmanr(a, d)[0], abs=1e-12)
    assert got == pytest.approx(exact_rho(a, d), abs=2e-16)
    assert got == pytest.approx(rho(a, d), abs=2e-16)  # the unweighted kernel over the pairs


def test_weighted_sums_past_int64_exactly():
    """P = 3e6 pairs over 2 000 entries, one entry read by 2.4e6 pairs (w**3 > 2**63)."""
    rng = np.random.default_rng(12)
    U, P = 2000, 3_000_000
    gidx = np.concatenate([np.arange(U), rng.integers(1, U, P - U - 2_400_000),
                           np.zeros(2_400_000, dtype=np.int64)])
    a_entry = rng.random(U)
    d_entry = a_entry + rng.random(U)
    got = weighted_rho(gidx, a_entry, d_entry)
    assert got == pytest.approx(exact_rho(a_entry[gidx], d_entry[gidx]), abs=2e-16)


def test_weighted_reference_declines_when_it_does_not_pay_or_does_not_describe_the_data():
    rng = np.random.default_rng(1)
    gidx = rng.integers(0, 100, 1000)
    a = rng.random(100)[gidx]
    ref = reference(a)
    assert weighted_reference(ref, gidx) is not None
    assert weighted_reference(ref, np.arange(1000)) is None  # no duplicates: U = P
    b = a.copy()
    b[np.flatnonzero(gidx == gidx[0])[1:]] += 1.0  # not a function of the entry
    assert weighted_reference(reference(b), gidx) is None


def test_weighted_detects_a_constant_frame():
    gidx = np.array([0, 1, 1, 2, 2, 2])
    assert weighted_rho(gidx, np.arange(3.0), np.full(3, 0.25), max_fraction=1.0) == "constant"


def test_reference_is_built_from_any_exact_order():
    """RankReference only needs an exact order and the tie groups: a stable argsort gives the
    same ranks and S as the kernel's order."""
    rng = np.random.default_rng(4)
    a = np.round(rng.random(2000), 2)
    o = np.argsort(a, kind="stable")
    s = a[o]
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    count = np.diff(np.r_[start, a.size])
    ref = RankReference(o, start[count > 1], count[count > 1])
    kern = reference(a)
    assert ref.S == kern.S
    np.testing.assert_array_equal(ref.centred_at(ref.posf), kern.centred_at(kern.posf))


# ------------------------------------------------------------- device path, fallback


def test_torch_worker_ranks_match_scipy():
    import torch

    from lmgeom.metrics._device_worker import TorchWorker

    rng = np.random.default_rng(3)
    a = np.round(rng.random(2000), 2)
    b = np.round(a + rng.random(2000), 2)
    w = TorchWorker(a.size, torch.device("cpu"), None)
    ref = w.reference(torch.tensor(a), "x")
    assert w.spearman(ref, torch.tensor(b), "x") == pytest.approx(spearmanr(a, b)[0], abs=1e-12)


def test_kernel_self_check_and_fallback_logs_once(monkeypatch, caplog):
    """A broken numba: kernel_available logs one warning, and the runner ranks with torch's
    sort on the CPU (same nulls to 1e-13)."""
    import lmgeom.metrics as M
    from lmgeom.metrics import _null_runner as nr
    from lmgeom.metrics import _rank_kernel as rk

    assert rk._self_check()
    rng = np.random.default_rng(8)
    X = rng.standard_normal((80, 12)) * np.geomspace(3, 0.2, 12)
    V = M.readout_basis(rng.standard_normal((50, 12)), 3)
    fast = M.subspace_pga_levels(X, V, ccr=(0, 2), n_null=5, seed=1)
    rk.kernel_available.cache_clear()
    monkeypatch.setattr(rk, "_self_check", lambda: 1 / 0)
    try:
        with caplog.at_level(logging.WARNING, logger=rk.__name__):
            assert not nr.kernel_available()
            runner = nr.Runner(100)
            slow = M.subspace_pga_levels(X, V, ccr=(0, 2), n_null=5, seed=1)
        assert type(runner.main).__name__ == "TorchWorker"
        assert len([r for r in caplog.records if "unavailable" in r.message]) == 1
    finally:
        rk.kernel_available.cache_clear()
    for m in (0, 2):
        np.testing.assert_allclose(slow[m].null, fast[m].null, rtol=0, atol=1e-13)
        assert slow[m].z == pytest.approx(fast[m].z, abs=1e-9)
