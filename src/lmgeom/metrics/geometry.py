"""Geometry primitives shared by every metric: centring, CCR, the readout basis, null frames.

Conventions (METHODS.md, "Subspace PGA"):

* **centring** subtracts the column means;
* **CCR-m** (common-component removal) additionally removes the top-m principal components of
  the centred matrix, ``X <- X - X P_m^T P_m`` (``m = 0`` is centring only);
* the **readout basis** ``V_k`` is the top-k right singular vectors of ``W_U`` (optionally of
  ``W_U diag(gain)``, what the readout applies to a normalised state);
* **null frames** are uniform on the Grassmannian: the Q factor of a ``d x k`` standard Gaussian,
  with columns sign-fixed by the diagonal of R, drawn from ``numpy.random.default_rng(seed)``
  in the order documented in :func:`null_frames`.

Rows that are identical in the input stay *bit-identical* after :func:`ccr` (BLAS does not
guarantee that on its own), so that duplicate texts give exact distance ties downstream.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from lmgeom.metrics._common import (
    as_matrix,
    blas_threads,
    check_finite,
    check_int,
    check_seed,
    config_error,
    data_error,
    is_torch,
    to_numpy,
)

from .._env import frame_cache_mb

__all__ = [
    "RANK_RTOL",
    "ZERO_RTOL",
    "CCRLevels",
    "ccr",
    "ccr_levels",
    "center",
    "check_basis",
    "duplicate_groups",
    "null_frames",
    "random_frame",
    "readout_basis",
    "top_directions",
]

#: Relative tolerance on singular values below which a direction counts as numerically absent
#: (used by CCR's rank check): sigma_i <= RANK_RTOL * sigma_1.
RANK_RTOL = 1e-6

#: A row counts as zero when its norm is <= ZERO_RTOL times the largest row norm of the
#: reference matrix (the input X for preprocessing, the preprocessed X for projections).
ZERO_RTOL = 1e-10

_SIGN_BIT = np.uint64(1 << 63)


def center(X: Any, *, label: str | None = None) -> np.ndarray:
    """Centre the rows of ``X``.

    Args:
        X: (n, d) array or tensor.
        label: prefix for error messages.

    Returns:
        (n, d) float64 array ``X - mean(X, axis=0)``.
    """
    A = as_matrix(X, name="X", label=label)
    return A - A.mean(axis=0)


def _top_eigh(C: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-q eigenpairs of a symmetric PSD matrix, descending."""
    n = C.shape[0]
    w, V = scipy.linalg.eigh(C, subset_by_index=[n - q, n - 1], driver="evx")
    return w[::-1].copy(), V[:, ::-1].copy()


