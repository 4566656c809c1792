"""Per-layer plots of a tidy results table (:mod:`lmgeom.results.table`).

Every function takes the tidy ``DataFrame`` and an output folder, writes ``<stem>.png`` and
``<stem>.svg`` atomically and returns ``[png_path, svg_path]``; when the metrics it shows are
absent it writes nothing and returns ``[]`` (never an error). Nothing is computed here beyond
selecting and grouping rows: every number drawn is a ``value`` / ``ci_low`` / ``ci_high`` of the table.

Conventions shared by all plots:

* x axis = the layer axis in ``layer_index`` order, tick labels = the ``layer`` labels
  (``"0"``..``"L"``, ``"final"``); model-level rows (``layer_index == -1``) are not drawn, except
  that a dashed baseline metric (``*_baseline``) given only model-level becomes a horizontal line.
* one column of panels per model × revision (wrapped after :data:`MAX_COLUMNS` columns), one line
  per ``setting`` (``ccr=1`` is labelled ``CCR-1``), colours consistent across the columns.
* rows at sub-layer measurement points (``layer = "30.attn_out"``) form their own line, labelled
  with the point name.
* a series with finite ``ci_low``/``ci_high`` gets whiskers (fewer than 8 points) or a shaded band.
* figures are built with :class:`matplotlib.figure.Figure` (Agg, no pyplot, no global state);
  ``$`` in user strings (model names, settings, labels) is escaped, so it is shown literally and
  never parsed as math text.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .._io import atomic_path
from ..errors import ConfigError, DataError
from ..metrics.pga import PGAResult
from ..metrics.regime import natural_key
from ..results import table as results_table
from ..results.table import COLUMNS

log = logging.getLogger(__name__)

MAX_COLUMNS = 3
"""Model columns per figure row; more models wrap onto further rows of panels."""

DPI = 110
PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
)
PLOT_STYLE = {
    "svg.hashsalt": "lmgeom",
    "svg.fonttype": "path",
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "legend.fontsize": 7,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
}

METRIC_LABELS: dict[str, str] = {
    "pga_z": "PGA z",
    "rho_readout": "rho readout",
    "p_value": "p-value",
    "pc1_share": "PC1 readout share",
    "pc1_baseline": "baseline k/d",
    "pc1_evr": "PC1 explained var.",
    "rankme": "RankMe",
    "alpha_req": "alpha-ReQ",
    "isoscore": "IsoScore",
    "mean_cosine": "mean cosine",
    "condition_number": "condition number",
    "logit_lens_top1": "logit lens top-1",
    "logit_lens_kl": "logit lens KL",
    "dispersion": "dispersion",
    "corr_spearman": "Spearman r",
    "corr_pearson": "Pearson r",
    "probe_acc": "probe accuracy",
    "probe_baseline": "majority baseline",
}

Panel = str | Sequence[str]


# --------------------------------------------------------------------------- helpers


def literal_text(text: str) -> str:
    """Escape ``$`` so matplotlib shows ``text`` literally instead of parsing math text."""
    return str(text).replace("$", "\\$")


def setting_label(setting: str) -> str:
    """Display form of a setting: ``ccr=1`` → ``CCR-1`` (inside longer settings too)."""
    return re.sub(r"\bccr=(\d+)", lambda m: f"CCR-{m.group(1)}", setting)


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def run_label(model: str, revision: str) -> str:
    return f"{model} @ {revision}" if revision else model


def check_table(df: Any) -> pd.DataFrame:
    """Raise :class:`DataError` unless ``df`` is a DataFrame with the tidy table's columns."""
    if not isinstance(df, pd.DataFrame):
        raise DataError(
            f"expected a results table (pandas DataFrame), got {type(df).__name__}; build it "
            "with lmgeom.results.table.frame() or read it with read_table()"
        )
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataError(
            f"results table lacks columns {missing}; build it with "
            "lmgeom.results.table.frame() so it has the canonical columns"
        )
    return df


def runs_of(df: pd.DataFrame) -> list[tuple[str, str]]:
    """The (model, revision) pairs of ``df`` in order of first appearance."""
    pairs = df[["model", "revision"]].astype(str).drop_duplicates()
    return [(str(m), str(r)) for m, r in pairs.itertuples(index=False)]


