"""Uncertainty helpers: percentile bootstrap confidence intervals and correlations with CIs.

Resampling scheme (shared, so :func:`correlation_with_ci` equals
``bootstrap_ci((x, y), spearman)``): ``rng = numpy.random.default_rng(seed)``; replicate r uses
``idx = rng.integers(0, n, size=n)`` (paired: one index vector for all arrays; unpaired: one per
array, drawn in argument order). Replicates whose statistic is not finite (e.g. a constant
resample for a correlation) are dropped and counted in ``n_valid``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.stats

from lmgeom.metrics._common import check_int, check_seed, config_error, data_error, to_numpy


# ---------------------------------------------------------------------- (value, low, high) helpers
# The statistics the dispersion / hardness experiments report (moved from
# lmgeom.experiments.dispersion and .hardness).
def _triplet(res: Any) -> tuple[float, float, float]:
    """(value, low, high) of a :class:`CorrelationResult` (``r``) or :class:`BootstrapResult`
    (``estimate``)."""
    value = res.r if hasattr(res, "r") else res.estimate
    return float(value), float(res.low), float(res.high)


def correlation_interval(x: Any, y: Any, method: str, n_boot: int,
                         seed: int) -> tuple[float, float, float]:
    """Spearman / Pearson of the finite pairs of ``x`` and ``y`` (both ``(n,)``) with a
    percentile-bootstrap 95 % interval (:func:`correlation_with_ci`).

    Returns:
        ``(r, low, high)``; all NaN with fewer than 3 finite pairs or a constant side.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return np.nan, np.nan, np.nan
    return _triplet(correlation_with_ci(x, y, method=method, n_boot=n_boot, seed=seed))


