"""The layer table's z profiles and one model's call on a claim: the shared machinery of the
PGA claim rules (:mod:`lmgeom.metrics.claims_pga`).

A *profile* is one model's PGA z per layer with its null band (:func:`z_profile`); a *call*
(:class:`Call`) is one model's verdict on a claim before the verdict over models
(:func:`over_models`, :func:`all_of`). Every z decision goes through the power rule
(:func:`z_of` → :func:`lmgeom.metrics.claims.z_call`); a model with no usable z gets
:func:`flagged_out`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
    SUPPORTED,
    UNDERPOWERED,
    ModelInfo,
    Power,
    z_call,
)
from .regime import CollapseProfile, collapse_profile

#: the primary setting (the method's default CCR-1)
PRIMARY = "ccr=1"
#: resamples of the bootstrap intervals
N_BOOT = 2000
#: the fewest independent points (layers, layer pairs) a bootstrap interval is drawn from: a
#: resample of one point is that point again ([2.34, 2.34] from one layer), and two points
#: give three distinct resamples; neither is an interval that can decide a claim
MIN_INTERVAL_POINTS = 3
#: the flag code of a z that is not meaningful (:mod:`lmgeom.metrics.sample_size`)
NOT_MEANINGFUL = "k_rank"


@dataclass(frozen=True)
class Call:
    """One model's verdict on a claim, before the claim's verdict over models."""

    model: ModelInfo
    verdict: str
    estimate: float
    ci_low: float
    ci_high: float
    note: str
    extra: dict[str, Any] = field(default_factory=dict)


def all_of(verdicts: Sequence[str]) -> str:
    """Verdict of a conjunction: contradicted when any part is, supported when all are,
    underpowered when the rest are supported and some part needs more texts, else
    inconclusive (``not testable here`` when there is no part)."""
    if not verdicts:
        return NOT_TESTABLE
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    if all(v == SUPPORTED for v in verdicts):
        return SUPPORTED
    if all(v in (SUPPORTED, UNDERPOWERED) for v in verdicts):
        return UNDERPOWERED
    return INCONCLUSIVE


def any_of(verdicts: Sequence[str]) -> str:
    """Verdict of a disjunction: supported when any part is, contradicted when all are,
    underpowered when the rest are contradicted and some part needs more texts, else
    inconclusive (``not testable here`` when there is no part)."""
    if not verdicts:
        return NOT_TESTABLE
    if SUPPORTED in verdicts:
        return SUPPORTED
    if all(v == CONTRADICTED for v in verdicts):
        return CONTRADICTED
    if UNDERPOWERED in verdicts:
        return UNDERPOWERED
    return INCONCLUSIVE


def over_models(verdicts: Sequence[str]) -> str:
    """Verdict over models: the common verdict when all agree; underpowered when the decided
    ones agree and the rest need more texts (more n could settle it); else inconclusive."""
    vs = [v for v in verdicts if v != NOT_TESTABLE]
    if not vs:
        return NOT_TESTABLE
    if all(v == vs[0] for v in vs):
        return vs[0]
    decided = {v for v in vs if v != UNDERPOWERED}
    return UNDERPOWERED if len(decided) == 1 and decided <= {SUPPORTED, CONTRADICTED} \
        else INCONCLUSIVE


def bootstrap_ci(values: Sequence[float], stat, *, seed: int, n_boot: int = N_BOOT,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of ``stat(values[idx])`` over resampled indices (seeded);
    ``(nan, nan)`` from fewer than :data:`MIN_INTERVAL_POINTS` values (an interval from one
    or two points decides nothing: :func:`~lmgeom.metrics.claims.verdict_from_interval` then
    says inconclusive, and the caller says why with :func:`too_few_points`)."""
    x = np.asarray(values, dtype=float)
    if x.shape[0] < MIN_INTERVAL_POINTS:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))
    boots = np.array([stat(x[i]) for i in idx], dtype=float)
    boots = boots[np.isfinite(boots)]
    if boots.size == 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    return float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a))


