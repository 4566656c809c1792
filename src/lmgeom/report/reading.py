"""Plain-language readings of a tidy results table, for the report's text.

Only rows of the table are selected, compared and formatted here (maxima, signs, runs of
layers); nothing is estimated. Sub-layer measurement points (``layer = "30.attn_out"``) and
model-level rows are ignored by the readings.

The PGA reading phrases the verdicts of :mod:`lmgeom.metrics.regime` (primary setting,
collapse zones, restoration), the same rules the sweep's regime rows come from, so the report
and the table say the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..metrics.regime import (
    MIN_RUN,
    STRONG_NEGATIVE_Z,
    CollapseZone,
    PgaFinding,
    natural_key,
    pga_findings,
)
from ..metrics.sample_size import describe_flag
from .plots import (
    SPECTRAL_METRICS,
    check_table,
    metric_label,
    run_label,
    runs_of,
    setting_label,
)

# --------------------------------------------------------------------------- formatting


def fmt_num(x: float | None) -> str:
    """Format a number for text and tables: 3 significant digits below 1, fewer decimals as
    the magnitude grows, scientific from 1e5; ``n/a`` for missing / non-finite."""
    if x is None:
        return "n/a"
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1e5:
        return f"{x:.2e}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a >= 1e-4:
        return f"{x:.3g}"
    return f"{x:.2e}"


def fmt_ci(value: float, low: float, high: float) -> str:
    """``value [low, high]`` when the interval is finite, else just the value."""
    if np.isfinite(low) and np.isfinite(high):
        return f"{fmt_num(value)} [{fmt_num(low)}, {fmt_num(high)}]"
    return fmt_num(value)


def layers_phrase(labels: list[str]) -> str:
    """``layer 5`` / ``layers 20–23`` (labels consecutive on the axis) / ``layers 3, 7 and 9``."""
    if not labels:
        return "no layers"
    if len(labels) == 1:
        return f"layer {labels[0]}"
    if len(labels) >= 3 and all(lab.isdigit() for lab in labels):
        nums = [int(lab) for lab in labels]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"layers {labels[0]}–{labels[-1]}"
    if len(labels) == 2:
        return f"layers {labels[0]} and {labels[1]}"
    return "layers " + ", ".join(labels[:-1]) + f" and {labels[-1]}"


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """Maximal runs of True in ``flags`` as (start, stop) index pairs, stop exclusive."""
    out, start = [], None
    for i, f in enumerate([*flags, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    return out


def _runs_phrase(labels: list[str], flags: list[bool]) -> str:
    parts = [layers_phrase(labels[a:b]).removeprefix("layers ").removeprefix("layer ")
             for a, b in _runs(flags)]
    n = sum(flags)
    if not parts:
        return "no layers"
    word = "layer" if n == 1 else "layers"
    return f"{word} " + ", ".join(parts)


# --------------------------------------------------------------------------- selection


def _base_rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per-layer rows of one metric at the plain layer points, finite values."""
    sel = (
        (df["metric"] == metric)
        & (df["layer_index"] >= 0)
        & ~df["layer"].astype(str).str.contains(".", regex=False)
        & np.isfinite(df["value"].astype(float))
    )
    return df.loc[sel]


