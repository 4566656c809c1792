"""Verdict rules of the dispersion paper's claims D1-D8 (``lmgeom claims``).

Every rule is a pure function of measured arrays (or of numbers read from an experiment's tidy
table) returning a :class:`~lmgeom.metrics.claims.ClaimVerdict`; no model, no I/O. The
experiment (:mod:`lmgeom.experiments.claims.dispersion`) gathers the arrays and calls these.

Two dispersions (METHODS.md "Representation dispersion"), both tested for D1 and D2:

* **token** — the dispersion of the token states *inside* one segment (the papers' released
  code): one number per segment; grouped: the mean over the segments of a group.
* **segment** — the dispersion of *segment vectors* (a segment's mean token state) across a
  group of segments. Per segment: its mean cosine distance to every other segment
  (:func:`segment_distance_per_chunk`; their mean is the set's ``D``); per group: ``D`` of the
  group's segment vectors (:func:`group_dispersions`).

Grouping follows :func:`lmgeom.metrics.dispersion.group_means`: segments sorted by perplexity,
cut into consecutive groups of ``g`` (:func:`group_members` returns the same groups).

Verdicts compare a confidence interval with the threshold the claim implies
(:func:`~lmgeom.metrics.claims.verdict_from_interval`); several parts of one claim (models,
levels) are combined by :func:`combine` (all parts must agree) or :func:`conjunction` (a claim
that says two things).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.stats

from ._common import config_error, data_error
from .claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
    SUPPORTED,
    ClaimVerdict,
    ModelInfo,
    verdict_from_interval,
)
from .dispersion import dispersion
from .uncertainty import bootstrap_ci, correlation_interval, quantile_overlap

STATEMENTS: dict[str, str] = {
    "D1": "dispersion and perplexity correlate negatively across text segments",
    "D2": "the negative dispersion-perplexity correlation is stronger in deeper layers",
    "D3": "fine-tuning (LoRA and full) raises dispersion on the target domain",
    "D4": "dispersion within same-continuation clusters grows with training",
    "D5": "low-dispersion texts are harder (higher perplexity)",
    "D6": "the dispersion gap ranks models for a domain as their held-out perplexity does",
    "D7": "attention-sublayer outputs are more dispersed than FFN outputs and make better "
          "kNN-LM keys",
    "D8": "the push-away loss lowers perplexity",
}
VARIANT_TEXT = {
    "token": "dispersion of the token states inside a segment",
    "segment": "dispersion of segment vectors (mean token states) across segments",
}
#: the variant a headline D1 / D2 verdict rests on: the papers' released code measures this one
HEADLINE_VARIANT = "token"
ALPHA = 0.05


def statement(claim: str) -> str:
    """The one-line statement of ``claim`` (``D1`` ... ``D8``, or a variant ``D1.token``)."""
    base, _, variant = claim.partition(".")
    text = STATEMENTS[base]
    if variant in VARIANT_TEXT:
        return f"{text} ({VARIANT_TEXT[variant]})"
    return f"{text} ({variant})" if variant else text


# ---------------------------------------------------------------------- building blocks
def _fmt(x: float) -> str:
    return f"{x:+.3g}" if math.isfinite(x) else "nan"


def interval_verdict(claim: str, quantity: str, estimate: float, low: float, high: float, *,
                     threshold: float = 0.0, direction: str = ">",
                     models: Sequence[ModelInfo] = (), seed: int | None = None,
                     details: dict[str, Any] | None = None, note: str = "") -> ClaimVerdict:
    """The verdict of one measured interval against ``quantity <direction> threshold``, with
    a reason that names the numbers."""
    verdict = verdict_from_interval(low, high, threshold, direction)
    where = {SUPPORTED: "on the claim's side of", CONTRADICTED: "on the other side of",
             INCONCLUSIVE: "straddles"}[verdict]
    if not (math.isfinite(low) and math.isfinite(high)):
        where = "has no interval (too few observations) against"
    reason = (f"{quantity} = {_fmt(estimate)}, 95% CI [{_fmt(low)}, {_fmt(high)}] {where} "
              f"{direction} {threshold:g}")
    return ClaimVerdict(claim=claim, statement=statement(claim), verdict=verdict,
                        reason=f"{reason}; {note}" if note else reason, quantity=quantity,
                        estimate=float(estimate), ci_low=float(low), ci_high=float(high),
                        threshold=float(threshold), direction=direction, models=tuple(models),
                        seed=seed, details=dict(details or {}))


def _worst(parts: Sequence[ClaimVerdict]) -> ClaimVerdict:
    """The part whose interval is least favourable to its claim (furthest bound on the wrong
    side): a claim that must hold for every part holds at most as well as this one."""
    def badness(p: ClaimVerdict) -> float:
        bound = p.ci_low if p.direction == ">" else -p.ci_high
        edge = p.threshold if p.direction == ">" else -p.threshold
        return -(bound - edge) if math.isfinite(bound) else math.inf
    return max(parts, key=badness)


def combine(claim: str, parts: Sequence[ClaimVerdict], *, over: str = "models",
            note: str = "") -> ClaimVerdict:
    """One verdict from several parts that must *all* hold (models, levels, domains): supported
    when every testable part is supported, contradicted when every one is contradicted,
    inconclusive when they are split or any is inconclusive; not testable when no part is. The
    quantity shown is the least favourable part's."""
    tested = [p for p in parts if p.verdict != NOT_TESTABLE]
    models = tuple(dict.fromkeys(m for p in parts for m in p.models))
    if not tested:
        why = "; ".join(dict.fromkeys(p.reason for p in parts)) or "nothing was measured"
        return ClaimVerdict(claim=claim, statement=statement(claim), verdict=NOT_TESTABLE,
                            reason=why, models=models)
    kinds = [p.verdict for p in tested]
    if all(k == SUPPORTED for k in kinds):
        verdict = SUPPORTED
    elif all(k == CONTRADICTED for k in kinds):
        verdict = CONTRADICTED
    else:
        verdict = INCONCLUSIVE
    counts = ", ".join(f"{sum(k == v for k in kinds)} {v}" for v in (SUPPORTED, CONTRADICTED,
                                                                        INCONCLUSIVE)
                       if v in kinds)
    w = _worst(tested)
    reason = (f"{len(tested)} {over}: {counts}; least favourable {w.claim} "
              f"[{'; '.join(m.name for m in w.models)}]: {w.reason}")
    if note:
        reason = f"{note}; {reason}"
    return ClaimVerdict(claim=claim, statement=statement(claim), verdict=verdict, reason=reason,
                        quantity=w.quantity, estimate=w.estimate, ci_low=w.ci_low,
                        ci_high=w.ci_high, threshold=w.threshold, direction=w.direction,
                        models=models, seed=w.seed,
                        details={"parts": [p.row() for p in parts]})