def layer_rows(df: pd.DataFrame, metrics: Collection[str] | None = None) -> pd.DataFrame:
    """Per-layer rows (``layer_index >= 0``, finite ``value``), optionally of some metrics only,
    with helper columns ``base`` (layer label without a ``.point`` suffix) and ``point``."""
    df = check_table(df)
    sel = (df["layer_index"] >= 0) & np.isfinite(df["value"].astype(float))
    if metrics is not None:
        sel &= df["metric"].isin(list(metrics))
    out = df.loc[sel].copy()
    layer = out["layer"].astype(str)
    out["base"] = [lab.partition(".")[0] for lab in layer]
    out["point"] = [lab.partition(".")[2] for lab in layer]
    return out


def _present(df: pd.DataFrame, metric: str) -> bool:
    return bool(
        ((df["metric"] == metric) & np.isfinite(df["value"].astype(float))).any()
    )


def _as_panels(metrics: Sequence[Panel]) -> list[tuple[str, ...]]:
    if isinstance(metrics, str):
        metrics = [metrics]
    panels = [(p,) if isinstance(p, str) else tuple(p) for p in metrics]
    if not panels or any(not p for p in panels):
        raise ConfigError("metrics must name at least one metric per panel, e.g. ['pga_z']")
    return panels


def _selector(spec: bool | Collection[str] | None, panel: tuple[str, ...]) -> bool:
    if spec is None or spec is False:
        return False
    if spec is True:
        return True
    return any(m in spec for m in panel)


def _ticks(frame: pd.DataFrame) -> tuple[list[int], list[str]]:
    idx = frame.drop_duplicates("layer_index").sort_values("layer_index")
    pos = [int(i) for i in idx["layer_index"]]
    lab = [str(b) for b in idx["base"]]
    if len(pos) > 24:
        step = math.ceil(len(pos) / 16)
        keep = set(range(0, len(pos), step)) | {len(pos) - 1}
        keep.discard(len(pos) - 2)  # no two crowded labels at the end of the axis
        pos = [p for i, p in enumerate(pos) if i in keep]
        lab = [t for i, t in enumerate(lab) if i in keep]
    return pos, lab


def _series_label(metric: str, setting: str, point: str, multi_metric: bool) -> str:
    parts = []
    if multi_metric or not setting:
        parts.append(metric_label(metric))
    if setting:
        parts.append(setting_label(setting))
    if point:
        parts.append(f"[{point}]")
    return literal_text(" ".join(parts))


def _one_per_layer(s: pd.DataFrame, what: str) -> pd.DataFrame:
    dup = s.duplicated("layer_index", keep="first")
    if dup.any():
        log.warning("%s: %d duplicate rows per layer; plotting the first of each", what, int(dup.sum()))
        s = s.loc[~dup]
    return s.sort_values("layer_index")


# --------------------------------------------------------------------------- generic figure


def build_layer_figure(
    df: pd.DataFrame,
    metrics: Sequence[Panel],
    *,
    title: str,
    logy: bool | Collection[str] = False,
    zero_line: bool | Collection[str] = False,
    bands: Mapping[str, tuple[str, str]] | None = None,
    dashed: Collection[str] | None = None,
    ylabels: Mapping[str, str] | None = None,
) -> Figure | None:
    """Build (do not save) the stacked per-layer figure; ``None`` when nothing can be drawn.

    Args:
        df: tidy results table.
        metrics: panels from top to bottom; each a metric name or a sequence of metric names
            drawn in one panel.
        title: figure title.
        logy: ``True`` (all panels) or the metrics whose panels get a log y axis; values
            ``<= 0`` are left out there.
        zero_line: ``True`` or the metrics whose panels get a horizontal line at 0.
        bands: metric → (low metric, high metric): shade, per setting, between the rows of the
            two other metrics with the same setting (e.g. the null's central 95 % in z units).
        dashed: metrics drawn dashed, without markers (default: names ending in ``_baseline``);
            one given only as a model-level row is drawn as a horizontal line.
        ylabels: panel y-axis labels by metric (first metric of the panel), default the metric's
            display name.

    Returns:
        The figure, or ``None`` when no panel has data.
    """
    with rc_context(PLOT_STYLE):
        return _build(df, metrics, title, logy, zero_line, bands, dashed, ylabels)


