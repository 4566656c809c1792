"""Step 3 of :mod:`lmgeom.experiments.knnlm`: the
representation dispersion of each candidate measurement point on a seeded sample of training
chunks, pooled over all their token states (:func:`unit_sum` sums unit vectors in one
forward, :func:`pooled_dispersion` turns the sums into ``D``) and as the mean of per-chunk
values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...lm.scoring import forward_chunks
from ...metrics.dispersion import token_dispersion

__all__ = ["DEFAULT_SELECT_TOKENS", "PointDispersion", "measure_point_dispersion",
           "pooled_dispersion", "unit_sum"]

DEFAULT_SELECT_TOKENS = 5000


def unit_sum(h, mask):
    """Reducer: per row, ``[Σ_t h_t / ‖h_t‖, n]`` over masked positions, ``(B, d + 1)``
    float64 (pooled dispersion over many rows follows from the summed unit vectors)."""
    import torch

    x = h.double()
    u = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-300)
    m = mask.to(torch.float64)
    s = (u * m[..., None]).sum(1)
    return torch.cat([s, m.sum(1, keepdim=True)], dim=1).cpu().numpy()


def pooled_dispersion(unit_sums: np.ndarray) -> tuple[float, int]:
    """``D`` of all token states behind rows of :func:`unit_sum` output: with ``s = Σ u`` over
    all n states, ``D = n / (n - 1) · (1 - ‖s / n‖²)``."""
    a = np.asarray(unit_sums, dtype=np.float64)
    s = a[:, :-1].sum(0)
    n = int(np.rint(a[:, -1].sum()))
    if n < 2:
        return math.nan, n
    u = s / n
    return float(n / (n - 1) * (1.0 - u @ u)), n


@dataclass(frozen=True)
class PointDispersion:
    point: str
    pooled: float
    chunk_mean: float
    n_tokens: int
    n_chunks: int


def measure_point_dispersion(model, chunks, points, *, n_tokens: int = DEFAULT_SELECT_TOKENS,
                             seed: int = 0, batch_size: int = 4, cache: bool = True,
                             progress: bool | None = None) -> dict[str, PointDispersion]:
    """Dispersion of each point on a seeded sample of ``chunks`` holding about ``n_tokens``
    positions (see the module docstring, step 3)."""
    red_from = 1 if chunks.bos else 0
    per_chunk = chunks.tokens.shape[1] - red_from
    want = min(len(chunks), max(1, math.ceil(n_tokens / per_chunk)))
    pick = np.sort(np.random.default_rng(seed).choice(len(chunks), size=want, replace=False))
    res = forward_chunks(model, chunks.tokens[pick], tuple(points),
                         {"unit_sum": unit_sum, "token_dispersion": token_dispersion},
                         nll=False, reduce_from=red_from, batch_size=batch_size, cache=cache,
                         progress=progress, desc=f"dispersion {model.name}")
    out = {}
    for p in points:
        pooled, n = pooled_dispersion(res.reduced["unit_sum"][p])
        td = res.reduced["token_dispersion"][p].astype(np.float64)
        out[p] = PointDispersion(point=p, pooled=pooled, chunk_mean=float(np.nanmean(td)),
                                 n_tokens=n, n_chunks=int(want))
    return out
