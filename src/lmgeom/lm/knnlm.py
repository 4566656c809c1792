"""kNN-LM (Khandelwal et al., 2020): a datastore of (context state, next token) pairs searched
with FAISS, interpolated with the base LM (METHODS.md, "kNN-LM layer selection").

Definitions used here:

* **keys** are the states of one measurement point (``ℓ.attn_out``, ``ℓ.ffn_in``,
  ``ℓ.ffn_out``, residual ``ℓ``, ``final``; see :meth:`LanguageModel.resolve_points`) at every
  position ``t`` of every training row except the last one; the **value** of key ``t`` is the
  token at ``t + 1`` (the token that followed that context);
* **queries** are the same point's states of held-out rows; each query at position ``t``
  scores the target token ``t + 1``, exactly the tokens 2..T that
  :func:`lmgeom.lm.scoring.forward_chunks` scores (``score_from = 1``);
* **distance**: FAISS ``IndexFlatL2`` / IVF indexes return *squared* L2 distances. The
  default (``distance="sqeuclidean"``) uses them as they come, as the reference kNN-LM code
  does; ``distance="euclidean"`` takes their square root first;
* ``p_kNN(y) = Σ_{i: v_i = y} exp(-d_i / T) / Σ_i exp(-d_i / T)`` over the k retrieved
  neighbours (computed as a log-sum-exp, so huge distances do not underflow to 0/0);
  neighbours FAISS could not fill (id -1, fewer than k candidates in the probed IVF lists)
  are left out. ``T = "auto"`` sets T to the median nearest-neighbour distance of the
  queries (a scale-free choice: with squared L2 and T = 1 the weights of points whose states
  have norms in the hundreds are one-hot on the nearest neighbour);
* ``p = λ p_kNN + (1 - λ) p_LM``, evaluated as
  ``logaddexp(log λ + log p_kNN, log(1 - λ) + log p_LM)``, so λ = 0 gives ``log p_LM``
  bit for bit; perplexity = ``exp(-mean log p)`` over the scored tokens. One retrieval serves a
  whole λ sweep.

Memory: no ``B×T×V`` logits. The LM side keeps only ``log p_LM(target)`` per position
(readout on chunks of positions, as in :mod:`lmgeom.lm.scoring`); the kNN side only
``log p_kNN(target)``. :func:`knn_distribution` builds a dense distribution and exists for
tests and small cases.

Storage: :class:`~lmgeom.lm.datastore.Datastore` (one folder per content key); the states of
keys and queries: :mod:`lmgeom.lm.knn_states` (import each name from its module or from
:mod:`lmgeom.lm`). FAISS is imported
lazily (``pip install faiss-cpu``; the ``knn`` extra).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from .datastore import (
    Datastore,
    IndexSpec,
)

log = logging.getLogger(__name__)

DEFAULT_K = 1024
DEFAULT_LAMBDA = 0.25
DEFAULT_TEMPERATURE = 1.0
DEFAULT_LAMBDAS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5)
DISTANCES = ("sqeuclidean", "euclidean")


# ---------------------------------------------------------------------- kNN probabilities
def _check_retrieval(dists: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(dists, dtype=np.float64)
    v = np.asarray(ids)
    if d.ndim != 2 or d.shape != v.shape:
        raise DataError(f"distances {d.shape} and neighbour values {v.shape} must both be (Q, k)")
    return d, v


def _log_weights(dists: np.ndarray, ok: np.ndarray, temperature: float, distance: str) -> np.ndarray:
    if temperature <= 0 or not math.isfinite(temperature):
        raise ConfigError(f"temperature must be a positive number, got {temperature}")
    if distance not in DISTANCES:
        raise ConfigError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
    d = np.where(ok, dists, 0.0)
    if distance == "euclidean":
        d = np.sqrt(np.maximum(d, 0.0))
    return np.where(ok, -d / float(temperature), -np.inf)


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - m_safe), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def knn_log_prob(
    dists: np.ndarray,
    neighbour_values: np.ndarray,
    targets: np.ndarray,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    distance: str = "sqeuclidean",
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """``log p_kNN(target)`` per query from its k neighbours.

    Args:
        dists: ``(Q, k)`` distances as FAISS returns them (squared L2 for L2 indexes).
        neighbour_values: ``(Q, k)`` next-token values of the neighbours.
        targets: ``(Q,)`` target token of each query.
        temperature: T in ``exp(-d / T)``.
        distance: ``sqeuclidean`` (use FAISS's squared distances as they are) or ``euclidean``.
        valid: ``(Q, k)`` bool, neighbours to use (default: all); FAISS's unfilled slots
            (id -1) must be marked invalid.

    Returns:
        ``(Q,)`` float64; ``-inf`` where no neighbour carries the target.
    """
    d, v = _check_retrieval(dists, neighbour_values)
    t = np.asarray(targets).reshape(-1)
    if t.shape[0] != d.shape[0]:
        raise DataError(f"{t.shape[0]} targets for {d.shape[0]} queries")
    ok = np.ones(d.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    s = _log_weights(d, ok, temperature, distance)
    log_z = _logsumexp(s, 1)
    hit = v == t[:, None]
    log_num = _logsumexp(np.where(hit, s, -np.inf), 1)
    with np.errstate(invalid="ignore"):
        out = log_num - log_z
    return np.where(np.isfinite(log_z), out, -np.inf)


def knn_distribution(
    dists: np.ndarray,
    neighbour_values: np.ndarray,
    vocab_size: int,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    distance: str = "sqeuclidean",
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """The dense ``(Q, V)`` kNN distribution (for tests and small cases; sums to 1 per row
    that has at least one valid neighbour, all zeros otherwise)."""
    d, v = _check_retrieval(dists, neighbour_values)
    ok = np.ones(d.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    s = _log_weights(d, ok, temperature, distance)
    log_z = _logsumexp(s, 1)
    w = np.where(ok, np.exp(s - np.where(np.isfinite(log_z), log_z, 0.0)[:, None]), 0.0)
    out = np.zeros((d.shape[0], int(vocab_size)), dtype=np.float64)
    rows = np.repeat(np.arange(d.shape[0]), d.shape[1])
    cols = np.where(ok, v, 0).reshape(-1)
    np.add.at(out, (rows, cols), w.reshape(-1))
    return out


def interpolate(lm_log_prob: np.ndarray, knn_log_prob: np.ndarray, lam: float) -> np.ndarray:
    """``log(λ p_kNN + (1 - λ) p_LM)`` per query, float64; λ = 0 returns ``lm_log_prob``."""
    lam = float(lam)
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"lambda must be in [0, 1], got {lam}")
    lm = np.asarray(lm_log_prob, dtype=np.float64)
    kn = np.asarray(knn_log_prob, dtype=np.float64)
    if lam == 0.0:
        return lm.copy()
    if lam == 1.0:
        return kn.copy()
    return np.logaddexp(math.log(lam) + kn, math.log1p(-lam) + lm)


def perplexity_of(log_probs: np.ndarray) -> float:
    """``exp(-mean log p)`` over the scored tokens (inf if any has probability 0)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    if lp.size == 0:
        return math.nan
    with np.errstate(over="ignore"):
        return float(np.exp(-lp.mean()))


# ---------------------------------------------------------------------- evaluation
def resolve_temperature(temperature: float | str, dists: np.ndarray, valid: np.ndarray,
                        distance: str = "sqeuclidean") -> float:
    """A number, or ``"auto"``: the median over queries of the nearest valid neighbour's
    distance (in the chosen ``distance``), which makes ``exp(-d / T)`` scale-free — the same
    T = 1 means very different sharpness at points whose states differ in norm by 100×.
    Uses distances only (no targets), so it stays label-free."""
    if isinstance(temperature, str):
        if temperature.strip().lower() != "auto":
            try:
                temperature = float(temperature)
            except ValueError as exc:
                raise ConfigError(f"temperature must be a positive number or 'auto', got "
                                  f"{temperature!r}") from exc
        else:
            t = nearest_distance(dists, valid, distance)
            if not (math.isfinite(t) and t > 0):
                raise DataError("temperature 'auto': the nearest-neighbour distances are all 0 "
                                "(queries are stored keys?); give a number")
            return t
    t = float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ConfigError(f"temperature must be a positive number or 'auto', got {temperature}")
    return t


def nearest_distance(dists: np.ndarray, valid: np.ndarray, distance: str = "sqeuclidean") -> float:
    """Median over queries of the nearest valid neighbour's distance (NaN if none)."""
    d = np.where(valid, np.asarray(dists, dtype=np.float64), np.inf).min(1)
    d = d[np.isfinite(d)]
    if distance == "euclidean":
        d = np.sqrt(np.maximum(d, 0.0))
    return float(np.median(d)) if d.size else math.nan


def temperature_label(temperature: float | str) -> str:
    return "auto" if isinstance(temperature, str) and temperature.strip().lower() == "auto" \
        else f"{float(temperature):g}"


@dataclass(frozen=True)
class KnnEval:
    """kNN-LM evaluation of one datastore on held-out queries.

    Attributes:
        point: measurement point of keys and queries.
        perplexity: ``λ -> perplexity`` of the interpolated model at the main temperature
            (λ = 0: the base LM).
        grid: ``(temperature label, λ) -> perplexity`` for every temperature evaluated (the
            main one and ``temperatures``), all from the same retrieval.
        knn_log_prob: ``(Q,)`` ``log p_kNN(target)`` at the main temperature (``-inf`` where no
            neighbour has the target).
        target_recall: fraction of queries whose target is among the k neighbours.
        k, distance, index: the settings used (``index``: resolved FAISS settings).
        temperature: the main T as a number; ``temperature_name``: as given (``"auto"``...);
            ``temperatures``: label -> value of every T evaluated.
        nn_distance: median distance of the nearest neighbour (the ``auto`` scale).
        n_queries, n_keys: sizes.
        search_s: seconds spent in FAISS.
    """

    point: str
    perplexity: dict[float, float]
    grid: dict[tuple[str, float], float]
    knn_log_prob: np.ndarray
    target_recall: float
    k: int
    temperature: float
    temperature_name: str
    temperatures: dict[str, float]
    distance: str
    index: dict[str, Any]
    nn_distance: float
    n_queries: int
    n_keys: int
    search_s: float

    @property
    def best_lambda(self) -> float:
        return min(self.perplexity, key=lambda lam: (self.perplexity[lam], lam))

    @property
    def best(self) -> tuple[str, float, float]:
        """``(temperature label, λ, perplexity)`` of the lowest perplexity in the grid."""
        (tl, lam), v = min(self.grid.items(), key=lambda kv: (kv[1], kv[0][1]))
        return tl, lam, v


def evaluate(
    store: Datastore,
    queries: np.ndarray,
    targets: np.ndarray,
    lm_log_prob: np.ndarray,
    *,
    k: int = DEFAULT_K,
    lambdas: Sequence[float] = DEFAULT_LAMBDAS,
    temperature: float | str = DEFAULT_TEMPERATURE,
    temperatures: Sequence[float | str] = (),
    distance: str = "sqeuclidean",
    index: IndexSpec | None = None,
    recompute: bool = False,
    threads: int | None = None,
) -> KnnEval:
    """Interpolated perplexity for every λ in ``lambdas`` (and every extra temperature) from
    one retrieval.

    Args:
        store: the datastore.
        queries: ``(Q, d)`` states of the held-out positions at ``store.point``.
        targets: ``(Q,)`` their next tokens.
        lm_log_prob: ``(Q,)`` ``log p_LM(target)`` of the base model.
        k, lambdas, distance: see the module docstring.
        temperature: the main T (a number or ``"auto"``, see :func:`resolve_temperature`).
        temperatures: more T values for the grid (same retrieval).
        index: FAISS index settings (default exact flat).
        recompute: exact distances for approximate indexes (see :meth:`Datastore.search`).
    """
    if not lambdas:
        raise ConfigError("give at least one lambda")
    if distance not in DISTANCES:
        raise ConfigError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
    t = np.asarray(targets, dtype=np.int64)
    lm = np.asarray(lm_log_prob, dtype=np.float64)
    if not (len(t) == len(lm) == len(queries)):
        raise DataError(f"{len(queries)} queries, {len(t)} targets, {len(lm)} LM log-probs")
    t0 = time.perf_counter()
    D, ids = store.search(queries, k, index, threads=threads, recompute=recompute)
    search_s = time.perf_counter() - t0
    ok = ids >= 0
    vals = np.where(ok, store.values[np.where(ok, ids, 0)], -1)
    main_label = temperature_label(temperature)
    temps: dict[str, float] = {}
    for temp in (temperature, *temperatures):
        temps.setdefault(temperature_label(temp), resolve_temperature(temp, D, ok, distance))
    grid: dict[tuple[str, float], float] = {}
    kls: dict[str, np.ndarray] = {}
    for label, tv in temps.items():
        kls[label] = knn_log_prob(D, vals, t, temperature=tv, distance=distance, valid=ok)
        for lam in lambdas:
            grid[(label, float(lam))] = perplexity_of(interpolate(lm, kls[label], float(lam)))
    main_kl = kls[main_label]
    ppl = {float(lam): grid[(main_label, float(lam))] for lam in lambdas}
    spec = index or IndexSpec()
    nn = nearest_distance(D, ok, distance)
    return KnnEval(point=store.point, perplexity=ppl, grid=grid, knn_log_prob=main_kl,
                   target_recall=float(np.mean(np.isfinite(main_kl))), k=int(D.shape[1]),
                   temperature=temps[main_label], temperature_name=main_label,
                   temperatures=temps, distance=distance,
                   index=spec.resolved(len(store), store.width), nn_distance=nn,
                   n_queries=len(t), n_keys=len(store), search_s=search_s)


__all__ = [
    "DEFAULT_K",
    "DEFAULT_LAMBDA",
    "DEFAULT_LAMBDAS",
    "DEFAULT_TEMPERATURE",
    "DISTANCES",
    "KnnEval",
    "evaluate",
    "interpolate",
    "knn_distribution",
    "knn_log_prob",
    "nearest_distance",
    "perplexity_of",
    "resolve_temperature",
    "temperature_label",
]