def _colours(rows: pd.DataFrame, panels: list[tuple[str, ...]],
             dashed: Collection[str]) -> list[dict[tuple[str, str, str], str]]:
    """Colour per (metric, setting, point) of each panel, consistent across model columns; a
    dashed metric (a baseline) takes the colour of the solid series of its setting."""
    colours: list[dict[tuple[str, str, str], str]] = []
    for panel in panels:
        keys = rows.loc[rows["metric"].isin(panel), ["metric", "setting", "point"]].drop_duplicates()
        solid = sorted(
            {(m, s, p) for m, s, p in keys.itertuples(index=False) if m not in dashed},
            key=lambda k: (panel.index(k[0]), natural_key(k[1]), natural_key(k[2])),
        )
        cmap = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(solid)}
        for m, s, p in keys.itertuples(index=False):
            if m in dashed:
                twin = next((c for (m2, s2, p2), c in cmap.items() if s2 == s and p2 == p), None)
                cmap[(m, s, p)] = twin or "#444444"
        colours.append(cmap)
    return colours


def _draw_series(ax: Any, s: pd.DataFrame, colour: str, label: str, *, log_panel: bool,
                 dashed: bool, point: str) -> bool:
    """One series' line and its CI (band from 8 points, error bars below); False when empty."""
    x = s["layer_index"].to_numpy(dtype=float)
    y = s["value"].to_numpy(dtype=float)
    lo = s["ci_low"].to_numpy(dtype=float)
    hi = s["ci_high"].to_numpy(dtype=float)
    if log_panel:
        ok = y > 0
        x, y, lo, hi = x[ok], y[ok], lo[ok], hi[ok]
    if not len(x):
        return False
    style: dict[str, Any] = {"color": colour, "lw": 1.5, "label": label}
    if dashed:
        style.update(ls="--", lw=1.2)
    elif len(x) <= 40:
        style.update(marker="o", ms=3)
    if point:
        style["ls"] = ":"
    ax.plot(x, y, **style)
    ci = np.isfinite(lo) & np.isfinite(hi)
    if log_panel:
        ci &= (lo > 0) & (hi > 0)
    if ci.any():
        if len(x) >= 8:
            ax.fill_between(x[ci], lo[ci], hi[ci], color=colour, alpha=0.18, lw=0)
        else:
            ax.errorbar(
                x[ci], y[ci],
                yerr=np.vstack([y[ci] - lo[ci], hi[ci] - y[ci]]).clip(min=0),
                fmt="none", ecolor=colour, elinewidth=1, capsize=2.5,
            )
    return True


def _draw_band(ax: Any, run_rows: pd.DataFrame, setting: str, point: str,
               low_high: tuple[str, str], colour: str) -> bool:
    """The null band (two metrics: low and high edge) of one series; False when none."""
    low_m, high_m = low_high
    b = run_rows.loc[(run_rows["setting"] == setting) & (run_rows["point"] == point)]
    blo = _one_per_layer(b.loc[b["metric"] == low_m], low_m)
    bhi = _one_per_layer(b.loc[b["metric"] == high_m], high_m)
    both = blo[["layer_index", "value"]].merge(
        bhi[["layer_index", "value"]], on="layer_index", suffixes=("_lo", "_hi")
    )
    if not len(both):
        return False
    ax.fill_between(
        both["layer_index"].to_numpy(float),
        both["value_lo"].to_numpy(float),
        both["value_hi"].to_numpy(float),
        color=colour, alpha=0.10, lw=0,
    )
    return True


@dataclass(frozen=True)
class _Style:
    """The per-figure choices of ``_build`` a panel needs."""

    logy: bool | Collection[str]
    zero_line: bool | Collection[str]
    bands: Mapping[str, tuple[str, str]]
    dashed: Collection[str]
    ylabels: Mapping[str, str]


def _draw_panel(ax: Any, panel: tuple[str, ...], run_rows: pd.DataFrame, run_ml: pd.DataFrame,
                cmap: dict[tuple[str, str, str], str], st: _Style, model: str) -> tuple[bool, bool]:
    """Every series of one panel of one run: (drew anything, drew a null band)."""
    log_panel = _selector(st.logy, panel)
    multi = len(panel) > 1
    drew = band_labelled = False
    for metric in panel:
        mrows = run_rows.loc[run_rows["metric"] == metric]
        keys = sorted(
            {(s, p) for s, p in mrows[["setting", "point"]].itertuples(index=False)},
            key=lambda k: (natural_key(k[0]), natural_key(k[1])),
        )
        for setting, point in keys:
            s = mrows.loc[(mrows["setting"] == setting) & (mrows["point"] == point)]
            s = _one_per_layer(s, f"{model} {metric} {setting}")
            colour = cmap[(metric, setting, point)]
            if not _draw_series(ax, s, colour, _series_label(metric, setting, point, multi),
                                log_panel=log_panel, dashed=metric in st.dashed, point=point):
                continue
            drew = True
            if metric in st.bands and _draw_band(ax, run_rows, setting, point,
                                                 st.bands[metric], colour):
                band_labelled = True
        if metric in st.dashed and mrows.empty:
            for (setting,), g in run_ml.loc[run_ml["metric"] == metric].groupby(["setting"]):
                colour = cmap.get((metric, setting, ""), "#444444")
                ax.axhline(
                    float(g["value"].iloc[0]), color=colour, ls="--", lw=1.2,
                    label=_series_label(metric, str(setting), "", multi),
                )
    return drew, band_labelled


