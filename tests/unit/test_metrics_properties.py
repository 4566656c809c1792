"""Property-based tests (hypothesis): invariances over random shapes, scales, rotations and
duplicated rows, and "only typed errors" on arbitrary arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr
from support.metrics_properties import FAST, layer, pga_or_typed_error

import lmgeom.metrics as M
from lmgeom.errors import LmgeomError


@FAST
@given(layer())
def test_pga_rho_matches_pdist_spearman(case):
    X, V, _ = case
    res = pga_or_typed_error(X, V, n_null=2, ccr=0, seed=0)
    if res is None:
        return
    Xp = M.ccr(X, 0)
    U, inv = np.unique(Xp, axis=0, return_inverse=True)
    inv = inv.ravel()
    ii, jj = np.triu_indices(X.shape[0], 1)

    def dist(Y):
        _, g = np.unique(Y, axis=0, return_inverse=True)
        g = g.ravel()[inv]
        D = np.zeros((len(inv), len(inv)))
        D[np.triu_indices(len(inv), 1)] = pdist(Y[inv], "cosine")
        out = D[ii, jj]
        out[g[ii] == g[jj]] = 0.0
        return out

    # two distances that tie to ~1e-16 may be ordered differently by two rounding paths: allow
    # a few swaps of adjacent ranks (each moves rho by 12 / (P (P^2 - 1)))
    P = len(ii)
    tol = max(1e-9, 8 * 12.0 / (P * (P**2 - 1)))
    assert res.rho_readout == pytest.approx(spearmanr(dist(U), dist(U @ V))[0], abs=tol)


@FAST
@given(layer())
def test_sampled_pairs_all_pairs_equals_exact(case):
    X, V, _ = case
    exact = pga_or_typed_error(X, V, n_null=3, seed=2)
    if exact is None:
        return
    n = X.shape[0]
    almost = M.subspace_pga(X, V, n_null=3, seed=2, pairs=n * (n - 1) // 2 - 1)
    assert almost.pairs == n * (n - 1) // 2 - 1
    assert almost.rho_readout == pytest.approx(exact.rho_readout, abs=0.2)


finite_or_not = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays(np.float64, st.tuples(st.integers(1, 7), st.integers(1, 5)), elements=finite_or_not),
    st.integers(-1, 5),
    st.sampled_from([None, 1, 5]),
)
def test_arbitrary_arrays_raise_only_typed_errors(X, k, pairs):
    rng = np.random.default_rng(0)
    d = X.shape[1]
    V = np.linalg.qr(rng.standard_normal((d, max(1, min(k, d)))))[0][:, : max(k, 0)]
    calls = [
        lambda: M.subspace_pga(X, V, n_null=2, pairs=pairs),
        lambda: M.ccr(X, max(k, 0)),
        lambda: M.spectral_summary(X),
        lambda: M.dispersion(X),
        lambda: M.pc1_readout_share(X, V),
        lambda: M.readout_basis(X, k),
        lambda: M.cross_model_alignment(X, X, V, V, n_null=2),
    ]
    for call in calls:
        try:
            out = call()
        except LmgeomError:
            continue
        if isinstance(out, float):
            assert np.isfinite(out)


@FAST
@given(layer(), st.floats(1e-3, 1e3))
def test_dispersion_properties(case, c):
    X, _, rng = case
    n = X.shape[0]
    try:
        D = M.dispersion(X)
    except LmgeomError:
        return
    assert -1e-12 <= D <= n / (n - 1) + 1e-12
    assert D == pytest.approx(float(np.mean(pdist(X, "cosine"))), abs=1e-9)
    scales = rng.uniform(0.1, 10.0, (n, 1))  # per-row positive scaling changes nothing
    assert M.dispersion(X * scales * c) == pytest.approx(D, abs=1e-9)
    R = np.linalg.qr(rng.standard_normal((X.shape[1],) * 2))[0]
    assert M.dispersion(X @ R) == pytest.approx(D, abs=1e-9)


@FAST
@given(layer())
def test_spectral_properties(case):
    X, _, rng = case
    try:
        s = M.spectral_summary(X)
    except LmgeomError:
        return
    n, d = X.shape
    assert 0.0 <= s["isoscore"] <= 1.0
    assert 1.0 - 1e-6 <= s["rankme"] <= min(n, d) + 1e-6
    assert s["condition_number"] >= 1.0
    R = np.linalg.qr(rng.standard_normal((d, d)))[0]
    r = M.spectral_summary(X @ R * 3.0 + 1.0)
    for key in ("isoscore", "rankme"):
        assert r[key] == pytest.approx(s[key], rel=1e-6, abs=1e-9)