def top_directions(Xc: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-q principal directions of a centred matrix.

    From the dense float64 eigendecomposition (LAPACK ``syevx``, top q pairs only) of the
    smaller of the d x d and n x n Gram matrices.

    Returns:
        ``(P, lam)``: P (q, d) with orthonormal rows, lam (q,) = squared singular values,
        descending.
    """
    n, d = Xc.shape
    if d <= n:
        lam, V = _top_eigh(Xc.T @ Xc, q)
        return np.ascontiguousarray(V.T), np.maximum(lam, 0.0)
    lam, U = _top_eigh(Xc @ Xc.T, q)
    lam = np.maximum(lam, 0.0)
    P = U.T @ Xc
    norms = np.linalg.norm(P, axis=1)
    norms[norms == 0] = 1.0
    return P / norms[:, None], lam


def duplicate_groups(A: np.ndarray) -> np.ndarray | None:
    """Find rows that are exactly equal (``-0.0 == 0.0``).

    Args:
        A: (n, d) float64 C-contiguous array.

    Returns:
        None when all rows are distinct, else ``rep`` (n,) int64 with ``rep[i]`` the smallest
        index of a row equal to row i.
    """
    n, d = A.shape
    if n < 2:
        return None
    bits = A.view(np.uint64)
    mult = np.random.default_rng(0x5EED_0F_D0).integers(
        1, np.iinfo(np.uint64).max, size=d, dtype=np.uint64, endpoint=True
    ) | np.uint64(1)
    h = np.empty(n, dtype=np.uint64)
    step = max(1, (1 << 20) // d)
    with np.errstate(over="ignore"):
        for r0 in range(0, n, step):
            b = bits[r0:r0 + step]
            b = np.where(b == _SIGN_BIT, np.uint64(0), b)
            b *= mult
            h[r0:r0 + step] = b.sum(axis=1, dtype=np.uint64)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    if first.size == n:
        return None
    rep = first[inv.ravel()].astype(np.int64)
    cand = np.flatnonzero(rep != np.arange(n))
    if not np.all(A[cand] == A[rep[cand]]):
        # A hash collision between unequal rows: fall back to the exact (slower) grouping.
        _, first, inv = np.unique(A + 0.0, axis=0, return_index=True, return_inverse=True)
        if first.size == n:
            return None
        rep = first[inv.ravel()].astype(np.int64)
    return rep


def _canonicalise(out: np.ndarray, rep: np.ndarray | None) -> np.ndarray:
    if rep is not None:
        out = out[rep]
    return out


def ccr(X: Any, m: int = 1, *, label: str | None = None) -> np.ndarray:
    """Centre ``X`` and remove its top-m principal components (CCR-m).

    ``X <- Xc - Xc P_m^T P_m`` with ``Xc`` the centred X and ``P_m`` (m, d) its top-m principal
    directions (from the float64 eigendecomposition of the smaller Gram matrix). ``m = 0``
    is centring only. Rows that are identical in ``X`` are bit-identical in the result.

    Args:
        X: (n, d) array or tensor.
        m: number of principal components to remove (METHODS.md default 1; the paper also
            uses 5 and 10).
        label: prefix for error messages.

    Returns:
        (n, d) float64 array.

    Raises:
        ConfigError: m < 0, or m >= the numerical rank of the centred X (nothing would be left).
        DataError: non-finite values, fewer than 2 rows, all rows identical, or so few
            distinct rows that the centred X has rank <= m (the message says how many).
    """
    m = check_int(m, name="ccr (number of components removed)", minimum=0, label=label)
    return ccr_levels(X, (m,), label=label).residuals[m]


@dataclass(frozen=True)
class CCRLevels:
    """Several CCR levels of one matrix from one eigendecomposition (:func:`ccr_levels`).

    Attributes:
        residuals: level m -> (n, d) CCR-m matrix (as :func:`ccr` returns it, up to rounding
            of the shared eigendecomposition; bit-identical for a single level).
        directions: (m_max, d) top principal directions of the centred X, descending.
        coefficients: (n, m_max) ``Xc @ directions.T`` for Xc the centred input scaled by
            ``2**-exponent``: level m's residual is level m_max's plus
            ``2**exponent * coefficients[:, m:] @ directions[m:]``.
        rep: None when the input rows are distinct, else ``rep[i]`` = smallest index of a row
            equal to row i (:func:`duplicate_groups` of the input).
        exponent: the power of two the input was scaled by (residuals are scaled back).
    """

    residuals: dict
    directions: np.ndarray
    coefficients: np.ndarray
    rep: np.ndarray | None
    exponent: int


def ccr_levels(X: Any, levels: Any, *, label: str | None = None) -> CCRLevels:
    """CCR-m for every m in ``levels`` with one eigendecomposition (top max(levels)+1 pairs).

    Each level is checked as :func:`ccr` checks it (same errors). The directions of a level m
    are the first m of the shared top-(m_max + 1) eigenvectors, which equal those of a separate
    top-(m + 1) decomposition up to rounding (bit-identical when ``levels`` has one entry).
    """
    A0 = as_matrix(X, name="X", label=label, min_rows=2)
    levels = sorted({check_int(m, name="ccr (number of components removed)", minimum=0,
                               label=label) for m in levels})
    if not levels:
        raise config_error("give at least one CCR level", label)
    top = float(np.max(np.abs(A0)))
    e = int(np.frexp(top)[1]) if top > 0 else 0
    A = np.ldexp(A0, -e) if e else A0  # exact power-of-two scaling: no overflow in Gram
    n, d = A.shape
    Xc = A - A.mean(axis=0)
    scale = float(np.max(np.abs(A)))
    if not np.any(np.abs(Xc) > ZERO_RTOL * scale):
        raise data_error(
            f"X has no variance: all {n} rows are (numerically) identical, so every row is zero "
            "after centring — identical texts collapse onto the mean (or, with last-token "
            "pooling, every text ends in the same token); pass distinct texts or use "
            "pooling='mean' (--pooling mean)",
            label,
        )
    m_max = levels[-1]
    P = np.zeros((0, d))
    if m_max > 0:
        max_rank = min(n - 1, d)
        if m_max >= max_rank:
            raise config_error(
                f"CCR-{m_max} removes {m_max} principal components but the centred X (n={n}, "
                f"d={d}) has rank at most {max_rank}; use ccr < {max_rank} or pass more rows",
                label,
            )
        with blas_threads(float(n) * d * min(n, d) + float(min(n, d)) ** 3):
            P, lam = top_directions(Xc, m_max + 1)
        for m in levels:
            if m > 0 and (lam[0] <= 0 or lam[m] <= (RANK_RTOL ** 2) * lam[0]):
                rank = int(np.count_nonzero(lam > (RANK_RTOL ** 2) * max(lam[0], 0.0)))
                few = _few_distinct_error(A, m, rank, label)
                if few is not None:
                    raise few
                raise config_error(
                    f"CCR-{m}: the centred X has numerical rank {rank} <= {m} (singular values "
                    f"below {RANK_RTOL:g} x the largest count as zero), so removing {m} "
                    "components leaves only rounding noise; use a smaller ccr",
                    label,
                )
        P = P[:m_max]
    rep = duplicate_groups(A)
    with blas_threads(2.0 * n * d * m_max):
        T = Xc @ P.T
    out = {}
    for m in levels:
        if m == 0:
            R = Xc.copy() if m_max > 0 else Xc
        else:
            Pm = P[:m]
            with blas_threads(4.0 * n * d * m):
                R = Xc - (Xc @ Pm.T) @ Pm
        R = _canonicalise(R, rep)
        out[m] = np.ldexp(R, e) if e else R
    return CCRLevels(residuals=out, directions=P, coefficients=_canonicalise(T, rep), rep=rep,
                     exponent=e)


def _few_distinct_error(A: np.ndarray, m: int, rank: int, label: str | None) -> Exception | None:
    """The DataError for a CCR-m rank failure whose cause is too few *distinct* rows (k
    distinct rows span at most k - 1 dimensions after centring; with last-token pooling, texts
    that end in the same token give the same state at the embedding layer), else None."""
    rep = duplicate_groups(A)
    n = A.shape[0]
    k = n if rep is None else int(np.unique(rep).size)
    if k - 1 > m:
        return None
    why = ("does every text end in the same token?" if 2 * k <= n
           else "texts that end in the same token share a state")
    return data_error(
        f"only {k} distinct states among {n} rows ({why}), so the centred X has rank {rank} "
        f"and CCR-{m} leaves nothing; use pooling='mean' (--pooling mean) or more varied texts",
        label,
    )


def _rows_float64(W: Any, r0: int, r1: int) -> np.ndarray:
    if is_torch(W):
        import torch

        return W[r0:r1].detach().to(device="cpu", dtype=torch.float64).numpy()
    return np.asarray(W[r0:r1], dtype=np.float64)


def readout_basis(W_U: Any, k: int = 100, *, gain: Any = None, d: int | None = None,
                  label: str | None = None) -> np.ndarray:
    """Top-k right singular vectors of the unembedding (the readout subspace ``V_k``).

    Computed from the d x d Gram matrix ``W^T W`` accumulated in float64 over row chunks (so a
    262k x 640 bfloat16 ``W_U`` never needs a full float64 copy) and its eigendecomposition.
    Each column's sign is fixed so that its largest-magnitude entry is positive.

    Args:
        W_U: (V, d) unembedding (``lm_head.weight`` in transformers, nnsight). TransformerLens
            stores it as ``(d_model, d_vocab)``: pass ``d=`` (the states' width) and either
            layout is read, or pass ``model.W_U.T``. Numpy or torch of any dtype.
        k: subspace dimension, 0 < k < d and k <= rank(W_U).
        gain: optional (d,) final-norm gain γ; the basis is then that of ``W_U diag(γ)``
            (METHODS.md ``readout="effective"``).
        d: the model width, when known: a ``(d, V)`` W_U is then transposed (a view, no copy).
            Without it, a W_U with fewer rows than columns is refused (a language model's
            vocabulary is larger than its width), before any work.
        label: prefix for error messages.

    Returns:
        (d, k) float64 array with orthonormal columns, ordered by decreasing singular value.

    Raises:
        DataError: W_U is not 2-D, is in the (d, V) layout without ``d=``, is not finite, or
            has rank below k (the extra columns would be arbitrary directions).
    """
    shape = tuple(W_U.shape) if hasattr(W_U, "shape") else np.shape(W_U)
    if len(shape) != 2:
        raise data_error(f"W_U must be 2-D (vocab, d); got shape {shape}", label)
    if d is not None:
        d = check_int(d, name="d", minimum=1, label=label)
        if shape[1] != d and shape[0] == d:  # TransformerLens's (d_model, d_vocab)
            W_U = W_U.T
            shape = (shape[1], shape[0])
        elif shape[1] != d:
            raise data_error(f"W_U has shape {shape}, but the width is d={d}: neither axis "
                             "matches; pass this model's unembedding", label)
    elif shape[0] < shape[1]:
        raise data_error(
            f"W_U has shape {shape}: fewer rows than columns, the (d_model, d_vocab) layout "
            "(TransformerLens's model.W_U); lmgeom reads (vocab, d) like lm_head.weight. Pass "
            f"W_U.T, or readout_basis(W_U, k, d={shape[0]}) to say which axis is the width",
            label)
    if not (is_torch(W_U) or isinstance(W_U, np.ndarray)):
        W_U = to_numpy(W_U, name="W_U", label=label)
    V, d = shape
    k = check_int(k, name="k", minimum=1, label=label)
    if k >= d:
        raise config_error(
            f"k={k} must be smaller than the model width d={d} (k >= d makes the readout "
            "subspace the whole space); use e.g. k=100",
            label,
        )
    if k > V:
        raise config_error(f"k={k} exceeds the vocabulary size {V}", label)
    g = None
    if gain is not None:
        g = to_numpy(gain, name="gain", label=label).ravel()
        if g.shape != (d,):
            raise data_error(f"gain must have shape ({d},); got {tuple(g.shape)}", label)
        check_finite(g, name="gain", label=label)
    step = max(1, (1 << 22) // d)
    top = 0.0  # first pass: finiteness and the scale (so the Gram matrix cannot overflow)
    for r0 in range(0, V, step):
        rows = _rows_float64(W_U, r0, min(V, r0 + step))
        check_finite(rows, name=f"W_U rows {r0}..{r0 + rows.shape[0] - 1}", label=label)
        if g is not None:
            rows = rows * g
        top = max(top, float(np.max(np.abs(rows))) if rows.size else 0.0)
    if top == 0.0:
        raise data_error("W_U is all zeros; cannot build a readout basis", label)
    e = int(np.frexp(top)[1]) + int(np.ceil(np.log2(max(V, 1)))) // 2 + 1
    C = np.zeros((d, d))
    for r0 in range(0, V, step):
        rows = _rows_float64(W_U, r0, min(V, r0 + step))
        if g is not None:
            rows = rows * g
        rows = np.ldexp(rows, -e)
        C += rows.T @ rows
    with blas_threads(float(d) ** 3):
        lam, Vk = _top_eigh(C, k)
    if lam[0] <= 0:
        raise data_error("W_U is all zeros; cannot build a readout basis", label)
    # σ_k² / σ_1² below 1e-12 (σ_k / σ_1 < 1e-6) is float64 noise of the Gram matrix: W_U has
    # rank < k, and the top-k "basis" would end in arbitrary directions
    rank = int(np.sum(lam > lam[0] * 1e-12))
    if rank < k:
        raise data_error(
            f"W_U has rank {rank} (singular values beyond the {rank}-th are < 1e-6 of the "
            f"largest), below k={k}: the readout subspace has only {rank} directions; use "
            f"k <= {rank}", label)
    idx = np.argmax(np.abs(Vk), axis=0)
    signs = np.sign(Vk[idx, np.arange(k)])
    signs[signs == 0] = 1.0
    return np.ascontiguousarray(Vk * signs)


#: Largest ``|V^T V - I|`` entry :func:`check_basis` accepts.
_ORTHO_TOL = 1e-6


def check_basis(basis: Any, d: int, *, name: str = "basis", label: str | None = None) -> np.ndarray:
    """Validate a (d, k) orthonormal basis with 0 < k < d."""
    shape = tuple(getattr(basis, "shape", np.shape(basis)))
    if len(shape) != 2:
        raise config_error(f"{name} must be a (d, k) matrix; got shape {shape}", label)
    if shape[0] != d:
        raise config_error(
            f"{name} has {shape[0]} rows but the states have d={d} columns; build it from "
            "this model's W_U with readout_basis(W_U, k)",
            label,
        )
    k = shape[1]
    if k <= 0:
        raise config_error(f"{name} has k={k} columns; k must be >= 1", label)
    if k >= d:
        raise config_error(
            f"{name} has k={k} columns but k must be smaller than d={d} (k >= d makes the "
            "subspace the whole space); use e.g. k=100 for d >= 256",
            label,
        )
    V = as_matrix(basis, name=name, label=label)
    err = float(np.max(np.abs(V.T @ V - np.eye(k))))
    if err > _ORTHO_TOL:
        raise config_error(
            f"{name} columns are not orthonormal (max |V^T V - I| = {err:.2g}); use "
            "readout_basis(W_U, k) or orthonormalise it (numpy.linalg.qr)",
            label,
        )
    return V


def _qr_single_thread(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR (LAPACK geqrf/orgqr, bit-identical to numpy.linalg.qr) with BLAS on one
    thread: multi-threaded LAPACK is ~10x slower on these tall-skinny d x k matrices."""
    with blas_threads():
        return scipy.linalg.qr(G, mode="economic", check_finite=False)


def random_frame(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    """One frame uniform on the Grassmannian: Q of ``QR(rng.standard_normal((d, k)))``.

    Columns are multiplied by ``sign(diag(R))`` (0 counts as +1), which makes Q Haar-distributed
    on the Stiefel manifold. Consumes exactly one ``standard_normal((d, k))`` draw from ``rng``.

    Returns:
        (d, k) float64 array with orthonormal columns.
    """
    G = rng.standard_normal((d, k))
    Q, R = _qr_single_thread(G)
    s = np.sign(np.diag(R))
    s[s == 0] = 1.0
    return Q * s


def iter_frames(rng: np.random.Generator, dims: list[tuple[int, int]],
                n: int) -> Iterator[list[np.ndarray]]:
    """Yield n draws; each draw is one frame per (d, k) in ``dims``, drawn in that order."""
    for _ in range(n):
        yield [random_frame(rng, d, k) for d, k in dims]


def _frame_cache_budget() -> int:
    """Bytes the null-frame cache may hold (``LMGEOM_FRAME_CACHE_MB``, default 512; 0 = off)."""
    return max(0, int(frame_cache_mb() * 2**20))


_FRAME_CACHE: OrderedDict[tuple[int, int, int, int], tuple[np.ndarray, ...]] = OrderedDict()
_FRAME_CACHE_LOCK = threading.Lock()


def clear_frame_cache() -> None:
    """Drop the null frames memoised by :func:`cached_frames` (frees their memory)."""
    with _FRAME_CACHE_LOCK:
        _FRAME_CACHE.clear()


def cached_frames(d: int, k: int, n: int, seed: Any) -> Iterator[np.ndarray]:
    """The first ``n`` frames of ``iter_frames(default_rng(seed), [(d, k)], n)``, memoised.

    Every layer and CCR level of an analysis uses the same ``(d, k, n_null, seed)`` null frames;
    generating them (one Householder QR each) was two thirds of a layer's PGA time. The frames
    are yielded in the same order with the same bits as a fresh generator would give, so results
    do not depend on whether the cache was hit. Frames are read-only; the cache is an LRU bounded
    by ``LMGEOM_FRAME_CACHE_MB`` (default 512 MB); a set larger than the budget is streamed and
    never held.
    """
    key = (int(d), int(k), int(n), int(seed)) if isinstance(seed, (int, np.integer)) else None
    budget = _frame_cache_budget()
    size = 8 * int(d) * int(k) * int(n)
    if key is not None:
        with _FRAME_CACHE_LOCK:
            hit = _FRAME_CACHE.get(key)
            if hit is not None:
                _FRAME_CACHE.move_to_end(key)
        if hit is not None:
            yield from hit
            return
    rng = np.random.default_rng(seed)
    if key is None or size > budget:
        for f in iter_frames(rng, [(d, k)], n):
            yield f[0]
        return
    made: list[np.ndarray] = []
    for f in iter_frames(rng, [(d, k)], n):
        f[0].setflags(write=False)
        made.append(f[0])
        yield f[0]
    with _FRAME_CACHE_LOCK:
        _FRAME_CACHE[key] = tuple(made)
        _FRAME_CACHE.move_to_end(key)
        total = sum(8 * v[0].size * len(v) for v in _FRAME_CACHE.values())
        while total > budget and len(_FRAME_CACHE) > 1:
            _, old = _FRAME_CACHE.popitem(last=False)
            total -= 8 * old[0].size * len(old)


def null_frames(d: int, k: int, n_null: int = 100, seed: int = 0) -> np.ndarray:
    """The null frames :func:`~lmgeom.metrics.subspace_pga` uses for this ``seed``.

    Draw b (b = 0, 1, ..., n_null - 1) is ``random_frame(rng, d, k)`` with
    ``rng = numpy.random.default_rng(seed)`` shared by all draws, i.e. the b-th
    ``standard_normal((d, k))`` of that generator, QR-decomposed and sign-fixed.
    (:func:`~lmgeom.metrics.cross_model_alignment` draws model A's then model B's frame
    for each b from the same generator.)

    Returns:
        (n_null, d, k) float64 array. Memory: ``8 * n_null * d * k`` bytes.
    """
    d = check_int(d, name="d", minimum=1)
    k = check_int(k, name="k", minimum=1)
    n_null = check_int(n_null, name="n_null", minimum=1)
    if k > d:
        raise config_error(f"k={k} exceeds d={d}")
    return np.stack(list(cached_frames(d, k, n_null, check_seed(seed))))
