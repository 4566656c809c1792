"""The batched null loop: ``subspace_pga_levels`` against per-level ``subspace_pga`` and the
explicit scipy loop, the torch path against the CPU kernel, the float32 tolerance, and the
CPU worker's two layouts (one Gram matrix, weighted or not; blocked distance vectors).

End-to-end half (the unit half is tests/unit/test_metrics_pga_batched.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.metrics_pga_batched import layer  # noqa: F401 (fixtures)

import lmgeom.metrics as M


def test_float32_levels_within_documented_tolerance(layer):
    X, V = layer
    f64 = M.subspace_pga_levels(X, V, n_null=20, seed=0, precision="float64")
    for pairs in (None, 3000):
        f32 = M.subspace_pga_levels(X, V, n_null=20, seed=0, pairs=pairs, precision="float32")
        ref = f64 if pairs is None else M.subspace_pga_levels(
            X, V, n_null=20, seed=0, pairs=pairs, precision="float64")
        for m in f64:
            assert f32[m].precision == "float32"
            np.testing.assert_allclose(f32[m].null, ref[m].null, atol=1e-4)
            assert f32[m].z == pytest.approx(ref[m].z, abs=1e-2)
    auto = M.subspace_pga_levels(X, V, n_null=4, pairs=3000)
    assert all(r.precision == "float32" for r in auto.values())  # sampled + auto: float32

