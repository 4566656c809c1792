"""The PC1-migration diagnostic: how much of the top principal direction of the centred states
lies in the readout subspace (METHODS.md), against the k / d share of a random direction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmgeom.metrics._common import as_matrix, blas_threads, data_error, pow2_normalise
from lmgeom.metrics.geometry import check_basis, top_directions

__all__ = ["PC1Share", "pc1_readout_share"]


@dataclass(frozen=True)
class PC1Share:
    """Result of :func:`pc1_readout_share`.

    Attributes:
        share: ``||V_k^T u_1||^2`` for u_1 the top principal direction of the centred X.
        baseline: k / d, the expected share of a random direction.
        evr: PC1's explained-variance ratio (lambda_1 / sum lambda).
        k, d, n: sizes.
    """

    share: float
    baseline: float
    evr: float
    k: int
    d: int
    n: int


def pc1_readout_share(X: Any, basis: Any, *, label: str | None = None) -> PC1Share:
    """PC1 migration diagnostic: how much of the top principal direction lies in the readout.

    Args:
        X: (N, d) states, N >= 2 (centred here; no CCR).
        basis: (d, k) orthonormal readout basis.
        label: prefix for error messages.

    Returns:
        :class:`PC1Share`.
    """
    A = pow2_normalise(as_matrix(X, name="X", label=label, min_rows=2))
    n, d = A.shape
    V = check_basis(basis, d, label=label)
    Xc = A - A.mean(axis=0)
    total = float(np.einsum("ij,ij->", Xc, Xc))
    if not total > 0:
        raise data_error("X has zero variance (all rows identical); PC1 is undefined", label)
    with blas_threads(float(n) * d * min(n, d)):
        P, lam = top_directions(Xc, 1)
    u1 = P[0]
    share = float(np.sum((V.T @ u1) ** 2))
    k = V.shape[1]
    return PC1Share(share=share, baseline=k / d, evr=float(lam[0]) / total, k=k, d=d, n=n)