def _finish_panel(ax: Any, panel: tuple[str, ...], st: _Style, *, drew: bool, band_labelled: bool,
                  title: str | None, ticks: tuple[list[int], list[str]], last: bool) -> None:
    """Zero line, scale, labels, legend and ticks of one panel."""
    if _selector(st.zero_line, panel):
        ax.axhline(0.0, color="black", lw=0.8, zorder=1)
    if _selector(st.logy, panel):
        ax.set_yscale("log")
    ax.set_ylabel(literal_text(st.ylabels.get(panel[0], " / ".join(metric_label(m) for m in panel))))
    if title is not None:
        ax.set_title(literal_text(title), loc="left")
    if not drew:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                color="#888888")
    handles, labels = ax.get_legend_handles_labels()
    if band_labelled:
        handles.append(Patch(color="#888888", alpha=0.3, lw=0))
        labels.append("null central 95 %")
    if handles:
        ax.legend(handles, labels, loc="best", ncols=2 if len(handles) > 4 else 1,
                  framealpha=0.85)
    pos, lab = ticks
    if pos:
        ax.set_xticks(pos, [literal_text(t) for t in lab])
    if last:
        ax.set_xlabel("layer")
    else:
        ax.tick_params(labelbottom=False)


def _build(
    df: pd.DataFrame,
    metrics: Sequence[Panel],
    title: str,
    logy: bool | Collection[str],
    zero_line: bool | Collection[str],
    bands: Mapping[str, tuple[str, str]] | None,
    dashed: Collection[str] | None,
    ylabels: Mapping[str, str] | None,
) -> Figure | None:
    df = check_table(df)
    panels = _as_panels(metrics)
    all_metrics = {m for p in panels for m in p}
    if dashed is None:
        dashed = {m for m in all_metrics if m.endswith("_baseline")}
    st = _Style(logy, zero_line, dict(bands or {}), dashed, dict(ylabels or {}))
    band_metrics = {m for lo_hi in st.bands.values() for m in lo_hi}
    rows = layer_rows(df, all_metrics | band_metrics)
    model_level = df.loc[
        (df["layer_index"] < 0) & df["metric"].isin(list(dashed)) & np.isfinite(df["value"])
    ]
    # keep panels that have per-layer data for a non-dashed metric (a baseline alone is no plot)
    panels = [p for p in panels if any(m not in dashed and _present(rows, m) for m in p)]
    if not panels:
        return None
    runs = [r for r in runs_of(rows)]
    ncols = min(len(runs), MAX_COLUMNS)
    nblocks = math.ceil(len(runs) / ncols)
    heights = [2.9 if len(panels) == 1 else 2.2] * len(panels)
    width = 9.0 if ncols == 1 else 5.2 * ncols
    height = nblocks * sum(heights) + 0.6
    fig = Figure(figsize=(width, height), layout="constrained")
    gs = fig.add_gridspec(nblocks * len(panels), ncols, height_ratios=heights * nblocks)
    colours = _colours(rows, panels, dashed)
    for ri, (model, revision) in enumerate(runs):
        block, col = divmod(ri, ncols)
        run_rows = rows.loc[(rows["model"] == model) & (rows["revision"] == revision)]
        run_ml = model_level.loc[
            (model_level["model"] == model) & (model_level["revision"] == revision)
        ]
        ticks = _ticks(run_rows)
        first_ax = None
        for pi, panel in enumerate(panels):
            ax = fig.add_subplot(gs[block * len(panels) + pi, col], sharex=first_ax)
            first_ax = first_ax or ax
            drew, band_labelled = _draw_panel(ax, panel, run_rows, run_ml, colours[pi], st, model)
            _finish_panel(ax, panel, st, drew=drew, band_labelled=band_labelled,
                          title=run_label(model, revision) if pi == 0 else None, ticks=ticks,
                          last=pi == len(panels) - 1)
    fig.suptitle(literal_text(title), fontsize=10.5)
    return fig


