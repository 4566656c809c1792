"""The ``lmgeom claims`` page: the verdict table, the reasons, and PGA z against relative depth
(one curve per model). Phrasing only: every verdict comes from :mod:`lmgeom.metrics`
(``claims_pga`` / ``claims_dispersion``) through the claims table.

Stable hooks: the verdict table is ``<table id="table-claims">`` with one ``<tr>`` per claim in
its ``<tbody>`` (``data-claim`` and ``data-verdict`` attributes); the figure section is
``<section id="section-z-depth">``.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._io import write_text
from ..metrics.claims import VERDICTS, ModelInfo
from .html import REPORT_NAME, esc
from .plots import literal_text, save_figure

PLOTS_DIR = "plots"
Z_DEPTH_STEM = "claims-z-depth"

_COLOURS = {"supported": "#1b7837", "contradicted": "#b2182b", "inconclusive": "#8c6d00",
            "underpowered": "#5e3c99", "unstable": "#d95f02", "not testable here": "#666666"}

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:0.86em;width:100%}
th,td{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f2f2f2} td.num{text-align:right;white-space:nowrap}
.v{font-weight:600;white-space:nowrap} img{max-width:100%} .intro{color:#444}
"""


def fmt(x: Any, nd: int = 3) -> str:
    """A number for the page ("" for NaN)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(v):
        return ""
    return f"{v:.{nd}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def interval(row: Any) -> str:
    """``est [lo, hi]`` (``est`` alone without a CI; "" when untested)."""
    est, lo, hi = fmt(row["estimate"]), fmt(row["ci_low"]), fmt(row["ci_high"])
    if not est:
        return ""
    return f"{est} [{lo}, {hi}]" if lo and hi else est


def verdict_lines(df: pd.DataFrame) -> list[str]:
    """The verdict table as text (the CLI's summary)."""
    from ..results.console import format_table

    rows = [{"claim": r["claim"], "verdict": r["verdict"],
             "estimate [95% CI]": interval(r),
             "claim needs": (f"{r['direction']} {fmt(r['threshold'])}"
                             if fmt(r["threshold"]) else ""),
             "widths": r["widths"]} for _, r in df.iterrows()]
    counts = df["verdict"].value_counts()
    tally = ", ".join(f"{int(counts[v])} {v}" for v in VERDICTS if v in counts)
    return ["Claims of the two papers, measured here", format_table(rows), "", tally]


def plot_z_depth(layers: pd.DataFrame, infos: Sequence[ModelInfo], out_dir: Path,
                 stem: str = Z_DEPTH_STEM, setting: str = "ccr=1") -> list[Path]:
    """PGA z (``setting``) against relative depth (layer_index / (L+1)), one curve per model,
    labelled with its width; [] when the table has no such rows."""
    from matplotlib.figure import Figure

    if layers is None or layers.empty:
        return []
    sel = layers[(layers["metric"] == "pga_z") & (layers["setting"] == setting)
                 & (layers["layer_index"] >= 0)
                 & ~layers["layer"].astype(str).str.contains(".", regex=False)]
    if sel.empty:
        return []
    width = {i.name: i for i in infos}
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    order = sorted(dict.fromkeys(sel["model"].astype(str)),
                   key=lambda m: (width[m].d if m in width else 0, m))
    for model in order:
        g = sel[sel["model"] == model].drop_duplicates("layer_index").sort_values("layer_index")
        info = width.get(model)
        label = f"{model} (d={info.d}, {info.tuned})" if info else model
        ax.plot(g["depth"].astype(float), g["value"].astype(float), marker="o", ms=3,
                label=literal_text(label))
    band = layers[(layers["metric"] == "null_z_high") & (layers["setting"] == setting)]
    if not band.empty:
        h = float(np.nanmean(band["value"].astype(float)))
        ax.axhspan(-h, h, color="#999999", alpha=0.18, lw=0, label="null band (~95 %)")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("relative depth (layer index / (L + 1); final = 1)")
    ax.set_ylabel(f"Subspace PGA z ({setting.replace('ccr=', 'CCR-')})")
    ax.set_title("PGA z against relative depth, one curve per model", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def _img(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (f'<img alt="PGA z against relative depth" src="data:image/png;base64,{data}">'
            f'<p><a href="{esc(PLOTS_DIR)}/{esc(png.stem)}.svg">SVG</a> · '
            f'<a href="{esc(PLOTS_DIR)}/{esc(png.name)}">PNG</a></p>')


#: the paper each claim tests, by the claim id's letter (plain text: the page links nowhere)
PAPERS = {"P": "Xu (2026), arXiv:2605.17084",
          "D": "Li, Li, Livescu, Zhou (2025), arXiv:2506.24106"}


def paper_of(claim: str) -> str:
    """The paper a claim id (``P2``, ``D1.token`` ...) tests, as a short citation."""
    return PAPERS.get(str(claim)[:1], "")


def verdict_table(df: pd.DataFrame) -> str:
    """The verdict table (HTML): claim, statement, verdict, models, quantity with its CI,
    threshold, reason."""
    head = ("<tr><th>claim</th><th>statement</th><th>verdict</th><th>models (width, family, "
            "tuning)</th><th>measured quantity</th><th>estimate [95 % CI]</th><th>claim "
            "needs</th><th>reason</th></tr>")
    body = []
    for _, r in df.iterrows():
        v = str(r["verdict"])
        thr = f"{r['direction']} {fmt(r['threshold'])}" if fmt(r["threshold"]) else ""
        body.append(
            f'<tr data-claim="{esc(r["claim"])}" data-verdict="{esc(v)}">'
            f"<td>{esc(r['claim'])}<br><small>{esc(paper_of(r['claim']))}</small></td>"
            f"<td>{esc(r['statement'])}</td>"
            f'<td class="v" style="color:{_COLOURS.get(v, "#222")}">{esc(v)}</td>'
            f"<td>{esc(r['models'])}</td><td>{esc(r['quantity'])}</td>"
            f'<td class="num">{esc(interval(r))}</td><td class="num">{esc(thr)}</td>'
            f"<td>{esc(r['reason'])}</td></tr>")
    return (f'<table id="table-claims"><thead>{head}</thead><tbody>' + "".join(body)
            + "</tbody></table>")


def write_claims_report(out_dir: str | os.PathLike[str], claims: pd.DataFrame,
                        layers: pd.DataFrame | None, manifest: dict[str, Any], *,
                        infos: Sequence[ModelInfo] = (), title: str = "lmgeom claims") -> Path:
    """Draw the z-vs-depth figure and write ``<out_dir>/report.html`` (self-contained)."""
    out = Path(out_dir)
    paths = plot_z_depth(layers, infos, out / PLOTS_DIR) if layers is not None else []
    counts = claims["verdict"].value_counts()
    tally = ", ".join(f"{int(counts[v])} {v}" for v in VERDICTS if v in counts)
    total = manifest.get("timings", {}).get("total_s")
    models = "; ".join(i.label() for i in infos)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="intro">Models: {esc(models)}. Texts: {esc(manifest.get("texts", ""))} '
        f'(n = {esc(manifest.get("n_texts", ""))}). Seeds: {esc(manifest.get("seeds", {}))}.'
        + (f" Run time so far: {esc(fmt(total, 4))} s." if total else "") + "</p>",
        '<section id="section-claims"><h2>What the papers claim, and what lmgeom finds</h2>',
        f'<p class="intro">{esc(tally)}. Verdicts: supported / contradicted when the '
        "measured interval lies wholly on one side of the threshold the claim implies, "
        "inconclusive when it straddles it or the models disagree, underpowered when this n "
        "cannot make a PGA decision (z within its null band and text-sampling error; the "
        "reason gives the n it needs), unstable when an n-ladder run found another verdict at "
        "the next smaller n, not testable here when the models or data are missing. Each reason says which interval was used (z null, "
        "bootstrap over layers or texts, CV folds).</p>",
        verdict_table(claims), "</section>",
    ]
    if paths:
        parts += ['<section id="section-z-depth"><h2>PGA z against relative depth</h2>',
                  '<p class="intro">CCR-1 z per layer, one curve per model (width in the '
                  "legend); the grey band is the null's 95 % range.</p>",
                  _img(paths[0]), "</section>"]
    parts += ["</body></html>", ""]
    target = out / REPORT_NAME
    write_text(target, "\n".join(parts))
    return target


__all__ = ["Z_DEPTH_STEM", "interval", "plot_z_depth", "verdict_lines", "verdict_table",
           "write_claims_report"]