def mean_interval(x: Any, n_boot: int, seed: int,
                  level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the finite values of ``x`` ``(n,)`` with a percentile-bootstrap interval
    (:func:`bootstrap_ci`).

    Returns:
        ``(mean, low, high)``; NaN interval with one value, all NaN with none.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.nan, np.nan, np.nan
    if len(x) < 2:
        return float(x.mean()), np.nan, np.nan
    res = bootstrap_ci(x, np.mean, n_boot=n_boot, level=level, seed=seed)
    v, lo, hi = _triplet(res)
    return float(x.mean()) if not np.isfinite(v) else v, lo, hi


def quantile_overlap(score: Any, reference: Any, quantile: float = 0.1, *, n_perm: int = 1000,
                     seed: int = 0) -> tuple[float, np.ndarray, int]:
    """Rank agreement at the top: the share of the ``k = round(quantile · n)`` items with the
    highest ``reference`` found among the ``k`` lowest ``score`` items, and the same share for
    ``n_perm`` seeded random rankings (``numpy.random.default_rng(seed).permutation``).

    Args:
        score: ``(n,)`` the ranking (lowest first), e.g. dispersion.
        reference: ``(n,)`` what the top should hold, e.g. perplexity (highest first).
        quantile: share of items compared.
        n_perm: random rankings in the null.
        seed: seed of the null.

    Returns:
        ``(observed, null (n_perm,), k)``.
    """
    d = np.asarray(score, dtype=np.float64)
    p = np.asarray(reference, dtype=np.float64)
    n = len(d)
    if n < 2:
        raise data_error(f"need at least 2 texts to rank, got {n}")
    k = max(1, round(quantile * n))
    top_ppl = np.zeros(n, dtype=bool)
    top_ppl[np.argsort(-p, kind="stable")[:k]] = True
    low_disp = np.argsort(d, kind="stable")[:k]
    observed = float(top_ppl[low_disp].mean())
    rng = np.random.default_rng(seed)
    null = np.array([top_ppl[rng.permutation(n)[:k]].mean() for _ in range(n_perm)])
    return observed, null, k

__all__ = [
    "MIN_N_CI",
    "Agreement",
    "BootstrapResult",
    "CorrelationResult",
    "bootstrap_ci",
    "chunk_ci",
    "correlation_interval",
    "correlation_with_ci",
    "mean_interval",
    "paired_chunk_delta",
    "quantile_overlap",
    "rank_agreement",
    "ranks_desc",
]


@dataclass(frozen=True)
class BootstrapResult:
    """Percentile bootstrap interval.

    Attributes:
        estimate: the statistic on the original data.
        low, high: the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of the replicates.
        level: confidence level; n_boot: replicates drawn; n_valid: replicates with a finite
            statistic; seed: the seed used; method: "percentile".
    """

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int
    seed: int
    n_valid: int
    method: str = "percentile"


def _arrays(data: Any, label: str | None) -> tuple[list[np.ndarray], bool]:
    if isinstance(data, tuple):
        arrs = [np.asarray(to_numpy(a, name=f"data[{i}]", label=label)) for i, a in enumerate(data)]
        return arrs, True
    return [np.asarray(to_numpy(data, name="data", label=label))], False


def _check_level(level: Any, label: str | None) -> float:
    if not isinstance(level, (int, float)) or not 0 < float(level) < 1:
        raise config_error(f"level must be in (0, 1); got {level!r}", label)
    return float(level)


def _interval(reps: np.ndarray, level: float, label: str | None) -> tuple[float, float, int]:
    ok = reps[np.isfinite(reps)]
    if ok.size < 2:
        raise data_error(
            f"only {ok.size} of {reps.size} bootstrap replicates gave a finite statistic; the "
            "data are too small or too degenerate for a bootstrap interval",
            label,
        )
    lo, hi = np.percentile(ok, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi), int(ok.size)


def bootstrap_ci(
    data: Any,
    statistic: Callable[..., float],
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    paired: bool = True,
    label: str | None = None,
) -> BootstrapResult:
    """Percentile bootstrap CI of ``statistic``.

    Args:
        data: one array (resampled along axis 0), or a tuple of arrays passed to
            ``statistic(*arrays)``. With ``paired=True`` the arrays must have equal length and
            are resampled jointly (rows stay aligned, e.g. for a correlation); with
            ``paired=False`` each is resampled independently (e.g. two groups).
        statistic: function of the array(s) returning a number.
        n_boot: replicates (>= 2).
        level: confidence level in (0, 1).
        seed: seed of ``numpy.random.default_rng``.
        paired: joint vs independent resampling (tuples only).

    Returns:
        :class:`BootstrapResult`.
    """
    n_boot = check_int(n_boot, name="n_boot", minimum=2, label=label)
    level = _check_level(level, label)
    seed = check_seed(seed, label=label)
    arrs, is_tuple = _arrays(data, label)
    lens = [a.shape[0] if a.ndim else 0 for a in arrs]
    if min(lens) < 2:
        raise data_error(f"bootstrap needs at least 2 observations; got lengths {lens}", label)
    if paired and len(set(lens)) != 1:
        raise data_error(
            f"paired bootstrap needs equal-length arrays; got lengths {lens} (use paired=False "
            "for independent groups)",
            label,
        )
    call = (lambda xs: statistic(*xs)) if is_tuple else (lambda xs: statistic(xs[0]))
    estimate = float(call(arrs))
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    with np.errstate(all="ignore"):
        for r in range(n_boot):
            if paired:
                idx = rng.integers(0, lens[0], size=lens[0])
                xs = [a[idx] for a in arrs]
            else:
                xs = [a[rng.integers(0, n, size=n)] for a, n in zip(arrs, lens)]
            try:
                reps[r] = float(call(xs))
            except (ValueError, FloatingPointError, ZeroDivisionError):
                reps[r] = np.nan
    lo, hi, n_valid = _interval(reps, level, label)
    return BootstrapResult(estimate=estimate, low=lo, high=hi, level=level, n_boot=n_boot,
                           seed=seed, n_valid=n_valid)


@dataclass(frozen=True)
class CorrelationResult:
    """A correlation with its percentile bootstrap CI.

    Attributes:
        method: "spearman" or "pearson"; r: the correlation; p_value: scipy's two-sided
        p-value; low, high: bootstrap CI; level, n_boot, n_valid, seed: as in
        :class:`BootstrapResult`; n: observations.
    """

    method: str
    r: float
    p_value: float
    low: float
    high: float
    level: float
    n: int
    n_boot: int
    n_valid: int
    seed: int


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of (B, n) matrices."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    num = np.einsum("ij,ij->i", xc, yc)
    den = np.sqrt(np.einsum("ij,ij->i", xc, xc) * np.einsum("ij,ij->i", yc, yc))
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def correlation_with_ci(
    x: Any,
    y: Any,
    *,
    method: str = "spearman",
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    label: str | None = None,
) -> CorrelationResult:
    """Spearman or Pearson correlation with a paired percentile bootstrap CI.

    Spearman re-ranks every resample (average ranks for the ties that resampling creates),
    so each replicate is exactly ``scipy.stats.spearmanr`` of the resampled pairs. Vectorised
    over replicates in blocks; the resampling scheme is :func:`bootstrap_ci`'s.

    Args:
        x, y: (n,) paired observations, n >= 3, finite.
        method: "spearman" or "pearson".
    """
    if method not in ("spearman", "pearson"):
        raise config_error(f"method must be 'spearman' or 'pearson'; got {method!r}", label)
    n_boot = check_int(n_boot, name="n_boot", minimum=2, label=label)
    level = _check_level(level, label)
    seed = check_seed(seed, label=label)
    xa = np.ravel(to_numpy(x, name="x", label=label))
    ya = np.ravel(to_numpy(y, name="y", label=label))
    if xa.size != ya.size:
        raise data_error(f"x has {xa.size} values but y has {ya.size}", label)
    n = xa.size
    if n < 3:
        raise data_error(f"a correlation needs at least 3 pairs; got {n}", label)
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        raise data_error("x or y contains NaN/Inf; drop those observations first", label)
    if np.ptp(xa) == 0 or np.ptp(ya) == 0:
        raise data_error("x or y is constant, so the correlation is undefined", label)
    if method == "spearman":
        res = scipy.stats.spearmanr(xa, ya)
    else:
        res = scipy.stats.pearsonr(xa, ya)
    r, p = float(res[0]), float(res[1])
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    block = max(1, (1 << 20) // n)
    for b0 in range(0, n_boot, block):
        b1 = min(n_boot, b0 + block)
        idx = np.stack([rng.integers(0, n, size=n) for _ in range(b1 - b0)])
        xs, ys = xa[idx], ya[idx]
        if method == "spearman":
            xs = scipy.stats.rankdata(xs, axis=1)
            ys = scipy.stats.rankdata(ys, axis=1)
        reps[b0:b1] = _pearson_rows(xs, ys)
    lo, hi, n_valid = _interval(reps, level, label)
    return CorrelationResult(method=method, r=r, p_value=p, low=lo, high=hi, level=level, n=n,
                             n_boot=n_boot, n_valid=n_valid, seed=seed)


# ---------------------------------------------------------------------- evaluation chunks
# (the held-out chunks of the fine-tuning comparison, lmgeom.experiments.finetune)
def chunk_ci(nll_sum: Any, n_predicted: Any, disp: Any, *, seed: int = 0, n_boot: int = 1000,
             level: float = 0.95) -> dict[str, list[float]]:
    """95 % percentile-bootstrap intervals over evaluation chunks (chunks resampled with
    replacement, ``default_rng(seed)``): perplexity and NLL as the corpus ratio
    ``Σ NLL / Σ tokens`` of the resampled chunks, dispersion as their mean. With < 2 chunks the
    interval is NaN."""
    nll_sum = np.asarray(nll_sum, dtype=np.float64)
    n_pred = np.asarray(n_predicted, dtype=np.float64)
    disp = np.asarray(disp, dtype=np.float64)
    if nll_sum.shape[0] < 2:
        nan = [float("nan"), float("nan")]
        return {"perplexity": nan, "nll": nan, "dispersion": nan}
    b = bootstrap_ci((nll_sum, n_pred), lambda a, n: float(a.sum() / n.sum()), n_boot=n_boot,
                     level=level, seed=seed)
    ok = np.isfinite(disp)
    if ok.sum() >= 2:
        bd = bootstrap_ci(disp[ok], lambda x: float(x.mean()), n_boot=n_boot, level=level, seed=seed)
        dci = [bd.low, bd.high]
    else:
        dci = [float("nan"), float("nan")]
    return {"perplexity": [math.exp(b.low), math.exp(b.high)], "nll": [b.low, b.high],
            "dispersion": dci}


def paired_chunk_delta(nll_a: Any, nll_b: Any, n_tokens: Any, disp_a: Any, disp_b: Any, *,
                       seed: int = 0, n_boot: int = 1000) -> dict[str, tuple[float, float, float]]:
    """``a − b`` on the same evaluation chunks, with a paired percentile-bootstrap 95 % CI (the
    same resampled chunks for both, ``default_rng(seed)``): perplexity (corpus ratio
    ``exp(Σ NLL / Σ tokens)``), NLL per token, and mean dispersion. All inputs are ``(n,)``
    per chunk. Returns ``{metric: (delta, low, high)}``."""
    na, nb, t = (np.asarray(x, dtype=np.float64) for x in (nll_a, nll_b, n_tokens))
    da, db = (np.asarray(x, dtype=np.float64) for x in (disp_a, disp_b))
    out = {}
    for metric, f in (
        ("perplexity", lambda x, y, t: math.exp(x.sum() / t.sum()) - math.exp(y.sum() / t.sum())),
        ("nll", lambda x, y, t: (x.sum() - y.sum()) / t.sum()),
    ):
        r = bootstrap_ci((na, nb, t), f, n_boot=n_boot, seed=seed)
        out[metric] = (r.estimate, r.low, r.high)
    ok = np.isfinite(da) & np.isfinite(db)
    r = bootstrap_ci((da[ok], db[ok]), lambda x, y: float(x.mean() - y.mean()), n_boot=n_boot,
                     seed=seed)
    out["dispersion"] = (r.estimate, r.low, r.high)
    return out


# ---------------------------------------------------------------------- rank agreement
#: fewest candidates for a bootstrap CI of a rank agreement
MIN_N_CI = 5

def ranks_desc(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, highest value first (ties: average ranks); NaN stays NaN."""

    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, np.nan)
    ok = np.isfinite(v)
    if ok.any():
        out[ok] = scipy.stats.rankdata(-v[ok])
    return out


@dataclass(frozen=True)
class Agreement:
    """Spearman ρ between a label-free score (higher = better) and a measured quality
    (higher = better), over n candidates; CI only when n >= :data:`MIN_N_CI`."""

    value: float
    low: float
    high: float
    n: int
    method: str


def rank_agreement(score: Sequence[float], quality: Sequence[float], *, n_boot: int = 1000,
                   seed: int = 0) -> Agreement:
    """See :class:`Agreement`. NaN pairs are dropped; constant sides give NaN."""

    x = np.asarray(score, dtype=np.float64)
    y = np.asarray(quality, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    nan = math.nan
    if n < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return Agreement(nan, nan, nan, n, "undefined")
    if n == 2:
        return Agreement(float(np.sign((x[1] - x[0]) * (y[1] - y[0]))), nan, nan, n,
                         "spearman (n=2: order agreement)")
    if n < MIN_N_CI:
        return Agreement(float(scipy.stats.spearmanr(x, y)[0]), nan, nan, n, "spearman")
    r = correlation_with_ci(x, y, method="spearman", n_boot=n_boot, seed=seed)
    return Agreement(float(r.r), float(r.low), float(r.high), n, "spearman, bootstrap 95% CI")