def save_figure(fig: Figure, out_dir: str | os.PathLike[str], stem: str) -> list[Path]:
    """Atomically write ``fig`` as ``stem.png`` and ``stem.svg`` in ``out_dir``."""
    if not stem or Path(stem).name != stem or stem.startswith("."):
        raise ConfigError(f"plot stem {stem!r} must be a plain file name such as 'pga'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    with rc_context(PLOT_STYLE):
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})
        with atomic_path(svg) as tmp:
            fig.savefig(tmp, format="svg", metadata={"Date": None})
    return [png, svg]


def plot_metric_by_layer(
    df: pd.DataFrame,
    metrics: Sequence[Panel],
    out_dir: str | os.PathLike[str],
    stem: str,
    *,
    title: str,
    logy: bool | Collection[str] = False,
    zero_line: bool | Collection[str] = False,
    bands: Mapping[str, tuple[str, str]] | None = None,
    dashed: Collection[str] | None = None,
    ylabels: Mapping[str, str] | None = None,
) -> list[Path]:
    """Plot metrics per layer as stacked panels sharing the layer axis; one line per setting.

    See :func:`build_layer_figure` for the arguments. Writes ``out_dir/stem.png`` and
    ``out_dir/stem.svg``.

    Returns:
        ``[png, svg]``, or ``[]`` (nothing written) when none of ``metrics`` has per-layer data.
    """
    fig = build_layer_figure(
        df, metrics, title=title, logy=logy, zero_line=zero_line, bands=bands,
        dashed=dashed, ylabels=ylabels,
    )
    if fig is None:
        log.debug("no per-layer data for %s; plot %s skipped", metrics, stem)
        return []
    return save_figure(fig, out_dir, stem)


# --------------------------------------------------------------------------- the report's plots


PGA_BAND = {"pga_z": ("null_z_low", "null_z_high")}


def plot_pga(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str = "pga") -> list[Path]:
    """PGA z per layer, one line per CCR setting, the 0 line and each setting's null band
    (rows ``null_z_low``/``null_z_high``: the null's central 95 % in z units), one panel per
    model × revision."""
    return plot_metric_by_layer(
        df, ["pga_z"], out_dir, stem, title="Subspace PGA: z per layer",
        zero_line=True, bands=PGA_BAND, ylabels={"pga_z": "PGA z"},
    )


def plot_pc1(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str = "pc1") -> list[Path]:
    """PC1 readout share per layer against the random baseline k/d (dashed), and PC1's
    explained-variance ratio in a second panel."""
    return plot_metric_by_layer(
        df, [("pc1_share", "pc1_baseline"), "pc1_evr"], out_dir, stem,
        title="PC1 migration: readout share of the top principal direction",
        ylabels={"pc1_share": "PC1 readout share", "pc1_evr": "PC1 explained var."},
    )


SPECTRAL_METRICS = ("rankme", "alpha_req", "isoscore", "mean_cosine", "condition_number")


def plot_spectral(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str = "spectral") -> list[Path]:
    """RankMe, alpha-ReQ, IsoScore, mean cosine and condition number (log scale) per layer."""
    return plot_metric_by_layer(
        df, list(SPECTRAL_METRICS), out_dir, stem, title="Spectral metrics per layer",
        logy={"condition_number"},
    )


def plot_logit_lens(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str = "logit_lens") -> list[Path]:
    """Logit-lens top-1 agreement and KL to the final distribution per layer."""
    return plot_metric_by_layer(
        df, ["logit_lens_top1", "logit_lens_kl"], out_dir, stem,
        title="Logit lens: agreement with the final distribution",
    )


def plot_dispersion(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str = "dispersion") -> list[Path]:
    """Dispersion per layer, and its Spearman / Pearson correlation with perplexity per layer
    (one line per setting such as ``level=chunk`` / ``level=group``, with the CIs)."""
    return plot_metric_by_layer(
        df, ["dispersion", "corr_spearman", "corr_pearson"], out_dir, stem,
        title="Representation dispersion per layer",
        zero_line={"corr_spearman", "corr_pearson"},
        ylabels={"corr_spearman": "Spearman r (disp., ppl)", "corr_pearson": "Pearson r (disp., ppl)"},
    )


