"""Spectral metrics of a layer's states (METHODS.md "Companion diagnostics").

All but :func:`mean_cosine` work on the **centred** X: singular values σ_i of ``X - mean``
(float64 SVD, descending) and covariance eigenvalues ``λ_i = σ_i² / (N - 1)``.
:func:`mean_cosine` uses the **raw** X, because anisotropy in the LM literature is the mean
cosine of the states as they are (centring would remove the common direction it measures).

"Numerically non-zero" singular values are those above ``rtol * σ_max`` with the default
``rtol = max(N, d) * eps(float64)`` (the ``numpy.linalg.matrix_rank`` convention).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.linalg

from lmgeom.metrics._common import (
    as_matrix,
    blas_threads,
    config_error,
    data_error,
    pow2_normalise,
)
from lmgeom.metrics.dispersion import mean_cosine_numpy

__all__ = [
    "alpha_req",
    "condition_number",
    "isoscore",
    "mean_cosine",
    "rankme",
    "singular_values",
    "spectral_summary",
]


def _centred(X: Any, label: str | None) -> np.ndarray:
    A = pow2_normalise(as_matrix(X, name="X", label=label, min_rows=2))
    return A - A.mean(axis=0)


def _svdvals(Xc: np.ndarray) -> np.ndarray:
    n, d = Xc.shape
    with blas_threads(4.0 * n * d * min(n, d)):
        try:
            s = scipy.linalg.svd(Xc, compute_uv=False, lapack_driver="gesdd", check_finite=False)
        except np.linalg.LinAlgError:  # pragma: no cover - gesdd rarely fails to converge
            s = scipy.linalg.svd(Xc, compute_uv=False, lapack_driver="gesvd",
                                 check_finite=False)
    return np.asarray(s, dtype=np.float64)


def singular_values(X: Any, *, label: str | None = None) -> np.ndarray:
    """Singular values of the centred X, descending, shape (min(N, d),)."""
    A = as_matrix(X, name="X", label=label, min_rows=2)
    top = float(np.max(np.abs(A)))
    B = pow2_normalise(A)
    factor = top / float(np.max(np.abs(B))) if top > 0 else 1.0
    return _svdvals(B - B.mean(axis=0)) * factor


def _default_rtol(shape: tuple[int, int]) -> float:
    return max(shape) * float(np.finfo(np.float64).eps)


def _nonzero(s: np.ndarray, rtol: float, label: str | None) -> np.ndarray:
    if s.size == 0 or not s[0] > 0:
        raise data_error("X has zero variance (all rows identical); the spectrum is empty", label)
    return s[s > rtol * s[0]]


def _rankme(s: np.ndarray, eps: float, label: str | None) -> float:
    total = float(s.sum())
    if not total > 0:
        raise data_error("X has zero variance (all rows identical); RankMe is undefined", label)
    p = s / total + eps
    return float(math.exp(-float(np.sum(p * np.log(p)))))


def rankme(X: Any, eps: float = 1e-7, *, label: str | None = None) -> float:
    """RankMe (Garrido et al. 2023): ``exp(-Σ p_i log p_i)``, ``p_i = σ_i / Σσ + eps``.

    Between 1 (one direction) and min(N, d); a rank-r matrix with equal non-zero singular
    values gives ≈ r (exactly r when ``eps = 0``).

    Args:
        X: (N, d) states (centred here).
        eps: the paper's smoothing constant.
    """
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise config_error(f"eps must be a number >= 0; got {eps!r}", label)
    return _rankme(_svdvals(_centred(X, label)), float(eps), label)


def _alpha_range(r: int, rank_range: Any, label: str | None) -> tuple[int, int]:
    if rank_range is None:
        hi = max(r // 2, min(r, 3))
        lo = 10 if hi - 10 + 1 >= 5 else 1
        if hi - lo + 1 < 2:
            raise data_error(
                f"X has numerical rank {r}; alpha_req needs at least 2 non-zero eigenvalues", label
            )
        return lo, hi
    try:
        lo, hi = (int(v) for v in rank_range)
    except (TypeError, ValueError):
        raise config_error(
            f"rank_range must be a pair (lo, hi) of 1-based ranks; got {rank_range!r}", label
        ) from None
    if not (1 <= lo < hi):
        raise config_error(f"rank_range must satisfy 1 <= lo < hi; got ({lo}, {hi})", label)
    if hi > r:
        raise config_error(
            f"rank_range upper end {hi} exceeds the numerical rank {r} of the centred X "
            f"(eigenvalues beyond it are zero); use hi <= {r}",
            label,
        )
    return lo, hi


def _alpha(s: np.ndarray, rank_range: Any, rtol: float, label: str | None) -> tuple[float, int, int]:
    nz = _nonzero(s, rtol, label)
    lo, hi = _alpha_range(int(nz.size), rank_range, label)
    lam = nz[lo - 1:hi] ** 2
    i = np.arange(lo, hi + 1, dtype=np.float64)
    slope = np.polyfit(np.log(i), np.log(lam), 1)[0]
    return float(-slope), lo, hi


def alpha_req(X: Any, *, rank_range: tuple[int, int] | None = None,
              rtol: float | None = None, label: str | None = None) -> float:
    """α-ReQ (Agrawal et al. 2022): decay exponent of the covariance spectrum.

    Least-squares slope of ``log λ_i`` against ``log i`` over ``rank_range``; the sign is such
    that ``λ_i ∝ i^(-α)`` gives ``α > 0`` (larger α = faster decay, lower effective rank).

    Args:
        X: (N, d) states (centred here).
        rank_range: 1-based inclusive ranks ``(lo, hi)`` to fit. Default: ``(10, r // 2)``
            with r the numerical rank (non-zero σ, see module doc); when that leaves fewer than
            5 points, ``(1, max(r // 2, min(r, 3)))``.
        rtol: relative tolerance for "non-zero" singular values.
    """
    A = _centred(X, label)
    s = _svdvals(A)
    return _alpha(s, rank_range, _default_rtol(A.shape) if rtol is None else rtol, label)[0]


def _isoscore(s: np.ndarray, d: int, label: str | None) -> float:
    if d < 2:
        raise data_error("IsoScore needs d >= 2 dimensions", label)
    var = np.zeros(d)
    var[: s.size] = s ** 2
    norm = float(np.linalg.norm(var))
    if not norm > 0:
        raise data_error("X has zero variance (all rows identical); IsoScore is undefined", label)
    sd = math.sqrt(d)
    v = sd * var / norm
    delta = float(np.linalg.norm(v - 1.0)) / math.sqrt(2.0 * (d - sd))
    phi = (d - delta ** 2 * (d - sd)) ** 2 / d ** 2
    score = (d * phi - 1.0) / (d - 1.0)
    return float(min(max(score, 0.0), 1.0))


def isoscore(X: Any, *, label: str | None = None) -> float:
    """IsoScore (Rudman et al. 2022), in [0, 1]: 1 = isotropic, 0 = all variance on one axis.

    The published algorithm: (1) PCA-reorient the point cloud (centre, rotate onto the
    principal axes); (2) take the variance vector Σ_D (the covariance diagonal in that basis =
    the eigenvalues, zero-padded to d when N <= d); (3) normalise ``Σ̂ = √d Σ_D / ‖Σ_D‖``;
    (4) isotropy defect ``δ = ‖Σ̂ - 1‖ / √(2 (d - √d))``; (5) fraction of dimensions used
    ``φ = (d - δ² (d - √d))² / d²``; (6) ``IsoScore = (d φ - 1) / (d - 1)``.
    The scale of the variances cancels, so ``σ²`` is used directly.
    """
    A = _centred(X, label)
    return _isoscore(_svdvals(A), A.shape[1], label)


def mean_cosine(X: Any, *, label: str | None = None) -> float:
    """Mean cosine similarity over all pairs i != j of the **raw** rows (anisotropy figure).

    Exact over all pairs in O(N d) via ``Σ_{i≠j} cos = ‖Σ u_i‖² - N`` for unit rows u_i,
    i.e. ``1 - dispersion(X)``. Not centred: the common direction is what it measures.
    """
    A = as_matrix(X, name="X", label=label, min_rows=2)
    return mean_cosine_numpy(A, label)


def _condition(s: np.ndarray, rtol: float, label: str | None) -> float:
    nz = _nonzero(s, rtol, label)
    return float(nz[0] / nz[-1])


def condition_number(X: Any, *, rtol: float | None = None, label: str | None = None) -> float:
    """``σ_max / σ_min`` over the numerically non-zero singular values of the centred X.

    Args:
        rtol: σ counts as zero when ``σ <= rtol * σ_max``; default ``max(N, d) * eps``.
            A rank-r matrix therefore has a finite condition number (over its r values).
    """
    A = _centred(X, label)
    return _condition(_svdvals(A), _default_rtol(A.shape) if rtol is None else rtol, label)


def spectral_summary(X: Any, *, eps: float = 1e-7, rank_range: tuple[int, int] | None = None,
                     rtol: float | None = None, label: str | None = None) -> dict:
    """All five spectral metrics from one SVD.

    Returns:
        dict with keys ``rankme``, ``alpha_req``, ``isoscore``, ``mean_cosine`` (raw X),
        ``condition_number``, plus ``alpha_rank_lo`` / ``alpha_rank_hi`` (the fit range used)
        and ``numerical_rank``.
    """
    A = pow2_normalise(as_matrix(X, name="X", label=label, min_rows=2))
    Xc = A - A.mean(axis=0)
    s = _svdvals(Xc)
    tol = _default_rtol(A.shape) if rtol is None else rtol
    alpha, lo, hi = _alpha(s, rank_range, tol, label)
    return {
        "rankme": _rankme(s, eps, label),
        "alpha_req": alpha,
        "isoscore": _isoscore(s, A.shape[1], label),
        "mean_cosine": mean_cosine_numpy(A, label),
        "condition_number": _condition(s, tol, label),
        "alpha_rank_lo": lo,
        "alpha_rank_hi": hi,
        "numerical_rank": int(_nonzero(s, tol, label).size),
    }
