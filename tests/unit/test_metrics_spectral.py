"""Spectral metrics: known answers on constructed spectra."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError


def with_spectrum(rng, n, d, s):
    """A centred (n, d) matrix whose singular values are exactly ``s`` (len(s) <= min(n-1, d))."""
    r = len(s)
    G = rng.standard_normal((n, r))
    G -= G.mean(0)
    U = np.linalg.qr(G)[0]  # orthonormal columns, orthogonal to the all-ones vector
    W = np.linalg.qr(rng.standard_normal((d, r)))[0]
    return (U * np.asarray(s)) @ W.T


def test_singular_values_are_those_of_the_centred_matrix():
    rng = np.random.default_rng(0)
    s = np.array([5.0, 3.0, 2.0, 0.5])
    X = with_spectrum(rng, 30, 8, s) + 7.0  # an offset that centring removes
    np.testing.assert_allclose(M.singular_values(X)[:4], s, rtol=1e-10)
    assert np.all(M.singular_values(X)[4:] < 1e-10)


def test_rankme_known_answers():
    rng = np.random.default_rng(1)
    X = with_spectrum(rng, 50, 20, np.ones(7))  # rank 7, equal singular values
    assert M.rankme(X, eps=0.0) == pytest.approx(7.0, rel=1e-6)
    assert M.rankme(X) == pytest.approx(7.0, rel=1e-4)
    one = with_spectrum(rng, 50, 20, [3.0])
    assert M.rankme(one, eps=0.0) == pytest.approx(1.0, rel=1e-6)
    s = np.array([4.0, 2.0, 1.0, 1.0])
    p = s / s.sum()
    assert M.rankme(with_spectrum(rng, 40, 10, s), eps=0.0) == pytest.approx(
        math.exp(-np.sum(p * np.log(p))), rel=1e-6
    )


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_alpha_req_recovers_power_law_exponent(alpha):
    rng = np.random.default_rng(2)
    i = np.arange(1, 61)
    X = with_spectrum(rng, 200, 80, i ** (-alpha / 2))  # λ_i ∝ σ_i² ∝ i^-α
    assert M.alpha_req(X) == pytest.approx(alpha, abs=1e-6)
    assert M.alpha_req(X, rank_range=(1, 60)) == pytest.approx(alpha, abs=1e-6)
    summary = M.spectral_summary(X)
    assert (summary["alpha_rank_lo"], summary["alpha_rank_hi"]) == (10, 30)
    assert summary["numerical_rank"] == 60


def test_alpha_req_range_errors():
    rng = np.random.default_rng(3)
    X = with_spectrum(rng, 100, 40, np.arange(1, 21.0) ** -1)
    with pytest.raises(ConfigError, match="numerical rank 20"):
        M.alpha_req(X, rank_range=(1, 25))
    with pytest.raises(ConfigError, match="lo < hi"):
        M.alpha_req(X, rank_range=(5, 5))
    with pytest.raises(ConfigError, match="pair"):
        M.alpha_req(X, rank_range="all")


def test_isoscore_known_answers():
    rng = np.random.default_rng(4)
    iso = rng.standard_normal((20_000, 10))
    assert M.isoscore(iso) == pytest.approx(1.0, abs=0.01)
    line = np.outer(rng.standard_normal(500), rng.standard_normal(10))
    assert M.isoscore(line) == pytest.approx(0.0, abs=1e-9)
    # k equal variances out of d: phi = k/d exactly, so IsoScore = (k - 1) / (d - 1)
    d, k = 12, 4
    X = with_spectrum(rng, 100, d, np.ones(k))
    assert M.isoscore(X) == pytest.approx((k - 1) / (d - 1), abs=1e-9)
    # invariant to rotation, scale and translation
    R = np.linalg.qr(rng.standard_normal((d, d)))[0]
    Y = with_spectrum(rng, 100, d, np.geomspace(3, 0.1, d))
    assert M.isoscore(Y @ R * 9.0 + 4.0) == pytest.approx(M.isoscore(Y), abs=1e-9)


def test_mean_cosine_on_raw_rows():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((25, 9))
    sym = np.vstack([x, -x])  # pairs cancel: sum of unit rows is 0
    n = sym.shape[0]
    assert M.mean_cosine(sym) == pytest.approx(-1.0 / (n - 1), abs=1e-12)
    same = np.tile(rng.standard_normal(9), (6, 1)) * rng.uniform(1, 3, (6, 1))
    assert M.mean_cosine(same) == pytest.approx(1.0, abs=1e-12)
    U = x / np.linalg.norm(x, axis=1, keepdims=True)
    C = U @ U.T
    explicit = (C.sum() - np.trace(C)) / (25 * 24)
    assert M.mean_cosine(x) == pytest.approx(explicit, abs=1e-12)
    # raw, not centred: a common offset makes the rows similar
    assert M.mean_cosine(x + 20.0) > 0.9


def test_condition_number():
    rng = np.random.default_rng(6)
    X = with_spectrum(rng, 60, 30, [8.0, 4.0, 2.0])  # rank 3 in 30 dims
    assert M.condition_number(X) == pytest.approx(4.0, rel=1e-9)
    big = rng.standard_normal((200_00, 8))
    assert M.condition_number(big) == pytest.approx(1.0, abs=0.05)
    assert M.condition_number(X, rtol=0.3) == pytest.approx(2.0, rel=1e-9)


def test_spectral_summary_consistent_with_individual_functions():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((120, 30)) * np.geomspace(3, 0.3, 30) + 1.0
    s = M.spectral_summary(X)
    assert s["rankme"] == pytest.approx(M.rankme(X))
    assert s["alpha_req"] == pytest.approx(M.alpha_req(X))
    assert s["isoscore"] == pytest.approx(M.isoscore(X))
    assert s["mean_cosine"] == pytest.approx(M.mean_cosine(X))
    assert s["condition_number"] == pytest.approx(M.condition_number(X))


def test_spectral_errors():
    with pytest.raises(DataError, match="zero variance"):
        M.rankme(np.ones((5, 3)))
    with pytest.raises(DataError, match="zero variance"):
        M.isoscore(np.ones((5, 3)))
    with pytest.raises(DataError, match="at least 2"):
        M.condition_number(np.ones((1, 3)))
    X = np.random.default_rng(0).standard_normal((10, 4))
    X[2, 1] = np.inf
    with pytest.raises(DataError, match="^L3: X contains 0 NaN and 1 Inf"):
        M.spectral_summary(X, label="L3")
    with pytest.raises(DataError, match="zero norm"):
        M.mean_cosine(np.vstack([np.zeros(4), np.ones(4)]))
    with pytest.raises(ConfigError, match="eps"):
        M.rankme(np.eye(4), eps=-1.0)