def too_few_points(n: int, what: str = "layers") -> str:
    """Why an interval over ``n`` points is no interval ("" when there are enough)."""
    if n >= MIN_INTERVAL_POINTS:
        return ""
    return (f"an interval from {n} {what} decides nothing (it needs at least "
            f"{MIN_INTERVAL_POINTS} independent points)")


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman correlation (average ranks; NaN when either side is constant)."""
    ra = pd.Series(np.asarray(a, dtype=float)).rank().to_numpy()
    rb = pd.Series(np.asarray(b, dtype=float)).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def plain_rows(df: pd.DataFrame, model: str, metric: str, setting: str | None = None) -> pd.DataFrame:
    """Plain layer rows (``0..L``, ``final``) of one model and metric, in layer order."""
    sel = ((df["model"].astype(str) == model) & (df["metric"] == metric)
           & (df["layer_index"] >= 0)
           & ~df["layer"].astype(str).str.contains(".", regex=False))
    if setting is not None:
        sel &= df["setting"].astype(str) == setting
    rows = df.loc[sel]
    rows = rows[np.isfinite(rows["value"].astype(float))]
    return rows.drop_duplicates("layer_index", keep="first").sort_values("layer_index")


def z_profile(df: pd.DataFrame, model: str, setting: str = PRIMARY) -> pd.DataFrame:
    """One model's PGA z per layer with its null band: columns ``layer``, ``layer_index``,
    ``z``, ``lo``, ``hi`` (``lo`` / ``hi``: the null's 2.5 / 97.5 % points in z units;
    ±1.96 where the table has no band), layer order. Layers flagged ``k_rank`` (k at or above
    the rank of the states, where z is not meaningful) are left out."""
    z = plain_rows(df, model, "pga_z", setting)
    if "flag" in z.columns:  # k >= the states' rank: z is not meaningful there (no evidence)
        z = z[~z["flag"].astype(str).str.contains(NOT_MEANINGFUL, regex=False)]
    z = z[["layer", "layer_index", "value"]].rename(columns={"value": "z"})
    for metric, col, default in (("null_z_low", "lo", -1.96), ("null_z_high", "hi", 1.96)):
        band = plain_rows(df, model, metric, setting)[["layer_index", "value"]]
        z = z.merge(band.rename(columns={"value": col}), on="layer_index", how="left")
        z[col] = z[col].astype(float).fillna(default)
    z["layer"] = z["layer"].astype(str)
    return z.reset_index(drop=True)


def final_index(prof: pd.DataFrame) -> int:
    labels = list(prof["layer"])
    return int(prof["layer_index"].iloc[labels.index("final")] if "final" in labels
               else prof["layer_index"].max())


def every_bounds(prof: pd.DataFrame) -> tuple[float, float]:
    """z-null interval of "z > 0 at every layer of ``prof``": the lowest bounds."""
    return float((prof["z"] - prof["hi"]).min()), float((prof["z"] - prof["lo"]).min())


def texts_n(df: pd.DataFrame | None, model: str) -> int | None:
    """The number of texts behind a model's rows (its ``pc1_share`` rows' ``n``)."""
    if df is None or df.empty:
        return None
    n = plain_rows(df, model, "pc1_share")["n"].astype(float)
    n = n[np.isfinite(n)]
    return int(n.max()) if len(n) else None


def power_of(df: pd.DataFrame | None, m: ModelInfo,
             powers: Mapping[str, Power] | None = None) -> Power | None:
    """The :class:`~lmgeom.metrics.claims.Power` of model ``m``: from ``powers`` when given,
    else from the table's n with the assumed growth (``None``: no n to go on)."""
    if powers and m.name in powers:
        return powers[m.name]
    n = texts_n(df, m.name)
    return Power(n) if n else None


#: a layer enters the growth fit when |z| clears this at the largest n (clearly an effect)
GROWTH_MIN_Z = 4.0
#: fewer such layers than this: the growth stays the assumed one
GROWTH_MIN_LAYERS = 3