def _curve(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per layer (the first of duplicates), in layer-axis order."""
    return rows.drop_duplicates("layer_index", keep="first").sort_values("layer_index")


def _settings(rows: pd.DataFrame) -> list[str]:
    return sorted(set(rows["setting"].astype(str)), key=natural_key)


def _final_index(curve: pd.DataFrame) -> int:
    """layer_index of the final point: the row labelled ``final``, else the last on the axis."""
    fin = curve.loc[curve["layer"] == "final", "layer_index"]
    return int(fin.iloc[0]) if len(fin) else int(curve["layer_index"].max())


# --------------------------------------------------------------------------- PGA


def _pct(a: float, b: float) -> str:
    return f"{100 * a / b:.0f} %" if b > 0 else "n/a"


def _zone_lines(f: PgaFinding, zone: CollapseZone, P: str) -> list[str]:
    """The sentences on one collapse zone and how the higher settings fare there."""
    n = len(zone.layers)
    lines = [(
        f"Collapse zone under {P}: {layers_phrase(list(zone.layers))} "
        f"({n} non-final layer{'s' if n > 1 else ''} "
        f"with z < 0 after the {P} peak of {fmt_num(f.primary_peak_z)} at layer "
        f"{f.primary_peak_layer}; lowest z = {fmt_num(zone.min_z)} at layer "
        f"{zone.min_layer})."
    )]
    parts = []
    for s, r in zone.restoration.items():
        S = setting_label(s)
        if r.have == 0:
            parts.append(f"{S} has no data there")
        elif r.complete:
            parts.append(f"{S} restores positive z in all {r.have} layers (lowest {fmt_num(r.min_z)})")
        elif r.restored == 0:
            parts.append(f"{S} does not restore it (z <= 0 in all {r.have} layers with data)")
        else:
            parts.append(f"{S} restores positive z in {r.restored} of {r.have} layers "
                         f"(still <= 0 at {layers_phrase(list(r.still_low))})")
    if parts:
        lines.append("In the collapse zone " + "; ".join(parts) + ".")
    elif not f.higher:
        lines.append("No higher CCR setting was run to check whether it restores "
                     "positive z there.")
    return lines


def _no_zone_lines(f: PgaFinding, P: str) -> list[str]:
    """The sentences for a run without a collapse zone."""
    rule = (f"rule: >= {MIN_RUN} consecutive non-final layers after the peak with z < 0, "
            f"or one with z < {fmt_num(STRONG_NEGATIVE_Z)}")
    if f.all_positive:
        lines = [f"No collapse zone: z is positive in every layer under {P}."]
    elif f.weak_negative:
        lines = [(f"No collapse zone under {P} ({rule}); isolated weak dip below 0 at "
                  f"{layers_phrase(list(f.weak_negative))}.")]
    else:
        lines = [(f"No collapse zone under {P}: z stays >= 0 in every non-final layer after "
                  f"the peak at layer {f.primary_peak_layer}.")]
    pos = [setting_label(s) for s, (zmin, _) in f.higher_min.items() if zmin > 0]
    if pos:
        lines.append(f"{' and '.join(pos)} keep{'s' if len(pos) == 1 else ''} z positive "
                     "in every non-final layer.")
    return lines


def _final_line(f: PgaFinding, final_z: float, P: str) -> str:
    """The sentence on the final layer, against the primary peak (and the zone)."""
    tail = ""
    if f.zones:
        tail = ("; it recovers from the collapse zone" if final_z > 0
                else "; it stays below 0 like the collapse zone")
    if f.primary_peak_z > 0 and final_z > 0:
        rel = (f"{_pct(final_z, f.primary_peak_z)} of the {P} peak of "
               f"{fmt_num(f.primary_peak_z)} at layer {f.primary_peak_layer}")
    else:
        rel = f"{P} peak {fmt_num(f.primary_peak_z)} at layer {f.primary_peak_layer}"
    return f"Final layer ({f.final_layer}): z = {fmt_num(final_z)} under {P} ({rel}){tail}."


def describe_pga(df: pd.DataFrame) -> list[str]:
    """Plain-language reading of the PGA z curve of every model × revision.

    Per model: where z is highest (layer, value, setting); whether there is a collapse zone
    under the primary setting and which layers; whether the higher CCR settings restore
    positive z there; how the final layer compares. The verdicts are those of
    :func:`lmgeom.metrics.regime.pga_findings`: the primary setting is ``ccr=1`` (else the
    smallest ``ccr>0``); a collapse zone is a run of >= 2 consecutive non-final layers after
    the primary peak with z < 0, or a single such layer with z < -2.

    Returns:
        Sentences, the first of each model starting with the model's name; ``[]`` when the table
        has no ``pga_z`` rows.
    """
    df = check_table(df)
    lines: list[str] = []
    flagged = _flagged_z(df)
    if flagged.any():  # a flagged z is never read as a finding, let alone the headline
        lines += _flagged_lines(df.loc[flagged])
        df = df.loc[~flagged]
    for f in pga_findings(df):
        P = setting_label(f.primary) or "the primary setting"
        lines.append(
            f"{run_label(f.model, f.revision)}: highest PGA z = {fmt_num(f.peak_z)} at layer "
            f"{f.peak_layer} ({setting_label(f.peak_setting) or 'no setting'})."
        )
        if f.zones:
            for zone in f.zones:
                lines += _zone_lines(f, zone, P)
        else:
            lines += _no_zone_lines(f, P)
        if f.final_z is not None:
            lines.append(_final_line(f, f.final_z, P))
    return lines

def _flagged_z(df: pd.DataFrame) -> pd.Series:
    """The ``pga_z`` rows computed under a flag (too few texts, k at or above the rank...)."""
    if "flag" not in df.columns:
        return pd.Series(False, index=df.index)
    return (df["metric"] == "pga_z") & (df["flag"].fillna("").astype(str) != "")


def _flagged_lines(rows: pd.DataFrame) -> list[str]:
    """One sentence per model × revision whose z values are flagged: which, where, and that
    the reading leaves them out."""
    out = []
    for (model, revision), g in rows.groupby(["model", "revision"], sort=False):
        codes = dict.fromkeys(c for f in g["flag"].astype(str) for c in f.split(";") if c)
        layers = list(dict.fromkeys(g.sort_values("layer_index")["layer"].astype(str)))
        meaning = "; ".join(f"{c}: {describe_flag(c)}" for c in codes)
        out.append(f"{run_label(model, revision)}: {len(g)} PGA z values are flagged LOW SAMPLE "
                   f"({meaning}) at layer(s) {_span(layers)}; they rest on too little data and "
                   "this reading leaves them out.")
    return out


def _span(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else (
        ", ".join(labels) if len(labels) <= 6 else f"{labels[0]}-{labels[-1]} ({len(labels)})")


def k_notes(manifest: Mapping[str, Any]) -> list[str]:
    """Sentences for each model whose readout dimension k was lowered to fit the texts (the
    manifest's ``k_note`` per model, or the run's): said in the Reading, before any z."""
    out = []
    models = manifest.get("models")
    for m in models if isinstance(models, list) else []:
        if isinstance(m, dict) and m.get("k_note"):
            out.append(f"{m.get('name', 'model')}: {m['k_note']}.")
    if manifest.get("k_note"):
        out.append(f"{manifest['k_note']}.")
    return out


# --------------------------------------------------------------------------- other sections


def _run_curves(df: pd.DataFrame, metric: str) -> list[tuple[str, str, str, pd.DataFrame]]:
    rows = _base_rows(df, metric)
    out = []
    for model, revision in runs_of(rows):
        run = rows.loc[(rows["model"] == model) & (rows["revision"] == revision)]
        for s in _settings(run):
            out.append((model, revision, s, _curve(run.loc[run["setting"] == s])))
    return out


def _who(model: str, revision: str, setting: str, multi: bool) -> str:
    bits = [run_label(model, revision)] if multi else []
    if setting:
        bits.append(setting_label(setting))
    return f" ({', '.join(bits)})" if bits else ""


def _is_multi(df: pd.DataFrame) -> bool:
    return len(runs_of(df.loc[df["layer_index"] >= 0])) > 1


def _extremes(c: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    return c.loc[c["value"].idxmin()], c.loc[c["value"].idxmax()]


def describe_pc1(df: pd.DataFrame) -> list[str]:
    """PC1 readout share: range over layers, layers below the k/d baseline, the collapse
    zone's share (when the PGA reading finds one), and PC1's explained-variance range."""
    df = check_table(df)
    multi = _is_multi(df)
    zones = {(f.model, f.revision): f for f in pga_findings(df)}
    lines = []
    for model, revision, s, c in _run_curves(df, "pc1_share"):
        lo, hi = _extremes(c)
        line = (f"PC1 readout share{_who(model, revision, s, multi)} ranges from "
                f"{fmt_num(lo['value'])} (layer {lo['layer']}) to {fmt_num(hi['value'])} "
                f"(layer {hi['layer']})")
        base = _base_rows(df, "pc1_baseline")
        base = base.loc[(base["model"] == model) & (base["revision"] == revision)]
        if base.empty:
            ml = df.loc[(df["metric"] == "pc1_baseline") & (df["model"] == model)
                        & (df["revision"] == revision) & np.isfinite(df["value"])]
            base = ml
        if len(base):
            b = base.set_index("layer")["value"] if (base["layer_index"] >= 0).all() else None
            if b is not None and len(b):
                b = b[~b.index.duplicated()]
                below = [bool(v < b.get(lab, math.nan)) for lab, v in zip(c["layer"], c["value"])]
                bval = float(b.iloc[0])
            else:
                bval = float(base["value"].iloc[0])
                below = [bool(v < bval) for v in c["value"]]
            line += f"; random baseline k/d = {fmt_num(bval)}"
            if any(below):
                line += (f"; below the baseline at "
                         f"{_runs_phrase([str(x) for x in c['layer']], below)}")
            else:
                line += "; above the baseline in every layer"
        lines.append(line + ".")
        f = zones.get((model, revision))
        if f is not None and f.zones:
            inz = c.loc[c["layer"].isin(f.zone_layers)]
            outz = c.loc[~c["layer"].isin(f.zone_layers)]
            if len(inz) and len(outz):
                lines.append(
                    f"In the PGA collapse zone the share is at most {fmt_num(inz['value'].max())}, "
                    f"against up to {fmt_num(outz['value'].max())} elsewhere."
                )
    for model, revision, s, c in _run_curves(df, "pc1_evr"):
        lo, hi = _extremes(c)
        lines.append(
            f"PC1 explains {fmt_num(lo['value'])} (layer {lo['layer']}) to {fmt_num(hi['value'])} "
            f"(layer {hi['layer']}) of the variance{_who(model, revision, s, multi)}."
        )
    return lines


def describe_spectral(df: pd.DataFrame) -> list[str]:
    """One line per spectral metric: lowest and highest layer, and the final layer's value."""
    df = check_table(df)
    multi = _is_multi(df)
    lines = []
    for metric in SPECTRAL_METRICS:
        for model, revision, s, c in _run_curves(df, metric):
            lo, hi = _extremes(c)
            fin = c.loc[c["layer_index"] == _final_index(c)].iloc[0]
            lines.append(
                f"{metric_label(metric)}{_who(model, revision, s, multi)}: lowest "
                f"{fmt_num(lo['value'])} at layer {lo['layer']}, highest {fmt_num(hi['value'])} at "
                f"layer {hi['layer']}, {fmt_num(fin['value'])} at layer {fin['layer']}."
            )
    return lines


def describe_logit_lens(df: pd.DataFrame) -> list[str]:
    """Where the logit lens's top-1 agreement first reaches 50 %, and the KL's range."""
    df = check_table(df)
    multi = _is_multi(df)
    lines = []
    for model, revision, s, c in _run_curves(df, "logit_lens_top1"):
        nonfinal = c.loc[c["layer_index"] != _final_index(c)]
        half = nonfinal.loc[nonfinal["value"] >= 0.5]
        _, hi = _extremes(nonfinal if len(nonfinal) else c)
        if len(half):
            first = half.iloc[0]
            lines.append(
                f"Logit-lens top-1 agreement{_who(model, revision, s, multi)} first reaches 50 % at "
                f"layer {first['layer']} ({fmt_num(first['value'])}); highest non-final "
                f"{fmt_num(hi['value'])} at layer {hi['layer']}."
            )
        else:
            lines.append(
                f"Logit-lens top-1 agreement{_who(model, revision, s, multi)} stays below 50 % in "
                f"every non-final layer (highest {fmt_num(hi['value'])} at layer {hi['layer']})."
            )
    for model, revision, s, c in _run_curves(df, "logit_lens_kl"):
        nonfinal = c.loc[c["layer_index"] != _final_index(c)]
        c2 = nonfinal if len(nonfinal) else c
        _, hi = _extremes(c2)
        lines.append(
            f"Logit-lens KL to the final distribution{_who(model, revision, s, multi)}: "
            f"{fmt_num(c2['value'].iloc[0])} at layer {c2['layer'].iloc[0]}, "
            f"{fmt_num(c2['value'].iloc[-1])} at layer {c2['layer'].iloc[-1]} (largest "
            f"{fmt_num(hi['value'])} at layer {hi['layer']})."
        )
    return lines


def describe_dispersion(df: pd.DataFrame) -> list[str]:
    """Dispersion's highest / lowest layer, and per correlation setting the strongest
    correlation with its CI and how many layers have a negative one."""
    df = check_table(df)
    multi = _is_multi(df)
    lines = []
    for model, revision, s, c in _run_curves(df, "dispersion"):
        lo, hi = _extremes(c)
        lines.append(
            f"Dispersion{_who(model, revision, s, multi)} is highest at layer {hi['layer']} "
            f"({fmt_num(hi['value'])}) and lowest at layer {lo['layer']} ({fmt_num(lo['value'])})."
        )
    for metric in ("corr_spearman", "corr_pearson"):
        for model, revision, s, c in _run_curves(df, metric):
            k = c["value"].abs().to_numpy().argmax()
            r = c.iloc[k]
            neg = int((c["value"] < 0).sum())
            lines.append(
                f"{metric_label(metric)} of dispersion and perplexity{_who(model, revision, s, multi)}: "
                f"strongest {fmt_ci(r['value'], r['ci_low'], r['ci_high'])} at layer {r['layer']}; "
                f"negative in {neg} of {len(c)} layers."
            )
    return lines


def describe_probes(df: pd.DataFrame) -> list[str]:
    """Best probe accuracy (with CI) vs the majority baseline, and where PGA z peaks."""
    df = check_table(df)
    multi = _is_multi(df)
    lines = []
    peaks = {(f.model, f.revision): f for f in pga_findings(df)}
    for model, revision, s, c in _run_curves(df, "probe_acc"):
        r = c.loc[c["value"].idxmax()]
        base = df.loc[(df["metric"] == "probe_baseline") & (df["model"] == model)
                      & (df["revision"] == revision) & (df["setting"] == s)
                      & np.isfinite(df["value"])]
        btxt = f" (majority baseline {fmt_num(base['value'].iloc[0])})" if len(base) else ""
        line = (f"Best probe accuracy{_who(model, revision, s, multi)}: "
                f"{fmt_ci(r['value'], r['ci_low'], r['ci_high'])} at layer {r['layer']}{btxt}")
        f = peaks.get((model, revision))
        if f is not None:
            line += (f"; PGA z ({setting_label(f.primary)}) peaks at layer "
                     f"{f.primary_peak_layer} among the non-final layers")
        lines.append(line + ".")
    return lines


def describe(df: pd.DataFrame) -> dict[str, list[str]]:
    """All readings by report section (``pga``, ``pc1``, ``spectral``, ``logit_lens``,
    ``dispersion``, ``probes``); a section without data maps to ``[]``."""
    return {
        "pga": describe_pga(df),
        "pc1": describe_pc1(df),
        "spectral": describe_spectral(df),
        "logit_lens": describe_logit_lens(df),
        "dispersion": describe_dispersion(df),
        "probes": describe_probes(df),
    }


__all__ = [
    "describe", "describe_dispersion", "describe_logit_lens", "describe_pc1", "describe_pga",
    "k_notes",
    "describe_probes", "describe_spectral", "fmt_ci", "fmt_num", "layers_phrase",
]
