"""Helpers and fixtures shared by tests/unit/test_metrics_pga_batched.py and tests/e2e/test_metrics_pga_batched_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest
from support.pga import anisotropic

import lmgeom.metrics as M


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(17)
    n, d, k = 150, 32, 6
    X = anisotropic(rng, n, d)
    X[:, :2] += rng.standard_normal((n, 2)) * np.array([30.0, 12.0])  # dominant PCs
    X[9] = X[4]  # duplicate texts: exact ties in every space
    X[77] = X[4]
    W = rng.standard_normal((300, d)) * np.geomspace(0.3, 3.0, d)
    return X, M.readout_basis(W, k)

