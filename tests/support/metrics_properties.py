"""Helpers and fixtures shared by tests/unit/test_metrics_properties.py and tests/e2e/test_metrics_properties_e2e.py."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import lmgeom.metrics as M
from lmgeom.errors import LmgeomError

# derandomized: CI runs the same examples every time (a failure is reproducible, not luck)
FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def layer(draw):
    """A random layer: shapes, anisotropy, an offset, duplicated rows, a readout basis."""
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(6, 40))
    d = draw(st.integers(3, 12))
    k = draw(st.integers(2, d - 1))  # k = 1: every cosine is exactly +-1 (all distances tie)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.geomspace(1, draw(st.floats(0.05, 1.0)), d)
    X += draw(st.floats(-5, 5)) * rng.standard_normal(d)
    n_dup = draw(st.integers(0, n // 3))
    src = rng.integers(0, n, n_dup)
    dst = rng.integers(0, n, n_dup)
    X[dst] = X[src]
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    return X, V, rng


def pga_or_typed_error(X, V, **kw):
    try:
        return M.subspace_pga(X, V, **kw)
    except LmgeomError:
        return None

