"""Property-based tests (hypothesis): invariances over random shapes, scales, rotations and
duplicated rows, and "only typed errors" on arbitrary arrays.

End-to-end half (the unit half is tests/unit/test_metrics_properties.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from support.metrics_properties import FAST, layer, pga_or_typed_error

import lmgeom.metrics as M


@FAST
@given(layer(), st.sampled_from([1e-6, 0.37, 1.0, 2.0**40]), st.integers(0, 2))
def test_pga_invariant_to_scale_and_rotation(case, scale, m):
    X, V, rng = case
    # a residual of rank 1 puts every point on a line: distances are 0 or 2 up to rounding,
    # so their order is decided by rounding noise and no invariance can hold exactly
    assume(np.linalg.matrix_rank(X - X.mean(0)) - m >= 2)
    base = pga_or_typed_error(X, V, n_null=3, ccr=m, seed=1)
    if base is None:
        return
    scaled = M.subspace_pga(X * scale, V, n_null=3, ccr=m, seed=1)
    # invariant up to rounding: a scale that is not a power of two can swap two distances that
    # tie to ~1e-16, and one swap of adjacent ranks moves rho by 12 / (P (P^2 - 1)) (P pairs);
    # allow a few such swaps, far below any real violation (which moves rho by >> 1e-3)
    n = X.shape[0]
    P = n * (n - 1) // 2
    swap = 12.0 / (P * (P**2 - 1))
    tol = 1e-9 if np.log2(scale) == round(np.log2(scale)) else max(1e-9, 8 * swap)
    assert scaled.rho_readout == pytest.approx(base.rho_readout, abs=tol)
    assert np.allclose(scaled.null, base.null, atol=tol)
    d = X.shape[1]
    R = np.linalg.qr(rng.standard_normal((d, d)))[0]
    rot = M.subspace_pga(X @ R, R.T @ V, n_null=3, ccr=m, seed=1)
    assert rot.rho_readout == pytest.approx(base.rho_readout, abs=max(1e-7, 8 * swap))
    assert -1.0 <= base.rho_readout <= 1.0 and np.all(np.abs(base.null) <= 1.0 + 1e-12)
    assert 0.0 < base.p_value <= 1.0