def plot_probes(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str = "probes") -> list[Path]:
    """Linear-probe accuracy (with its CI) vs the majority baseline, stacked over PGA z on
    the same layer axis; skipped when there is no ``probe_acc``."""
    df = check_table(df)
    if not _present(layer_rows(df, ["probe_acc"]), "probe_acc"):
        return []
    return plot_metric_by_layer(
        df, [("probe_acc", "probe_baseline"), "pga_z"], out_dir, stem,
        title="Linear probes vs Subspace PGA", zero_line={"pga_z"}, bands=PGA_BAND,
        ylabels={"probe_acc": "probe accuracy", "pga_z": "PGA z"},
    )


# --------------------------------------------------------------------------- arrays in hand


def plot_pga_by_layer(
    results: Mapping[Any, Any],
    out_dir: str | os.PathLike[str],
    stem: str = "pga",
    *,
    model: str = "",
    title: str = "Subspace PGA: z per layer",
) -> list[Path]:
    """Plot Subspace PGA z per layer from results computed on states you hold yourself.

    The figure :func:`plot_pga` draws for a run folder (one line per CCR level, the 0 line and
    each level's null band), for the :class:`~lmgeom.metrics.PGAResult` values that
    :func:`~lmgeom.metrics.subspace_pga` or :func:`~lmgeom.metrics.subspace_pga_levels` return
    on numpy / torch arrays, with no results table to build::

        z = {layer: M.subspace_pga_levels(X, basis, ccr=(0, 1)) for layer, X in states.items()}
        plot_pga_by_layer(z, "plots")            # plots/pga.png and plots/pga.svg

    Args:
        results: layer label -> that layer's result: one ``PGAResult``, a sequence of them, or
            the ``{m: PGAResult}`` dict of ``subspace_pga_levels`` (one line per CCR level
            ``m``; at most one result per level and layer). Layers are drawn in the mapping's
            order: a label that is an integer (``"0"``, ``12``) at that position of the layer
            axis, any other label (``"final"``) one step after the label before it.
        out_dir: folder for the files (created when missing).
        stem: file name without extension.
        model: panel title (e.g. the model's name); ``""`` for none.
        title: figure title.

    Returns:
        ``[png, svg]``: the paths written, ``out_dir/stem.png`` and ``out_dir/stem.svg``.

    Raises:
        ConfigError: ``results`` is empty, a value is not a PGA result, a layer has two
            results for the same CCR level, or the layers are out of order (an integer label
            at or before the position of the one before it).
    """
    if not isinstance(results, Mapping) or not results:
        raise ConfigError(
            "results must be a non-empty mapping layer -> PGAResult (or a list / dict of them, "
            "one per CCR level), e.g. {'0': M.subspace_pga(X0, basis), ...}"
        )
    rows: list[dict[str, Any]] = []
    position = -1
    for key, value in results.items():
        label = str(key)
        head, _, point = label.partition(".")
        previous, position = position, int(head) if head.isdecimal() else position + 1
        if position < previous or (position == previous and not point):
            raise ConfigError(
                f"layer {label} comes after a layer at or beyond position {previous}: give the "
                "layers in their order along the model ('0', '1', ..., 'final')"
            )
        if isinstance(value, Mapping):
            per_level = list(value.values())
        elif isinstance(value, Sequence) and not isinstance(value, str):
            per_level = list(value)
        else:
            per_level = [value]
        seen: set[int] = set()
        for res in per_level:
            if not isinstance(res, PGAResult):
                raise ConfigError(
                    f"layer {label}: expected a PGAResult (from lmgeom.metrics.subspace_pga), "
                    f"got {type(res).__name__}"
                )
            if res.ccr in seen:
                raise ConfigError(
                    f"layer {label}: two results for CCR-{res.ccr}; give one per level"
                )
            seen.add(res.ccr)
            common = {"model": model, "layer": label, "layer_index": position,
                      "setting": f"ccr={res.ccr}", "seed": res.seed, "n": res.n,
                      "flag": ";".join(res.flags)}
            rows += [results_table.row(metric=metric, value=getattr(res, attr), **common)
                     for metric, attr in (("pga_z", "z"), ("null_z_low", "null_z_low"),
                                          ("null_z_high", "null_z_high"))]
    return plot_metric_by_layer(
        results_table.frame(rows), ["pga_z"], out_dir, stem, title=title,
        zero_line=True, bands=PGA_BAND, ylabels={"pga_z": "PGA z"},
    )