def conjunction(claim: str, parts: Sequence[ClaimVerdict], *, note: str = "") -> ClaimVerdict:
    """A claim that says several things at once (D7): supported when every part is supported,
    contradicted when any part is contradicted, otherwise inconclusive (or not testable)."""
    tested = [p for p in parts if p.verdict != NOT_TESTABLE]
    models = tuple(dict.fromkeys(m for p in parts for m in p.models))
    if len(tested) < len(parts):
        missing = [p for p in parts if p.verdict == NOT_TESTABLE]
        return ClaimVerdict(claim=claim, statement=statement(claim), verdict=NOT_TESTABLE,
                            reason=f"{missing[0].claim}: {missing[0].reason}", models=models)
    kinds = [p.verdict for p in parts]
    verdict = (SUPPORTED if all(k == SUPPORTED for k in kinds)
               else CONTRADICTED if CONTRADICTED in kinds else INCONCLUSIVE)
    reason = "; ".join(f"{p.claim} {p.verdict}" for p in parts)
    w = _worst(parts)
    return ClaimVerdict(claim=claim, statement=statement(claim), verdict=verdict,
                        reason=f"{note}; {reason}" if note else reason, quantity=w.quantity,
                        estimate=w.estimate, ci_low=w.ci_low, ci_high=w.ci_high,
                        threshold=w.threshold, direction=w.direction, models=models, seed=w.seed,
                        details={"parts": [p.row() for p in parts]})


# ---------------------------------------------------------------------- D1 / D2 measurements
def group_members(perplexity: Any, group_size: int, max_groups: int = 100) -> np.ndarray:
    """``(G, group_size)`` segment indices of the perplexity groups of
    :func:`lmgeom.metrics.dispersion.group_means` (sorted by perplexity, consecutive groups,
    incomplete last group dropped, at most ``max_groups`` spread evenly)."""
    if group_size < 1 or max_groups < 1:
        raise config_error(f"group_size and max_groups must be >= 1, got {group_size}, "
                           f"{max_groups}")
    ppl = np.asarray(perplexity, dtype=np.float64)
    order = np.argsort(ppl, kind="stable")
    n_full = len(ppl) // group_size
    gid = np.arange(n_full)
    if n_full > max_groups:
        gid = np.unique(np.round(np.linspace(0, n_full - 1, max_groups)).astype(np.int64))
    return order[: n_full * group_size].reshape(n_full, group_size)[gid]


