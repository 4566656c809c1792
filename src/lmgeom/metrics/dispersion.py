"""Representation dispersion (METHODS.md "Representation dispersion", "Dispersion gap").

``D(H) = 1 - mean_{i≠j} cos(h_i, h_j)``. With unit rows ``u_i`` and ``s = Σ u_i``,
``Σ_{i≠j} cos = ‖s‖² - n``, so ``D = 1 - (‖s‖² - n) / (n (n - 1))`` — O(n d) instead of the
O(n² d) pairwise matrix. It is evaluated in the equivalent, better-conditioned form
``D = n / (n - 1) · (1 - ‖ū‖²)`` with ``ū = s / n`` the mean unit vector.

The between-sets version is ``D(A, B) = mean_{i∈A, j∈B} (1 - cos) = 1 - ū_A · ū_B``.

Both accept numpy arrays (float64 arithmetic, a Python float out) or torch tensors (the
tensor's dtype and device, a 0-d tensor out, differentiable — the push-away / squeeze training
losses reuse :func:`dispersion` and :func:`dispersion_between`). The core,
``_dispersion_core``, is the same arithmetic for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmgeom.metrics._common import (
    as_matrix,
    config_error,
    data_error,
    is_torch,
    pow2_normalise,
    to_numpy,
)

__all__ = [
    "DispersionGap",
    "dispersion",
    "dispersion_between",
    "dispersion_gap",
    "dispersion_gap_states",
    "group_means",
    "mean_cosine_numpy",
    "token_dispersion",
]


def _row_norms(H: Any) -> Any:
    if is_torch(H):
        import torch

        return torch.linalg.vector_norm(H, dim=1, keepdim=True)
    return np.sqrt(np.einsum("ij,ij->i", H, H))[:, None]


def _mean_unit(H: Any) -> Any:
    """Mean of the row-normalised H (numpy or torch): ``(1/‖h_i‖)ᵀ H / n``, no (n, d) temporary."""
    return ((1.0 / _row_norms(H)).T @ H)[0] / H.shape[0]


def _dispersion_core(H: Any) -> Any:
    """``n / (n - 1) · (1 - ‖ū‖²)`` — identical arithmetic for numpy arrays and torch tensors."""
    n = H.shape[0]
    u = _mean_unit(H)
    return (1.0 - (u * u).sum()) * (n / (n - 1.0))


def _between_core(A: Any, B: Any) -> Any:
    """``1 - ū_A · ū_B`` for numpy or torch."""
    return 1.0 - (_mean_unit(A) * _mean_unit(B)).sum()


def _check_torch(H: Any, name: str, label: str | None, min_rows: int) -> None:
    import torch

    if H.ndim != 2:
        raise data_error(f"{name} must be 2-D (n, d); got shape {tuple(H.shape)}", label)
    if H.shape[0] < min_rows:
        raise data_error(
            f"{name} has {H.shape[0]} rows; dispersion needs at least {min_rows}", label
        )
    if not H.dtype.is_floating_point:
        raise data_error(f"{name} must be floating point; got {H.dtype}", label)
    with torch.no_grad():
        finite = torch.isfinite(H)
        if not bool(finite.all()):
            n_nan = int(torch.isnan(H).sum())
            n_inf = int(torch.isinf(H).sum())
            raise data_error(
                f"{name} contains {n_nan} NaN and {n_inf} Inf values; float16 overflow "
                "(|x| > 65504) is the usual cause — compute in bfloat16 or float32",
                label,
            )
        zero = torch.linalg.vector_norm(H, dim=1) == 0
        if bool(zero.any()):
            raise _zero_error(name, torch.nonzero(zero).flatten().cpu().numpy(), H.shape[0], label)


def _zero_error(name: str, bad: np.ndarray, n: int, label: str | None) -> Exception:
    shown = ", ".join(str(int(r)) for r in bad[:5]) + (", ..." if bad.size > 5 else "")
    return data_error(
        f"{name} has {bad.size} of {n} rows with zero norm (rows {shown}); cosine is undefined "
        "for zero vectors — exclude padding / masked positions before computing dispersion",
        label,
    )


def _check_numpy(H: Any, name: str, label: str | None, min_rows: int) -> np.ndarray:
    A = pow2_normalise(as_matrix(H, name=name, label=label, min_rows=min_rows))
    norms = np.sqrt(np.einsum("ij,ij->i", A, A))
    bad = np.flatnonzero(norms == 0)
    if bad.size:
        raise _zero_error(name, bad, A.shape[0], label)
    return A


def mean_cosine_numpy(A: np.ndarray, label: str | None) -> float:
    """Mean off-diagonal cosine of the rows of a validated float64 matrix (= 1 - D)."""
    A = _check_numpy(A, "X", label, 2)
    return float(1.0 - _dispersion_core(A))


def dispersion(H: Any, *, check: bool = True, label: str | None = None) -> Any:
    """Representation dispersion ``D(H) = 1 - mean_{i≠j} cos(h_i, h_j)`` in O(n d).

    Args:
        H: (n, d) vectors, n >= 2 — the T token states of one chunk (token-level dispersion)
            or pooled vectors of a set of texts. numpy or torch.
        check: validate the input (shape, finiteness, zero rows). For torch tensors the
            checks synchronise with the device; a training loop may pass ``check=False``.
        label: prefix for error messages.

    Returns:
        float for array input; a 0-d tensor (same dtype/device, differentiable) for tensors.
        Range [0, n/(n-1)]: 0 when all vectors point the same way, about 1 for random
        directions in high dimension.

    Raises:
        DataError: n < 2, non-finite values, zero vectors.
    """
    if is_torch(H):
        if check:
            _check_torch(H, "H", label, 2)
        return _dispersion_core(H)
    return float(_dispersion_core(_check_numpy(H, "H", label, 2)))


def dispersion_between(A: Any, B: Any, *, check: bool = True, label: str | None = None) -> Any:
    """Mean cosine distance between two sets: ``mean_{i∈A, j∈B} (1 - cos(a_i, b_j))``.

    Computed as ``1 - ū_A · ū_B`` in O((|A| + |B|) d). Torch in (either argument) -> torch out,
    differentiable (the cross-domain push-away loss).

    Args:
        A: (n_a, d) vectors, n_a >= 1.
        B: (n_b, d) vectors, n_b >= 1.
    """
    if is_torch(A) or is_torch(B):
        import torch

        ref = A if is_torch(A) else B
        A = A if is_torch(A) else torch.as_tensor(to_numpy(A), dtype=ref.dtype, device=ref.device)
        B = B if is_torch(B) else torch.as_tensor(to_numpy(B), dtype=ref.dtype, device=ref.device)
        if check:
            _check_torch(A, "A", label, 1)
            _check_torch(B, "B", label, 1)
            if A.shape[1] != B.shape[1]:
                raise data_error(f"A has d={A.shape[1]} but B has d={B.shape[1]}", label)
        return _between_core(A, B)
    An = _check_numpy(A, "A", label, 1)
    Bn = _check_numpy(B, "B", label, 1)
    if An.shape[1] != Bn.shape[1]:
        raise data_error(f"A has d={An.shape[1]} but B has d={Bn.shape[1]}", label)
    return float(_between_core(An, Bn))


@dataclass(frozen=True)
class DispersionGap:
    """Result of :func:`dispersion_gap` / :func:`dispersion_gap_states`.

    Attributes:
        gap: ``G = D(T) + D(T, T̄)``.
        within: ``D(T)``, dispersion among the domain vectors.
        between: ``D(T, T̄)``, mean cosine distance domain -> general.
        n_domain, n_general: set sizes.
        variant: ``"W_U"`` (rows of the output projection, no forward pass) or ``"states"``
            (hidden states of domain vs general text).
    """

    gap: float
    within: float
    between: float
    n_domain: int
    n_general: int
    variant: str

    def __float__(self) -> float:
        return float(self.gap)


def _ids(ids: Any, V: int, name: str, minimum: int, label: str | None) -> np.ndarray:
    arr = np.asarray(to_numpy(ids, name=name, label=label) if is_torch(ids) else ids)
    if arr.ndim != 1 or arr.size < minimum:
        raise config_error(f"{name} must be a 1-D list of at least {minimum} token ids", label)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise config_error(f"{name} must be integer token ids; got dtype {arr.dtype}", label)
    arr = arr.astype(np.int64)
    bad = arr[(arr < 0) | (arr >= V)]
    if bad.size:
        raise config_error(
            f"{name} has {bad.size} ids outside the vocabulary [0, {V}) (e.g. {int(bad[0])})", label
        )
    return arr


def _gap(T: np.ndarray, Tbar: np.ndarray, variant: str) -> DispersionGap:
    within = float(_dispersion_core(T))
    between = float(_between_core(T, Tbar))
    return DispersionGap(gap=within + between, within=within, between=between,
                         n_domain=int(T.shape[0]), n_general=int(Tbar.shape[0]), variant=variant)


def dispersion_gap(W_U: Any, domain_ids: Any, general_ids: Any, *,
                   label: str | None = None) -> DispersionGap:
    """Dispersion gap over rows of the output projection (label-free model selection).

    ``G = D(T) + D(T, T̄)`` where T are the rows of ``W_U`` for the domain tokens (digits for
    math, Python keywords for code) and T̄ the rows for general tokens. No forward pass.
    Ids are used as given (a repeated id counts twice).

    Args:
        W_U: (V, d) unembedding (numpy or torch, any dtype).
        domain_ids: >= 2 token ids of the domain set T.
        general_ids: >= 1 token ids of the general set T̄.
    """
    shape = tuple(W_U.shape) if hasattr(W_U, "shape") else np.shape(W_U)
    if len(shape) != 2:
        raise data_error(f"W_U must be 2-D (vocab, d); got shape {shape}", label)
    V = shape[0]
    di = _ids(domain_ids, V, "domain_ids", 2, label)
    gi = _ids(general_ids, V, "general_ids", 1, label)
    if is_torch(W_U):
        import torch

        T = W_U[torch.as_tensor(di, device=W_U.device)]
        Tb = W_U[torch.as_tensor(gi, device=W_U.device)]
    else:
        W = np.asarray(W_U)
        T, Tb = W[di], W[gi]
    T = _check_numpy(T, "W_U[domain_ids]", label, 2)
    Tb = _check_numpy(Tb, "W_U[general_ids]", label, 1)
    return _gap(T, Tb, "W_U")


def dispersion_gap_states(H_domain: Any, H_general: Any, *,
                          label: str | None = None) -> DispersionGap:
    """The forward-pass variant of :func:`dispersion_gap`: the same formula on hidden states.

    ``G = D(H_domain) + D(H_domain, H_general)`` with H_domain (n_a >= 2, d) states of domain
    text and H_general (n_b >= 1, d) states of general text (pooled vectors or token states).
    """
    T = _check_numpy(H_domain, "H_domain", label, 2)
    Tb = _check_numpy(H_general, "H_general", label, 1)
    if T.shape[1] != Tb.shape[1]:
        raise data_error(f"H_domain has d={T.shape[1]} but H_general has d={Tb.shape[1]}", label)
    return _gap(T, Tb, "states")


# ---------------------------------------------------------------------- per-row reductions
# (moved from lmgeom.experiments.dispersion; add "token_dispersion" and "group_means" to
# __all__ when merging)
def token_dispersion(h, mask):
    """Reducer: per row, the dispersion of its masked token states.

    Args:
        h: ``(B, T, d)`` tensor of one point.
        mask: ``(B, T)`` bool tensor of the positions that count.

    Returns:
        ``(B,)`` float64 numpy array; NaN for a row with fewer than 2 positions.
    """
    out = np.full(h.shape[0], np.nan, dtype=np.float64)
    for b in range(h.shape[0]):
        rows = h[b][mask[b]]
        if rows.shape[0] >= 2:
            out[b] = float(dispersion(rows.double()))
    return out


def group_means(
    dispersion: np.ndarray,
    perplexity: np.ndarray,
    group_size: int = 10,
    max_groups: int = 100,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort chunks by perplexity, cut into groups of ``group_size``, return group means.

    Args:
        dispersion: ``(N,)`` or ``(n_layers, N)``.
        perplexity: ``(N,)``.
        group_size: chunks per group; the incomplete last group (highest perplexities) is
            dropped.
        max_groups: keep at most this many groups, evenly spread over the perplexity ranks.

    Returns:
        ``(group_dispersion (..., G), group_perplexity (G,), kept_group_ids (G,))``.
    """
    if group_size < 1:
        raise config_error(f"group_size must be >= 1, got {group_size}")
    if max_groups < 1:
        raise config_error(f"max_groups must be >= 1, got {max_groups}")
    ppl = np.asarray(perplexity, dtype=np.float64)
    disp = np.asarray(dispersion, dtype=np.float64)
    order = np.argsort(ppl, kind="stable")
    n_full = len(ppl) // group_size
    gid = np.arange(n_full)
    if n_full > max_groups:
        gid = np.unique(np.round(np.linspace(0, n_full - 1, max_groups)).astype(np.int64))
    members = order[: n_full * group_size].reshape(n_full, group_size)[gid]  # (G, g)
    return disp[..., members].mean(-1), ppl[members].mean(-1), gid
