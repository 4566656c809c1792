"""The verdict rules of the Subspace PGA paper's claims P1-P8 (``lmgeom claims``).

Each rule is a pure function of tidy results tables (:mod:`lmgeom.results.table` columns: the
``analyze`` layer table, the ``converge`` table, a width suite's ``sweep`` table) and the
models' :class:`~lmgeom.metrics.claims.ModelInfo`, returning one
:class:`~lmgeom.metrics.claims.ClaimVerdict`. The collapse-zone rule is
:mod:`lmgeom.metrics.regime`'s (one rule for the report, the sweep and these claims).

Confidence intervals, by kind (each row's ``reason`` says which):

* **z null** — a layer's PGA z against its own null: the interval ``[z - h, z - l]`` where
  ``l``, ``h`` are the null's 2.5 / 97.5 % points in z units (the ``null_z_low`` /
  ``null_z_high`` rows, 100 random frames). It lies above 0 exactly when z is above the null
  band (significantly positive), below 0 when z is below it. A claim about *every* layer of a
  set uses the lowest (or highest) bounds over the set.
* **bootstrap over layers** — a per-layer quantity averaged (or correlated) over a set of
  layers: a seeded percentile bootstrap that resamples the layers.
* **folds** — a probe accuracy: the t-interval over the cross-validation folds.

Every z-based decision goes through the power rule (:func:`lmgeom.metrics.claims.z_call`):
a z inside its null band, or a band wider than an effect of the papers' size at this n, gives
``underpowered`` with the n it would need, never supported or contradicted. Each rule takes
``powers`` (model name → :class:`~lmgeom.metrics.claims.Power`); without it the n comes from
the table (the ``n`` of the model's ``pc1_share`` rows) and the growth exponent is assumed.

Across models a claim is ``supported`` / ``contradicted`` when every model tested gives that
verdict; ``underpowered`` when the others agree and some need more texts; otherwise
``inconclusive`` (the evidence is split); per-model verdicts are in the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from .claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    SUPPORTED,
    UNDERPOWERED,
    ClaimVerdict,
    ModelInfo,
    Power,
    not_testable,
    verdict_from_interval,
    z_call,
)
from .claims_profile import (
    NOT_MEANINGFUL,
    Call,
    all_of,
    any_of,
    bootstrap_ci,
    collapse_of,
    every_z,
    final_index,
    flagged_out,
    over_models,
    plain_rows,
    power_of,
    spearman,
    too_few_points,
    z_of,
    z_profile,
)

#: P1 and the wide half of P8: "wide" models
WIDE_D = 2048
#: P2: "narrow" models
NARROW_D = 1024
#: P4: CCR-5/10 restoration
P4_D = 768
#: P5: |Spearman(z, spectral metric)| over the swing below this = "flat where PGA swings"
P5_MAX_RHO = 0.5
P5_METRICS = ("rankme", "alpha_req", "isoscore", "mean_cosine")
#: P5 / P8.wide: fewest layers a correlation over layers rests on
MIN_LAYERS = 5
#: P6: relative spread of the val loss across widths below this = "loss curves look alike"
P6_MAX_LOSS_SPREAD = 0.10
#: P7: the readout agreement's mean null z must exceed this
P7_MIN_Z = 1.96
#: P8: probe accuracy in the zone "stays high" = at least this share of the best layer's
P8_KEEP = 0.9
#: P8.wide: Spearman(probe accuracy, z) over layers above this = "follows z"
P8_MIN_RHO = 0.5

STATEMENTS: dict[str, str] = {
    "P1": "models with d >= 2048 keep PGA z significantly positive through the intermediate layers",
    "P2": "models with d <= 1024 have a collapse zone (z < 0) in late non-final layers and "
          "recover at the final layer",
    "P3": "in the collapse zone PC1's readout share falls below the random baseline k/d",
    "P4": "CCR-5 or CCR-10 restores positive z in every layer of models with d >= 768",
    "P5": "spectral metrics (RankMe, alpha-ReQ, IsoScore, mean cosine) stay flat where PGA z swings",
    "P6": "loss curves look alike across widths while the geometry reorganises (width suite)",
    "P7": "cross-model agreement of distances is higher in the readout spaces than in the full "
          "spaces and than in random spaces",
    "P8": "probe accuracy stays high in the collapse zone of narrow models (and follows z in "
          "wide ones)",
    "P8.wide": "probe accuracy follows PGA z across layers in models with d >= 2048",
    "P2.zone": "narrow models (d <= 1024) have a collapse zone: late layers with PGA z below "
               "its null band",
    "P2.recovery": "narrow models (d <= 1024) recover at the output: the final layer's PGA z "
                   "is above its null band",
    "P7.full": "cross-model agreement of distances is higher in the readout spaces than in the "
               "full spaces",
    "P7.random": "cross-model agreement of distances is higher in the readout spaces than in "
                 "random spaces of the same size",
}

#: the claims whose statement joins two conditions, and their parts (each part is decided on
#: its own, with its own estimate and interval; the claim is both parts together)
PARTS = {"P2": ("P2.zone", "P2.recovery"), "P7": ("P7.full", "P7.random")}

CI_Z = "CI: z null (z minus the null's 97.5/2.5 % points)"
CI_LAYERS = "CI: bootstrap over layers"
CI_FOLDS = "CI: t-interval over CV folds"


# --------------------------------------------------------------------------- helpers


def _claim(claim: str, calls: Sequence[Call], *, quantity: str, threshold: float,
           direction: str, ci: str, seed: int | None = None, prefix: str = "",
           statement: str | None = None) -> ClaimVerdict:
    """The claim's row from its per-model calls: the verdict over models, the estimate and
    CI of the model with the weakest support (lowest margin on the claim's side)."""
    sign = 1.0 if direction == ">" else -1.0

    def margin(c: Call) -> float:
        edge = c.ci_low if direction == ">" else c.ci_high
        v = sign * (edge - threshold)
        return v if math.isfinite(v) else -math.inf

    finite = [c for c in calls if math.isfinite(c.ci_low) and math.isfinite(c.ci_high)]
    weakest = min(finite or calls, key=margin)
    verdict = over_models([c.verdict for c in calls])
    per = "; ".join(f"{c.model.name} (d={c.model.d}): {c.verdict} — {c.note}" for c in calls)
    split = " (evidence split across models)" if (
        verdict == INCONCLUSIVE and len({c.verdict for c in calls}) > 1) else ""
    # the power numbers of the call the verdict turns on: an underpowered model's (the n
    # it needs) when the verdict is underpowered, else the weakest model's
    under = [c for c in calls if c.verdict == UNDERPOWERED]
    key = max(under, key=lambda c: c.extra.get("n_needed", math.nan)
              if math.isfinite(c.extra.get("n_needed", math.nan)) else math.inf) \
        if verdict == UNDERPOWERED and under else weakest
    nums = {f: float(key.extra.get(f, math.nan))
            for f in ("band_half_width", "min_effect_z", "n_needed")}
    ns = [float(c.extra["n"]) for c in calls if "n" in c.extra]
    return ClaimVerdict(
        claim=claim, statement=statement or STATEMENTS[claim], verdict=verdict,
        reason=f"{prefix}{per}{split}; {ci}", quantity=quantity,
        estimate=weakest.estimate, ci_low=weakest.ci_low, ci_high=weakest.ci_high,
        threshold=threshold, direction=direction, models=tuple(c.model for c in calls),
        seed=seed, details={c.model.name: {"verdict": c.verdict, "estimate": c.estimate,
                                           "ci": [c.ci_low, c.ci_high], "note": c.note, **c.extra}
                            for c in calls},
        n=min(ns) if ns else math.nan, **nums)


def _widest(infos: Sequence[ModelInfo], what: str = "widest") -> str:
    if not infos:
        return "no model was measured"
    w = (max if what == "widest" else min)(infos, key=lambda m: m.d)
    return f"the {what} model here has d = {w.d} ({w.name})"


# --------------------------------------------------------------------------- P1, P2, P4


def p1_wide_stay_positive(df: pd.DataFrame, infos: Sequence[ModelInfo], *,
                          powers: Mapping[str, Power] | None = None) -> ClaimVerdict:
    """P1: in every model with d >= 2048, z (CCR-1) is above its null band at every
    intermediate layer (1 .. L-1: no embedding, no last block, no final point)."""
    wide = [m for m in infos if m.d >= WIDE_D]
    if not wide:
        return not_testable("P1", STATEMENTS["P1"], f"needs d >= {WIDE_D}; {_widest(infos)}",
                            models=tuple(infos), quantity="min z over intermediate layers")
    calls = []
    for m in wide:
        prof = z_profile(df, m.name)
        if prof.empty:
            calls.append(flagged_out(m, df))
            continue
        last = m.n_layers or final_index(prof) - 1
        mid = prof[(prof["layer_index"] >= 1) & (prof["layer_index"] <= last - 1)]
        if mid.empty:
            calls.append(Call(m, INCONCLUSIVE, math.nan, math.nan, math.nan,
                              "no intermediate-layer z"))
            continue
        calls.append(every_z(m, mid, power_of(df, m, powers), "min z"))
    return _claim("P1", calls, quantity="min CCR-1 z over intermediate layers", threshold=0.0,
                  direction=">", ci=CI_Z)


def _p2_call(m: ModelInfo, prof: pd.DataFrame, power: Power | None) -> Call:
    """One model's P2 call (both parts together; see :func:`_p2_parts`)."""
    return _p2_parts(m, prof, power)[0]


def _p2_parts(m: ModelInfo, prof: pd.DataFrame, power: Power | None
              ) -> tuple[Call, Call, Call]:
    """One model's P2 as ``(both, zone, recovery)``: ``zone`` decides "a collapse zone whose
    lowest z is below its null band" (estimate: that z), ``recovery`` "the final layer's z
    above its null band" (estimate: the final z), ``both`` their conjunction with the zone's
    estimate."""
    f = collapse_of(prof)
    fin = prof[prof["layer"] == (f.final_layer or "")]
    if fin.empty:
        rec = Call(m, INCONCLUSIVE, math.nan, math.nan, math.nan, "no final layer")
    else:
        q = fin.iloc[0]
        fc = z_of(m, q, ">", power, "final")
        rec = replace(fc, note=f"final z {q.z:.2f} ("
                      + ("recovers above its band" if fc.verdict == SUPPORTED else fc.verdict)
                      + ")" + (f"; {fc.note.split('; ', 1)[1]}" if "; " in fc.note else ""))
    if not f.zones:
        after = prof[prof["layer"].isin(f.after)]
        if after.empty:
            peak = prof[prof["layer"] == f.peak_layer].iloc[0]
            c = z_of(m, peak, ">", power, f"no collapse zone (peak z {f.peak_z:.2f} at the last "
                     f"non-final layer {f.peak_layer})")
            c = replace(c, verdict=UNDERPOWERED if c.verdict == UNDERPOWERED else CONTRADICTED,
                        estimate=math.nan, ci_low=math.nan, ci_high=math.nan)
            return c, c, rec
        k = int(after["z"].to_numpy().argmin())
        c = z_of(m, after.iloc[k], "<", power, f"no collapse zone: lowest z after the peak "
                 f"{after['z'].iloc[k]:.2f} at layer {after['layer'].iloc[k]}")
        if c.verdict == SUPPORTED:  # below its band, but too short for the zone rule
            c = replace(c, verdict=INCONCLUSIVE, note=c.note + " (below its band, but "
                        "shorter than the zone rule asks)")
        return c, c, rec
    worst = min(f.zones, key=lambda zn: zn.min_z)
    r = prof[prof["layer"] == worst.min_layer].iloc[0]
    zone = z_of(m, r, "<", power, "zone")
    zones = ", ".join(f"{zn.layers[0]}-{zn.layers[-1]}" if len(zn.layers) > 1 else zn.layers[0]
                      for zn in f.zones)
    why = zone.note.split("; ", 1)[1] if "; " in zone.note else ""
    extra = {"zone_layers": [list(zn.layers) for zn in f.zones], **zone.extra}
    zone_note = (f"collapse zone {zones} (min z {r.z:.2f} at layer {r.layer}, {zone.verdict}"
                 + (f": {why}" if why else "") + ")")
    both = Call(m, all_of([zone.verdict, rec.verdict]), float(r.z), zone.ci_low, zone.ci_high,
                f"{zone_note}; {rec.note}", extra)
    return both, replace(zone, note=zone_note, extra=extra), rec


def p2_narrow_collapse(df: pd.DataFrame, infos: Sequence[ModelInfo], *,
                       powers: Mapping[str, Power] | None = None) -> ClaimVerdict:
    """P2: every model with d <= 1024 has a collapse zone (the regime rule on CCR-1 z) whose
    lowest z is below its null band, and a final-layer z above its null band (both parts:
    :func:`p2_parts`)."""
    return p2_parts(df, infos, powers=powers)[0]


def p2_parts(df: pd.DataFrame, infos: Sequence[ModelInfo], *,
             powers: Mapping[str, Power] | None = None) -> list[ClaimVerdict]:
    """``[P2, P2.zone, P2.recovery]``: the claim joins two conditions, so each is decided on
    its own (its own estimate, interval and verdict) and P2's reason says which part decided
    it. P2.zone: the lowest CCR-1 z of the zone below its band; P2.recovery: the final z above
    its band."""
    narrow = [m for m in infos if m.d <= NARROW_D]
    qty = {"P2": "min CCR-1 z in the collapse zone", "P2.zone": "min CCR-1 z in the collapse zone",
           "P2.recovery": "CCR-1 z at the final layer"}
    if not narrow:
        why = f"needs d <= {NARROW_D}; {_widest(infos, 'narrowest')}"
        return [not_testable(c, STATEMENTS[c], why, models=tuple(infos), quantity=qty[c])
                for c in ("P2", "P2.zone", "P2.recovery")]
    parts: list[tuple[Call, Call, Call]] = []
    for m in narrow:
        prof = z_profile(df, m.name)
        if prof.empty:
            c = flagged_out(m, df)
            parts.append((c, c, c))
        else:
            parts.append(_p2_parts(m, prof, power_of(df, m, powers)))
    zone = _claim("P2.zone", [p[1] for p in parts], quantity=qty["P2.zone"], threshold=0.0,
                  direction="<", ci=CI_Z)
    rec = _claim("P2.recovery", [p[2] for p in parts], quantity=qty["P2.recovery"],
                 threshold=0.0, direction=">", ci=CI_Z)
    decided = [c.claim for c in (zone, rec) if c.verdict != SUPPORTED]
    which = (f"decided by {' and '.join(decided)} (P2.zone {zone.verdict}, P2.recovery "
             f"{rec.verdict}); " if decided else "both parts supported; ")
    both = _claim("P2", [p[0] for p in parts], quantity=qty["P2"], threshold=0.0,
                  direction="<", ci=CI_Z + "; the final layer must be above its band",
                  prefix=which)
    return [both, zone, rec]


def p4_ccr_restores(df: pd.DataFrame, infos: Sequence[ModelInfo],
                    levels: Sequence[int] = (5, 10), *,
                    powers: Mapping[str, Power] | None = None) -> ClaimVerdict:
    """P4: for every model with d >= 768, at CCR-5 or at CCR-10, z is above its null band at
    every layer (0 .. L and final). The paper: "removing the top few principal components
    (CCR-5 or CCR-10) restores positive z in all layers": one of the two levels restoring
    every layer supports it for that model (:func:`any_of`); both failing contradicts it.
    The estimate is the better level's lowest z."""
    wide = [m for m in infos if m.d >= P4_D]
    if not wide:
        return not_testable("P4", STATEMENTS["P4"], f"needs d >= {P4_D}; {_widest(infos)}",
                            models=tuple(infos),
                            quantity="min z over all layers at the better of CCR-5/10")
    calls = []
    for m in wide:
        parts: list[tuple[int, Call]] = []
        power = power_of(df, m, powers)
        for lev in levels:
            prof = z_profile(df, m.name, f"ccr={lev}")
            if not prof.empty:
                parts.append((lev, every_z(m, prof, power, "min z")))
        if not parts:
            has_rows = any(len(plain_rows(df, m.name, "pga_z", f"ccr={lev}")) for lev in levels)
            calls.append(flagged_out(m, df, f"ccr={levels[-1]}") if has_rows else
                         Call(m, INCONCLUSIVE, math.nan, math.nan, math.nan,
                              "no CCR-5/10 rows (run with --ccr 0,1,5,10)"))
            continue
        w = max(parts, key=lambda t: t[1].ci_low)[1]
        note = "; ".join(f"CCR-{lev}: {c.note} ({c.verdict})" for lev, c in parts)
        calls.append(Call(m, any_of([c.verdict for _, c in parts]), w.estimate, w.ci_low,
                          w.ci_high, note, w.extra))
    return _claim("P4", calls, quantity="min z over all layers at the better of CCR-5/10",
                  threshold=0.0,
                  direction=">", ci=CI_Z)


# --------------------------------------------------------------------------- P3, P5, P8


def zone_of(df: pd.DataFrame, m: ModelInfo, powers: Mapping[str, Power] | None = None
            ) -> tuple[list[str], Call | None]:
    """A model's collapse zone as P3 / P8 use it: its layers when the zone rule finds one and
    its lowest z is decided below the null band; else ``[]`` and, when this n cannot tell
    whether there is a zone (or no z is usable), the call that says so."""
    prof = z_profile(df, m.name)
    if prof.empty:
        return [], flagged_out(m, df)
    if len(prof) < 2:
        return [], None
    power = power_of(df, m, powers)
    f = collapse_of(prof)
    if f.zones:
        worst = min(f.zones, key=lambda zn: zn.min_z)
        c = z_of(m, prof[prof["layer"] == worst.min_layer].iloc[0], "<", power,
                 f"zone min z {worst.min_z:.2f} at layer {worst.min_layer}")
        if c.verdict == SUPPORTED:
            return [lab for zn in f.zones for lab in zn.layers], None
    else:
        c = _p2_call(m, prof, power)
    if c.verdict == UNDERPOWERED:
        return [], replace(c, estimate=math.nan, ci_low=math.nan, ci_high=math.nan,
                           note=f"no collapse zone resolved at this n ({c.note})")
    return [], None


def p3_pc1_leaves_readout(df: pd.DataFrame, infos: Sequence[ModelInfo], *, seed: int = 0,
                          powers: Mapping[str, Power] | None = None) -> ClaimVerdict:
    """P3: in each model's collapse zone, the mean over the zone's layers of PC1's readout
    share divided by its random baseline k/d is below 1 (bootstrap over the zone's layers)."""
    calls = []
    for m in infos:
        zone, pending = zone_of(df, m, powers)
        if not zone:
            if pending is not None:
                calls.append(pending)
            continue
        share = plain_rows(df, m.name, "pc1_share").set_index("layer")["value"]
        base = plain_rows(df, m.name, "pc1_baseline").set_index("layer")["value"]
        have = [lab for lab in zone if lab in share.index and lab in base.index]
        if not have:
            calls.append(Call(m, INCONCLUSIVE, math.nan, math.nan, math.nan, "no PC1 rows"))
            continue
        ratio = np.array([share[lab] / base[lab] for lab in have], dtype=float)
        lo, hi = bootstrap_ci(ratio, np.mean, seed=seed)
        few = too_few_points(len(have), "zone layers")
        calls.append(Call(m, verdict_from_interval(lo, hi, 1.0, "<"), float(ratio.mean()), lo, hi,
                          f"share/baseline {ratio.mean():.2f} over zone layers "
                          f"{have[0]}-{have[-1]} ({len(have)} layers)"
                          + (f"; {few}" if few else "")))
    if not calls:
        return not_testable("P3", STATEMENTS["P3"], "no model here has a collapse zone (see P2), "
                            "so there is no zone to look at", models=tuple(infos),
                            quantity="PC1 readout share / (k/d) in the zone")
    return _claim("P3", calls, quantity="mean PC1 readout share / (k/d) over the collapse zone",
                  threshold=1.0, direction="<", ci=CI_LAYERS + f" (seed {seed})", seed=seed)


def _swing(prof: pd.DataFrame) -> pd.DataFrame:
    """The non-final layers from the z peak on (all non-final ones when fewer than
    :data:`MIN_LAYERS`)."""
    if prof.empty:
        return prof
    nf = prof[prof["layer_index"] != final_index(prof)]
    if nf.empty:
        return nf
    peak = int(nf["z"].to_numpy().argmax())
    after = nf.iloc[peak:]
    return after if len(after) >= MIN_LAYERS else nf


def p5_spectral_flat(df: pd.DataFrame, infos: Sequence[ModelInfo], *, seed: int = 0,
                     powers: Mapping[str, Power] | None = None) -> ClaimVerdict:
    """P5: over the layers where z swings (from its peak on), no spectral metric follows z:
    max over metrics of |Spearman(z, metric)| across those layers is below 0.5 (bootstrap
    over layers). A model whose z does not swing beyond its null band is inconclusive."""
    calls = []
    for m in infos:
        prof = z_profile(df, m.name)
        if prof.empty:
            calls.append(flagged_out(m, df))
            continue
        win = _swing(prof)
        if len(win) < MIN_LAYERS:
            calls.append(Call(m, INCONCLUSIVE, math.nan, math.nan, math.nan,
                              f"fewer than {MIN_LAYERS} layers"))
            continue
        mets = {}
        for name in P5_METRICS:
            s = plain_rows(df, m.name, name).set_index("layer_index")["value"]
            if set(win["layer_index"]) <= set(s.index):
                mets[name] = s.loc[list(win["layer_index"])].to_numpy(dtype=float)
        if not mets:
            calls.append(Call(m, INCONCLUSIVE, math.nan, math.nan, math.nan, "no spectral rows"))
            continue
        z = win["z"].to_numpy(dtype=float)
        rows = np.column_stack([z, *mets.values()])

        def stat(r: np.ndarray) -> float:
            # a constant metric (or a constant resampled z) does not follow z: |rho| = 0
            vals = [abs(spearman(r[:, 0], r[:, j])) for j in range(1, r.shape[1])]
            return max(v if math.isfinite(v) else 0.0 for v in vals)

        est = stat(rows)
        lo, hi = bootstrap_ci(rows, stat, seed=seed)
        band = float((win["hi"] - win["lo"]).mean())
        swing = float(z.max() - z.min())
        rhos = ", ".join(f"{n} {spearman(z, v):+.2f}" for n, v in mets.items())
        power = power_of(df, m, powers)
        if power is not None and not power.reference_visible(band / 2):
            _, why, nums = z_call(float(z[0]), float(win["lo"].mean()),
                                  float(win["hi"].mean()), ">", power)
            calls.append(Call(m, UNDERPOWERED, est, lo, hi, f"z swings {swing:.2f}; {why}; "
                              f"rho: {rhos}", {**nums, "n": float(power.n)}))
            continue
        if not swing > band:  # the swing the claim is about is not resolved at this n
            need = power.n_to_clear(swing, band) if power is not None else math.nan
            extra = {"band_half_width": band / 2, "n_needed": need}
            if power is not None:
                extra |= {"n": float(power.n), "min_effect_z": power.scale(band / 2, 256)}
            calls.append(Call(m, UNDERPOWERED if power is not None else INCONCLUSIVE, est, lo,
                              hi, f"z swings only {swing:.2f} (null band {band:.2f})"
                              + (f"; needs n ≈ {need:.0f} ({power.describe()})"
                                 if power is not None and math.isfinite(need) else "")
                              + f"; rho: {rhos}", extra))
            continue
        calls.append(Call(m, verdict_from_interval(lo, hi, P5_MAX_RHO, "<"), est, lo, hi,
                          f"z swings {swing:.2f} over layers {win['layer'].iloc[0]}-"
                          f"{win['layer'].iloc[-1]}; Spearman with z: {rhos}"))
    if not calls:
        return not_testable("P5", STATEMENTS["P5"], "no model measured", quantity="")
    return _claim("P5", calls, quantity="max |Spearman(z, spectral metric)| over the z swing",
                  threshold=P5_MAX_RHO, direction="<", ci=CI_LAYERS + f" (seed {seed})",
                  seed=seed)


def p8_probes(df: pd.DataFrame, infos: Sequence[ModelInfo], *, seed: int = 0,
              powers: Mapping[str, Power] | None = None) -> list[ClaimVerdict]:
    """P8 (narrow half) and P8.wide.

    P8: in each model's collapse zone the lowest probe accuracy is at least 0.9 × the best
    non-final layer's (CI: folds). P8.wide: in models with d >= 2048, Spearman(probe
    accuracy, CCR-1 z) over the non-final layers is above 0.5 (bootstrap over layers)."""
    has = (df["metric"] == "probe_acc").any()
    why = "needs labelled texts (the linear probes); none here"
    narrow, wide = [], []
    for m in infos:
        acc = plain_rows(df, m.name, "probe_acc")
        if acc.empty:
            continue
        prof = z_profile(df, m.name)
        fi = final_index(prof) if len(prof) else -1
        nf = acc[acc["layer_index"] != fi]
        best = float(nf["value"].max()) if not nf.empty else math.nan
        zone, pending = zone_of(df, m, powers)
        if pending is not None and m.d <= NARROW_D and pending.verdict == UNDERPOWERED:
            narrow.append(replace(pending, extra={**pending.extra, "threshold": math.nan}))
        if zone and m.d <= NARROW_D:
            za = acc[acc["layer"].astype(str).isin(zone)]
            if not za.empty:
                r = za.loc[za["value"].astype(float).idxmin()]
                lo = float(r.ci_low) if math.isfinite(float(r.ci_low)) else float(r.value)
                hi = float(r.ci_high) if math.isfinite(float(r.ci_high)) else float(r.value)
                thr = P8_KEEP * best
                narrow.append(Call(m, verdict_from_interval(lo, hi, thr, ">"), float(r.value),
                                   lo, hi, f"lowest zone accuracy {r.value:.3f} at layer {r.layer}"
                                   f" vs {P8_KEEP} x best {best:.3f} = {thr:.3f}",
                                   {"threshold": thr}))
        if m.d >= WIDE_D:
            both = nf.merge(prof[["layer_index", "z"]], on="layer_index")
            pairs = both[["value", "z"]].to_numpy(dtype=float)
            if len(pairs) < MIN_LAYERS:
                continue
            st = (lambda r: spearman(r[:, 0], r[:, 1]))
            est = st(pairs)
            lo, hi = bootstrap_ci(pairs, st, seed=seed)
            wide.append(Call(m, verdict_from_interval(lo, hi, P8_MIN_RHO, ">"), est, lo, hi,
                             f"Spearman(probe accuracy, z) {est:.2f} over {len(pairs)} layers"))
    out = []
    if narrow:
        # the threshold differs per model (0.9 x its best): the row shows the weakest model's
        decided = [c for c in narrow if math.isfinite(c.extra["threshold"])]
        weakest = (min(decided, key=lambda c: c.ci_low - c.extra["threshold"]) if decided
                   else narrow[0])
        v = _claim("P8", narrow, quantity="lowest probe accuracy in the collapse zone",
                   threshold=weakest.extra["threshold"], direction=">", ci=CI_FOLDS,
                   prefix=f"narrow half only (the wide half is P8.wide); threshold {P8_KEEP} x "
                          "each model's best non-final layer; ")
        out.append(replace(v, threshold=weakest.extra["threshold"]))
    else:
        reason = why if not has else "no model with d <= 1024 here has a collapse zone (P2)"
        out.append(not_testable("P8", STATEMENTS["P8"], reason, models=tuple(infos)))
    if wide:
        out.append(_claim("P8.wide", wide, quantity="Spearman(probe accuracy, z) over layers",
                          threshold=P8_MIN_RHO, direction=">", ci=CI_LAYERS + f" (seed {seed})",
                          seed=seed))
    else:
        reason = (f"needs d >= {WIDE_D}; {_widest(infos)}" if has or not infos else why)
        out.append(not_testable("P8.wide", STATEMENTS["P8.wide"], reason, models=tuple(infos)))
    return out


# --------------------------------------------------------------------------- P6, P7


def p6_width_suite(sweep: pd.DataFrame | None, infos: Sequence[ModelInfo] = (),
                   *, reason: str = "") -> ClaimVerdict:
    """P6 on a width suite's sweep table (``val_loss`` and ``pga_z`` rows per width label ×
    step revision): the loss curves look alike when the relative spread of the val loss
    across widths, ``(max - min) / mean``, stays below 0.10 at every step all widths share
    from the second half of training on (CI: the range of that spread over those steps);
    the geometry reorganises when the widths' CCR-1 regimes (collapse zone or none, at the
    last checkpoint) differ, or their lowest non-final z differ by more than the null band.
    Both halves must hold."""
    q = "relative spread of val loss across widths"
    if sweep is None or sweep.empty:
        return not_testable("P6", STATEMENTS["P6"], reason or "needs a trained width suite "
                            "(--suite DIR from `lmgeom suite train`); none given",
                            models=tuple(infos), quantity=q)
    loss = sweep[sweep["metric"] == "val_loss"][["model", "revision", "value"]]
    widths = sorted(set(loss["model"].astype(str)))
    if len(widths) < 2:
        return not_testable("P6", STATEMENTS["P6"], "needs at least two widths with val loss in "
                            "the suite", models=tuple(infos), quantity=q)
    wide = loss.pivot_table(index="revision", columns="model", values="value").dropna()
    wide = wide.loc[sorted(wide.index, key=_step)]
    if wide.empty:
        return not_testable("P6", STATEMENTS["P6"], "the widths share no checkpoint step",
                            models=tuple(infos), quantity=q)
    late = wide.iloc[len(wide) // 2:]
    spread = ((late.max(axis=1) - late.min(axis=1)) / late.mean(axis=1)).to_numpy(dtype=float)
    v_loss = verdict_from_interval(float(spread.min()), float(spread.max()),
                                   P6_MAX_LOSS_SPREAD, "<")
    last = str(wide.index[-1])
    regimes, mins, bands = {}, {}, []
    for w in widths:
        prof = z_profile(sweep[sweep["revision"].astype(str) == last], w)
        if len(prof) < 2:
            continue
        f = collapse_of(prof)
        nf = prof[prof["layer_index"] != final_index(prof)]
        regimes[w] = "detour" if f.zones else "direct"
        mins[w] = float(nf["z"].min())
        bands.append(float((nf["hi"] - nf["lo"]).mean()))
    if len(regimes) < 2:
        v_geo, geo = INCONCLUSIVE, "fewer than two widths with a z profile at the last step"
    else:
        rng = max(mins.values()) - min(mins.values())
        band = float(np.mean(bands))
        v_geo = (SUPPORTED if len(set(regimes.values())) > 1 or rng > band
                 else CONTRADICTED)
        geo = (f"at {last}: regimes " + ", ".join(f"{w} {r}" for w, r in regimes.items())
               + f"; lowest z range {rng:.2f} vs null band {band:.2f}")
    verdict = all_of([v_loss, v_geo])
    return ClaimVerdict(
        claim="P6", statement=STATEMENTS["P6"], verdict=verdict,
        reason=(f"loss: spread {spread.min():.3f}-{spread.max():.3f} over {len(late)} late steps "
                f"({v_loss}); geometry: {geo} ({v_geo}); CI: range over the late checkpoints"),
        quantity=q, estimate=float(spread[-1]), ci_low=float(spread.min()),
        ci_high=float(spread.max()), threshold=P6_MAX_LOSS_SPREAD, direction="<",
        models=tuple(infos), details={"regimes": regimes, "min_z": mins,
                                      "loss_verdict": v_loss, "geometry_verdict": v_geo})


def _step(revision: str) -> int:
    digits = "".join(c for c in str(revision) if c.isdigit())
    return int(digits) if digits else 0


def p7_convergence(conv: pd.DataFrame | None, infos: Sequence[ModelInfo], *, seed: int = 0
                   ) -> ClaimVerdict:
    """P7 on a ``converge`` table: over every model pair's matched layers, the mean of
    ``conv_readout - conv_full`` is above 0 and the mean null z of ``conv_readout`` is above
    1.96 (both with a bootstrap over the matched layer pairs); both must hold (the parts:
    :func:`p7_parts`). Pairs flagged ``k_rank`` are left out."""
    return p7_parts(conv, infos, seed=seed)[0]


def p7_parts(conv: pd.DataFrame | None, infos: Sequence[ModelInfo], *, seed: int = 0
             ) -> list[ClaimVerdict]:
    """``[P7, P7.full, P7.random]``: P7 joins two conditions, each decided on its own (its own
    estimate and interval): P7.full, readout minus full agreement above 0; P7.random, the mean
    z of the readout agreement against random k-frames above 1.96. P7's row keeps P7.full's
    estimate and its reason says which part decided it."""
    q = "mean Spearman(D_A, D_B) readout minus full over matched layers"
    q_z = "mean z of Spearman(D_A, D_B) readout vs random k-frames over matched layers"
    if conv is None or conv.empty or len(infos) < 2:
        why = "needs at least two models on the same texts"
        return [not_testable(c, STATEMENTS[c], why, models=tuple(infos), quantity=qq)
                for c, qq in (("P7", q), ("P7.full", q), ("P7.random", q_z))]
    if "flag" in conv.columns:  # layer pairs where z is not meaningful (k_rank): no evidence
        conv = conv[~conv["flag"].astype(str).str.contains(NOT_MEANINGFUL, regex=False)]
    wide = conv.pivot_table(index=["model", "layer_index", "setting"], columns="metric",
                            values="value", aggfunc="first").reset_index()
    needed = ["conv_full", "conv_readout", "conv_z"]
    wide = wide.dropna(subset=needed) if set(needed) <= set(wide.columns) else wide.iloc[:0]
    if wide.empty:
        why = "no finite convergence rows"
        return [not_testable(c, STATEMENTS[c], why, quantity=qq, models=tuple(infos))
                for c, qq in (("P7", q), ("P7.full", q), ("P7.random", q_z))]
    diff = (wide["conv_readout"] - wide["conv_full"]).to_numpy(dtype=float)
    z = wide["conv_z"].to_numpy(dtype=float)
    lo_d, hi_d = bootstrap_ci(diff, np.mean, seed=seed)
    lo_z, hi_z = bootstrap_ci(z, np.mean, seed=seed)
    v_full = verdict_from_interval(lo_d, hi_d, 0.0, ">")
    v_null = verdict_from_interval(lo_z, hi_z, P7_MIN_Z, ">")
    n_pairs = wide[["model", "setting"]].assign(
        vs=wide["setting"].astype(str).str.extract(r"vs=([^;]*)")[0])[["model", "vs"]]
    n_pairs = len(n_pairs.drop_duplicates())
    few = (f"; {too_few_points(len(diff), 'layer pairs')}" if too_few_points(len(diff)) else "")
    over = f"{len(diff)} matched layer pairs over {n_pairs} model pairs"
    part_full = (f"readout - full {diff.mean():+.3f} [{lo_d:+.3f}, {hi_d:+.3f}] ({v_full})")
    part_null = (f"readout vs random k-frames mean z {z.mean():.2f} [{lo_z:.2f}, {hi_z:.2f}] vs "
                 f"{P7_MIN_Z} ({v_null})")
    verdict = all_of([v_full, v_null])
    decided = [c for c, v in (("P7.full", v_full), ("P7.random", v_null)) if v != SUPPORTED]
    which = (f"decided by {' and '.join(decided)}; " if decided and verdict != SUPPORTED
             else "both parts supported; " if verdict == SUPPORTED else "")
    common = {"models": tuple(infos), "seed": seed, "direction": ">"}
    both = ClaimVerdict(
        claim="P7", statement=STATEMENTS["P7"], verdict=verdict,
        reason=f"{which}{over}: {part_full}; {part_null}; {CI_LAYERS} (seed {seed}){few}",
        quantity=q, estimate=float(diff.mean()), ci_low=lo_d, ci_high=hi_d, threshold=0.0,
        details={"mean_z": float(z.mean()), "z_ci": [lo_z, hi_z], "full_verdict": v_full,
                 "null_verdict": v_null, "n_layer_pairs": int(len(diff))}, **common)
    full = ClaimVerdict(
        claim="P7.full", statement=STATEMENTS["P7.full"], verdict=v_full,
        reason=f"{over}: {part_full}; {CI_LAYERS} (seed {seed}){few}", quantity=q,
        estimate=float(diff.mean()), ci_low=lo_d, ci_high=hi_d, threshold=0.0,
        details={"n_layer_pairs": int(len(diff))}, **common)
    rand = ClaimVerdict(
        claim="P7.random", statement=STATEMENTS["P7.random"], verdict=v_null,
        reason=f"{over}: {part_null}; {CI_LAYERS} (seed {seed}){few}", quantity=q_z,
        estimate=float(z.mean()), ci_low=lo_z, ci_high=hi_z, threshold=P7_MIN_Z,
        details={"n_layer_pairs": int(len(diff))}, **common)
    return [both, full, rand]


__all__ = [
    "NARROW_D", "P4_D", "PARTS", "STATEMENTS", "WIDE_D", "p1_wide_stay_positive",
    "p2_narrow_collapse", "p2_parts",
    "p3_pc1_leaves_readout", "p4_ccr_restores", "p5_spectral_flat", "p6_width_suite",
    "p7_convergence", "p7_parts", "p8_probes", "zone_of",
]