def ladder_powers(tables: Mapping[int, pd.DataFrame], models: Sequence[ModelInfo]
                  ) -> dict[int, dict[str, Power]]:
    """Each model's :class:`~lmgeom.metrics.claims.Power` at each rung of an n-ladder, with
    the growth of |z| with n *measured* on this run: per layer and CCR level whose |z| at the
    largest n is at least :data:`GROWTH_MIN_Z` and has one sign on every rung, the slope of
    ``log |z|`` on ``log n`` (least squares); the median over those layers (clipped to
    0.01..1). A model with fewer than :data:`GROWTH_MIN_LAYERS` such layers keeps the assumed
    growth. ``tables``: ``{n: layer table at n}``."""
    ns = sorted(tables)
    out: dict[int, dict[str, Power]] = {n: {} for n in ns}
    for m in models:
        slopes = []
        by_n = {}
        for n in ns:
            z = plain_rows(tables[n], m.name, "pga_z")
            by_n[n] = {(r.layer_index, r.setting): float(r.value)
                       for r in z.itertuples()} if not z.empty else {}
        for key, top in by_n[ns[-1]].items():
            zs = [by_n[n].get(key, math.nan) for n in ns]
            if abs(top) < GROWTH_MIN_Z or not all(np.isfinite(zs)) \
                    or len({np.sign(v) for v in zs}) != 1:
                continue
            slopes.append(float(np.polyfit(np.log(ns), np.log(np.abs(zs)), 1)[0]))
        if len(slopes) >= GROWTH_MIN_LAYERS and len(ns) >= 2:
            g = float(np.clip(np.median(slopes), 0.01, 1.0))
            src = f"measured on this run's n-ladder ({len(slopes)} layers, n = {ns[0]}..{ns[-1]})"
            for n in ns:
                out[n][m.name] = Power(n, growth=g, source=src)
    return out


def z_of(m: ModelInfo, row: Any, direction: str, power: Power | None, what: str
         ) -> Call:
    """One model's call on "z of ``row`` is ``direction`` 0" (power rule applied); ``what``
    describes the row for the note."""
    v, why, nums = z_call(float(row.z), float(row.lo), float(row.hi), direction, power)
    if power is not None:
        nums = {**nums, "n": float(power.n)}
    note = what + (f"; {why}" if why else "")
    return Call(m, v, float(row.z), float(row.z - row.hi), float(row.z - row.lo), note, nums)


def every_z(m: ModelInfo, prof: pd.DataFrame, power: Power | None, what: str) -> Call:
    """"z is above 0 at every layer of ``prof``": contradicted by any layer decided below;
    supported when every layer is decided above; else the verdict of the layers not decided
    (underpowered, with the n they would need), taken from the lowest such layer. The CI is
    the lowest bounds over the layers (``_every``)."""
    calls = [z_of(m, r, ">", power, f"{what} {r.z:.2f} at layer {r.layer}")
             for r in prof.itertuples()]
    against = [c for c in calls if c.verdict == CONTRADICTED]
    pick = against or [c for c in calls if c.verdict != SUPPORTED] or calls
    c = min(pick, key=lambda c: c.estimate)
    lo, hi = every_bounds(prof)
    return Call(m, all_of([x.verdict for x in calls]), c.estimate, lo, hi, c.note, c.extra)


def flagged_out(m: ModelInfo, df: pd.DataFrame, setting: str = PRIMARY) -> Call:
    """The call of a model with no usable z at ``setting``: every layer flagged ``k_rank``
    (k at or above the rank of the states) or no PGA rows at all: not testable, with why."""
    z = plain_rows(df, m.name, "pga_z", setting)
    if len(z) and "flag" in z.columns:
        n = texts_n(df, m.name)
        note = (f"every layer is flagged {NOT_MEANINGFUL}: k is at or above the rank of the "
                f"states{f' of n={n} texts' if n else ''}, so no z is meaningful (rerun with "
                "more texts, or leave --k out to fit it)")
    else:
        note = f"no PGA z rows at {setting}"
    return Call(m, NOT_TESTABLE, math.nan, math.nan, math.nan, note)


def collapse_of(prof: pd.DataFrame) -> CollapseProfile:
    """The collapse profile (:func:`~lmgeom.metrics.regime.collapse_profile`) of a z profile."""
    return collapse_profile(list(prof["layer"]), list(prof["z"]))


__all__ = [
    "GROWTH_MIN_LAYERS",
    "GROWTH_MIN_Z",
    "MIN_INTERVAL_POINTS",
    "NOT_MEANINGFUL",
    "N_BOOT",
    "PRIMARY",
    "Call",
    "all_of",
    "any_of",
    "bootstrap_ci",
    "collapse_of",
    "every_bounds",
    "every_z",
    "final_index",
    "flagged_out",
    "ladder_powers",
    "over_models",
    "plain_rows",
    "power_of",
    "spearman",
    "texts_n",
    "too_few_points",
    "z_of",
    "z_profile",
]