def _unit(V: Any) -> np.ndarray:
    A = np.asarray(V, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] < 2:
        raise data_error(f"segment vectors must be (n >= 2, d); got shape {A.shape}")
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    if not np.all(np.isfinite(A)) or np.any(norms == 0):
        raise data_error("segment vectors must be finite and non-zero")
    return A / norms


def dispersion_from_unit_sums(unit_sums: Any) -> np.ndarray:
    """Per row of ``[Σ_t u_t, n]`` (the summed unit token states of a segment and their count,
    :func:`lmgeom.experiments.knnlm.unit_sum`'s output): the token-level dispersion
    ``n / (n - 1) · (1 - ‖s / n‖²)``, ``(N,)``; NaN for a row with fewer than 2 tokens."""
    a = np.asarray(unit_sums, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] < 2:
        raise data_error(f"unit sums must be (N, d + 1); got shape {a.shape}")
    s, n = a[:, :-1], np.rint(a[:, -1])
    out = np.full(len(a), np.nan)
    ok = n >= 2
    u = s[ok] / n[ok, None]
    out[ok] = n[ok] / (n[ok] - 1) * (1.0 - np.einsum("ij,ij->i", u, u))
    return out


def segment_distance_per_chunk(V: Any) -> np.ndarray:
    """``(n,)``: each segment vector's mean cosine distance to the other ``n - 1``
    (``1 - (u_i · s - 1) / (n - 1)``, ``s = Σ u``); their mean is ``dispersion(V)``."""
    U = _unit(V)
    n = U.shape[0]
    return 1.0 - (U @ U.sum(0) - 1.0) / (n - 1)


def group_dispersions(V: Any, members: np.ndarray) -> np.ndarray:
    """``(G,)``: ``D`` of the segment vectors of each group (rows of ``members``)."""
    A = np.asarray(V, dtype=np.float64)
    return np.array([dispersion(A[m]) for m in np.asarray(members)], dtype=np.float64)


