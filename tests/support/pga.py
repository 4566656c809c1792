"""The slow, obviously-correct Subspace PGA reference (pdist + spearmanr) and the anisotropic
test clouds, shared by the PGA tests in tests/unit and tests/e2e."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist, squareform
from scipy.stats import spearmanr

import lmgeom.metrics as M


def reference_pga(X, V, *, n_null, ccr, seed, pairs=None):
    """pdist + spearmanr, literally as METHODS.md states it.

    Preprocessing uses lmgeom's ``ccr`` (tested separately against its formula below).
    Rows identical after preprocessing are the same point: their distance is 0 in every space,
    and each distinct point is projected once (so ties are exact, as the definition implies).
    """
    Xp = M.ccr(X, ccr)
    U, inv = np.unique(Xp, axis=0, return_inverse=True)
    inv = inv.ravel()
    n = X.shape[0]
    if pairs is None:
        ii, jj = np.triu_indices(n, 1)
    else:
        ii, jj = M.sample_pairs(n, pairs, seed)

    def dist(Y):
        # Y: one row per distinct state; rows that coincide in this space are one point too
        _, inv_y = np.unique(Y, axis=0, return_inverse=True)
        g = inv_y.ravel()[inv]
        D = squareform(pdist(Y, "cosine"))[inv][:, inv]
        d = D[ii, jj]
        d[g[ii] == g[jj]] = 0.0
        return d

    d_full = dist(U)
    rho = spearmanr(d_full, dist(U @ V))[0]
    frames = M.null_frames(X.shape[1], V.shape[1], n_null, seed)
    null = np.array([spearmanr(d_full, dist(U @ Q))[0] for Q in frames])
    z = (rho - null.mean()) / null.std(ddof=1)
    return z, rho, null


def anisotropic(rng, n, d, mean_scale=3.0):
    X = rng.standard_normal((n, d)) * np.geomspace(4.0, 0.2, d)
    return X + mean_scale * rng.standard_normal(d)
