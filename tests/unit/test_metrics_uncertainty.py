"""Bootstrap CIs and correlations with CIs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError


def test_bootstrap_mean_interval_matches_explicit_resampling():
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 1.0, 80)
    res = M.bootstrap_ci(x, np.mean, n_boot=500, seed=3)
    r = np.random.default_rng(3)
    reps = [np.mean(x[r.integers(0, 80, size=80)]) for _ in range(500)]
    lo, hi = np.percentile(reps, [2.5, 97.5])
    assert res.estimate == pytest.approx(x.mean())
    assert (res.low, res.high) == (pytest.approx(lo), pytest.approx(hi))
    assert (res.level, res.n_boot, res.seed, res.n_valid) == (0.95, 500, 3, 500)
    assert res.low < x.mean() < res.high


def test_bootstrap_coverage_of_the_mean_is_roughly_nominal():
    rng = np.random.default_rng(1)
    hits = 0
    for s in range(60):
        x = rng.normal(0.0, 1.0, 40)
        r = M.bootstrap_ci(x, np.mean, n_boot=300, seed=s, level=0.9)
        hits += r.low <= 0.0 <= r.high
    assert 42 <= hits <= 60  # nominal 54 of 60


def test_paired_tuple_and_correlation_with_ci_agree():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(60)
    y = x + rng.standard_normal(60)
    y[::7] = y[0]  # ties
    for method, fn in (("spearman", spearmanr), ("pearson", pearsonr)):
        c = M.correlation_with_ci(x, y, method=method, n_boot=400, seed=5)
        b = M.bootstrap_ci((x, y), lambda a, b_, fn=fn: fn(a, b_)[0], n_boot=400, seed=5)
        assert c.r == pytest.approx(fn(x, y)[0], abs=1e-12)
        assert c.p_value == pytest.approx(fn(x, y)[1], rel=1e-9)
        assert c.low == pytest.approx(b.low, abs=1e-12)
        assert c.high == pytest.approx(b.high, abs=1e-12)
        assert c.low < c.r < c.high and c.method == method and c.n == 60


def test_unpaired_groups():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 30), rng.normal(3, 1, 45)
    res = M.bootstrap_ci((a, b), lambda u, v: v.mean() - u.mean(), paired=False, seed=0)
    assert 2.0 < res.low < 3.0 < res.high < 4.0
    with pytest.raises(DataError, match="equal-length"):
        M.bootstrap_ci((a, b), lambda u, v: 0.0)


def test_degenerate_replicates_are_dropped_and_counted():
    x = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 2.0])
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    res = M.correlation_with_ci(x, y, n_boot=300, seed=0)
    assert res.n_valid < 300 and np.isfinite(res.low)


def test_errors():
    x = np.arange(10.0)
    with pytest.raises(ConfigError, match="method"):
        M.correlation_with_ci(x, x, method="kendall")
    with pytest.raises(ConfigError, match="level"):
        M.bootstrap_ci(x, np.mean, level=1.5)
    with pytest.raises(ConfigError, match="n_boot"):
        M.bootstrap_ci(x, np.mean, n_boot=1)
    with pytest.raises(DataError, match="constant"):
        M.correlation_with_ci(x, np.ones(10))
    with pytest.raises(DataError, match="at least 3"):
        M.correlation_with_ci(x[:2], x[:2])
    with pytest.raises(DataError, match="NaN"):
        M.correlation_with_ci(np.r_[x, np.nan], np.r_[x, 1.0])