def spearman_rows(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman of each row of ``X (..., n)`` with ``y (..., n)`` (average ranks for ties, as
    :func:`scipy.stats.spearmanr`); NaN for a constant row."""
    rx = scipy.stats.rankdata(X, axis=-1)
    ry = scipy.stats.rankdata(y, axis=-1)
    rx = rx - rx.mean(-1, keepdims=True)
    ry = ry - ry.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(-1) / np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))


def depth_contrast(values: Any, perplexity: Any, depth: Any, *, n_boot: int = 500,
                   seed: int = 0) -> tuple[float, float, float, dict[str, Any]]:
    """How much more negative the dispersion-perplexity Spearman is in the deeper half of the
    layers than in the shallower half: ``mean_{deep} ρ_ℓ - mean_{shallow} ρ_ℓ`` (deep: depth
    above the median depth), with a percentile-bootstrap 95 % interval over segments (the
    same resampled segments for every layer).

    Args:
        values: ``(L, n)`` dispersion per layer and segment (or group).
        perplexity: ``(n,)``.
        depth: ``(L,)`` relative depth of each layer.

    Returns:
        ``(estimate, low, high, {"rho": per-layer ρ, "deep": mask})``.
    """
    X = np.asarray(values, dtype=np.float64)
    y = np.asarray(perplexity, dtype=np.float64)
    dep = np.asarray(depth, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != y.shape[0] or X.shape[0] != dep.shape[0]:
        raise data_error(f"values {X.shape}, perplexity {y.shape} and depth {dep.shape} do not "
                         "match (L, n), (n,), (L,)")
    deep = dep > np.median(dep)
    if deep.all() or not deep.any() or X.shape[1] < 3:
        return math.nan, math.nan, math.nan, {"rho": [], "deep": deep.tolist()}

    def stat(rho: np.ndarray) -> np.ndarray:
        return np.nanmean(rho[..., deep], -1) - np.nanmean(rho[..., ~deep], -1)

    rho = spearman_rows(X, y)
    est = float(stat(rho))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, X.shape[1], size=(n_boot, X.shape[1]))
    with np.errstate(all="ignore"):
        reps = stat(spearman_rows(X[:, idx].transpose(1, 0, 2), y[idx][:, None, :]))
    reps = reps[np.isfinite(reps)]
    if reps.size < max(10, n_boot // 2):
        return est, math.nan, math.nan, {"rho": rho.tolist(), "deep": deep.tolist()}
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return est, float(lo), float(hi), {"rho": rho.tolist(), "deep": deep.tolist()}


def correlation_verdict(claim: str, dispersion_values: Any, perplexity: Any, *, level: str,
                        models: Sequence[ModelInfo] = (), n_boot: int = 1000, seed: int = 0,
                        note: str = "") -> ClaimVerdict:
    """D1 (and D5's core): Spearman(dispersion, perplexity) with a bootstrap 95 % interval over
    the observations (segments, groups or texts); the claim is ``ρ < 0``."""
    r, lo, hi = correlation_interval(dispersion_values, perplexity, "spearman", n_boot, seed)
    n = int(np.sum(np.isfinite(np.asarray(dispersion_values, float))
                   & np.isfinite(np.asarray(perplexity, float))))
    return interval_verdict(claim, f"Spearman(dispersion, perplexity) over {n} {level}", r, lo,
                            hi, threshold=0.0, direction="<", models=models, seed=seed,
                            details={"n": n, "level": level}, note=note)


def depth_verdict(claim: str, values: Any, perplexity: Any, depth: Any, *, level: str,
                  models: Sequence[ModelInfo] = (), n_boot: int = 500,
                  seed: int = 0) -> ClaimVerdict:
    """D2: :func:`depth_contrast` below 0 (the deeper half correlates more negatively)."""
    est, lo, hi, det = depth_contrast(values, perplexity, depth, n_boot=n_boot, seed=seed)
    return interval_verdict(claim, f"mean Spearman(deeper half) - mean Spearman(shallower half) "
                            f"over {level}", est, lo, hi, threshold=0.0, direction="<",
                            models=models, seed=seed, details={**det, "level": level})


# ---------------------------------------------------------------------- D3 - D8
def paired_difference(a: Any, b: Any, *, weights: Any = None, n_boot: int = 1000,
                      seed: int = 0) -> tuple[float, float, float]:
    """``mean(a - b)`` (weighted when ``weights`` is given) over paired observations with a
    paired percentile-bootstrap 95 % interval; NaN pairs dropped; all NaN below 2 pairs."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    if not x.shape == y.shape == w.shape:
        raise data_error(f"paired arrays differ in shape: {x.shape}, {y.shape}, {w.shape}")
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(w)
    x, y, w = x[ok], y[ok], w[ok]
    if len(x) < 2:
        return math.nan, math.nan, math.nan

    def f(x, y, w):
        return float(((x - y) * w).sum() / w.sum())

    r = bootstrap_ci((x, y, w), f, n_boot=n_boot, seed=seed)
    return r.estimate, r.low, r.high


def ratio_difference(nll_a: Any, nll_b: Any, n_tokens: Any, *, n_boot: int = 1000,
                     seed: int = 0) -> tuple[float, float, float]:
    """``log ppl_a - log ppl_b = (Σ nll_a - Σ nll_b) / Σ n`` over paired chunks (per-chunk
    summed NLLs and token counts), with a paired bootstrap 95 % interval over chunks."""
    a, b, n = (np.asarray(v, dtype=np.float64) for v in (nll_a, nll_b, n_tokens))
    if len(a) < 2:
        return math.nan, math.nan, math.nan
    r = bootstrap_ci((a, b, n), lambda a, b, n: float((a.sum() - b.sum()) / n.sum()),
                     n_boot=n_boot, seed=seed)
    return r.estimate, r.low, r.high


def hardness_verdict(claim: str, dispersion_values: Any, perplexity: Any, *,
                     models: Sequence[ModelInfo] = (), quantile: float = 0.1,
                     n_boot: int = 1000, n_perm: int = 1000, seed: int = 0) -> ClaimVerdict:
    """D5: per text, Spearman(dispersion, perplexity) < 0 (interval over texts); the share of
    the top-perplexity decile found among the lowest-dispersion decile, its random-ranking mean
    and permutation p go into the reason and details."""
    d = np.asarray(dispersion_values, dtype=np.float64)
    p = np.asarray(perplexity, dtype=np.float64)
    ok = np.isfinite(d) & np.isfinite(p)
    obs, null, k = quantile_overlap(d[ok], p[ok], quantile, n_perm=n_perm, seed=seed)
    pval = float((1 + np.sum(null >= obs - 1e-12)) / (1 + len(null)))
    note = (f"top-perplexity {quantile:.0%} (k={k}) found among the lowest-dispersion "
            f"{quantile:.0%}: {obs:.0%} (random {null.mean():.0%}, p = {pval:.3g})")
    v = correlation_verdict(claim, d[ok], p[ok], level="texts", models=models, n_boot=n_boot,
                            seed=seed, note=note)
    v.details.update({"overlap": obs, "overlap_null": float(null.mean()), "overlap_p": pval,
                      "k": k})
    return v


def exact_rank_test(score: Any, quality: Any) -> dict[str, float]:
    """Spearman ρ and Kendall τ between ``score`` and ``quality`` with exact one-sided
    permutation p-values over all ``n!`` orderings (n <= 8): ``p_greater = P(ρ_perm >= ρ)``,
    ``p_less = P(ρ_perm <= ρ)``."""
    x = np.asarray(score, dtype=np.float64)
    y = np.asarray(quality, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    nan = math.nan
    out = {"n": float(n), "rho": nan, "tau": nan, "p_greater": nan, "p_less": nan}
    if n < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    if n > 8:
        raise config_error(f"the exact permutation test enumerates n! orderings; n = {n} > 8")
    rho = float(scipy.stats.spearmanr(x, y)[0])
    tau = float(scipy.stats.kendalltau(x, y)[0])
    perms = np.array(list(itertools.permutations(range(n))))
    null = spearman_rows(np.broadcast_to(x, (len(perms), n)), y[perms])
    eps = 1e-12
    out.update(rho=rho, tau=tau, p_greater=float(np.mean(null >= rho - eps)),
               p_less=float(np.mean(null <= rho + eps)))
    return out


def ranking_verdict(claim: str, score: Any, quality: Any, *, models: Sequence[ModelInfo] = (),
                    what: str = "", alpha: float = ALPHA) -> ClaimVerdict:
    """D6: the ranking by ``score`` (dispersion gap) agrees with the ranking by ``quality``
    (minus held-out bits per byte). Supported when ρ > 0 with exact one-sided permutation
    p <= ``alpha``, contradicted when ρ < 0 with p <= ``alpha`` the other way; inconclusive
    otherwise, and always with fewer than 3 models (the reason says so)."""
    t = exact_rank_test(score, quality)
    n = int(t["n"])
    quantity = f"Spearman(dispersion gap, -bits per byte) over {n} models{what}"
    base: dict[str, Any] = {
        "claim": claim, "statement": statement(claim), "quantity": quantity,
        "estimate": t["rho"], "threshold": 0.0, "direction": ">", "models": tuple(models),
        "details": dict(t)}
    if n < 3:
        return ClaimVerdict(verdict=INCONCLUSIVE, reason=f"{n} model(s) with a measurement: a "
                            "ranking needs at least 3 (the smallest exact p with 3 is 1/6)",
                            **base)
    if not math.isfinite(t["rho"]):
        return ClaimVerdict(verdict=INCONCLUSIVE, reason="a constant side: no ranking", **base)
    p_min = 1.0 / math.factorial(n)
    nums = (f"ρ = {t['rho']:+.3f}, τ = {t['tau']:+.3f}, exact one-sided p = "
            f"{t['p_greater']:.3g} (ρ > 0) / {t['p_less']:.3g} (ρ < 0); smallest possible "
            f"p with {n} models: {p_min:.3g}")
    if t["rho"] > 0 and t["p_greater"] <= alpha:
        verdict = SUPPORTED
    elif t["rho"] < 0 and t["p_less"] <= alpha:
        verdict = CONTRADICTED
    else:
        verdict = INCONCLUSIVE
    return ClaimVerdict(verdict=verdict, reason=f"{nums}; alpha {alpha:g}", **base)


__all__ = [
    "ALPHA",
    "HEADLINE_VARIANT",
    "STATEMENTS",
    "combine",
    "conjunction",
    "correlation_verdict",
    "depth_contrast",
    "depth_verdict",
    "dispersion_from_unit_sums",
    "exact_rank_test",
    "group_dispersions",
    "group_members",
    "hardness_verdict",
    "interval_verdict",
    "paired_difference",
    "ranking_verdict",
    "ratio_difference",
    "segment_distance_per_chunk",
    "spearman_rows",
    "statement",
]
