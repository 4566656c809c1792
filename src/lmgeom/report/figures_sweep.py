"""Figures and report sections of a checkpoint sweep (``lmgeom sweep``): PGA z per layer at every
checkpoint, training trajectories (tracked-layer z, loss, spectra vs step), regimes, integrity.

Selection of rows only (which checkpoint is the last, which rows a section shows); the
trajectory and regime rows themselves are computed in :mod:`lmgeom.experiments.sweep`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib import cm, colormaps, colors, rc_context
from matplotlib.figure import Figure

from ..results.table import step_of
from .html import write_report
from .plots import PALETTE, PLOT_STYLE, literal_text, metric_label, save_figure, setting_label


def last_revisions(df: pd.DataFrame) -> dict[str, str]:
    """Per model, its last checkpoint (largest step; else the last revision seen)."""
    out: dict[str, str] = {}
    for model, g in df.groupby("model", sort=False):
        revs = list(dict.fromkeys(g["revision"].astype(str)))
        out[str(model)] = max(revs, key=lambda r: (step_of(r) is None, step_of(r) or 0,
                                                       revs.index(r)))
    return out


def report_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the HTML report's per-layer sections show: every model's last checkpoint's
    per-layer rows, and every model-level row (the step plots show the other checkpoints)."""
    last = last_revisions(df.loc[df["layer_index"] >= 0]) if (df["layer_index"] >= 0).any() else {}
    keep = df["layer_index"] < 0
    for model, rev in last.items():
        keep |= (df["model"] == model) & (df["revision"] == rev)
    return df.loc[keep].reset_index(drop=True)


def _model_order(df: pd.DataFrame) -> list[str]:
    models = list(dict.fromkeys(df["model"].astype(str)))

    def key(m: str) -> tuple:
        mm = re.fullmatch(r"w(\d+)", m)
        return (0, int(mm.group(1)), m) if mm else (1, 0, models.index(m))

    return sorted(models, key=key)


def _steps_axis(revs: Sequence[str]) -> dict[str, float]:
    if all(step_of(r) is not None for r in revs):
        return {r: float(step_of(r)) for r in revs}  # type: ignore[arg-type]
    return {r: float(i) for i, r in enumerate(revs)}


def plot_profiles(df: pd.DataFrame, out_dir: str | Path, *, ccrs: Sequence[int] = (1, 5),
                  stem: str = "profiles_by_step") -> list[Path]:
    """PGA z per layer for every checkpoint: one panel per model (columns) and CCR level
    (rows), one line per checkpoint coloured by training step (log colour scale)."""

    z = df.loc[(df["metric"] == "pga_z") & (df["layer_index"] >= 0)
               & ~df["layer"].astype(str).str.contains(".", regex=False)]
    settings = [f"ccr={m}" for m in ccrs if (z["setting"] == f"ccr={m}").any()]
    if z.empty or not settings:
        return []
    models = _model_order(z)
    with rc_context(PLOT_STYLE):
        fig = Figure(figsize=(3.4 * len(models) + 1.0, 2.6 * len(settings) + 0.6), layout="constrained")
        axes = fig.subplots(len(settings), len(models), squeeze=False, sharey="row")
        all_steps = [s for s in (step_of(r) for r in z["revision"].astype(str)) if s is not None]
        vmax = max(all_steps) if all_steps else 1
        norm = colors.SymLogNorm(linthresh=1.0, vmin=0, vmax=max(vmax, 1), base=10)
        cmap = colormaps["viridis"]
        for i, s in enumerate(settings):
            for j, model in enumerate(models):
                ax = axes[i][j]
                g = z.loc[(z["model"] == model) & (z["setting"] == s)]
                revs = sorted(dict.fromkeys(g["revision"].astype(str)),
                              key=lambda r: (step_of(r) or 0, r))
                xs = _steps_axis(revs)
                for r in revs:
                    c = g.loc[g["revision"] == r].drop_duplicates("layer_index").sort_values("layer_index")
                    st = xs[r]
                    ax.plot(c["layer_index"], c["value"], color=cmap(norm(st)), lw=1.3,
                            marker="o", ms=2.5, label=literal_text(r))
                ax.axhline(0.0, color="black", lw=0.8)
                ticks = g.drop_duplicates("layer_index").sort_values("layer_index")
                ax.set_xticks(list(ticks["layer_index"]), [literal_text(t) for t in ticks["layer"]])
                if i == 0:
                    ax.set_title(literal_text(model), loc="left")
                if j == 0:
                    ax.set_ylabel(f"PGA z ({setting_label(s)})")
                if i == len(settings) - 1:
                    ax.set_xlabel("layer")
        sm = cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(sm, ax=axes, label="training step", shrink=0.8)
        fig.suptitle("Subspace PGA z per layer at every checkpoint (colour = training step)",
                     fontsize=10.5)
        return save_figure(fig, out_dir, stem)


def plot_trajectory(df: pd.DataFrame, out_dir: str | Path, *, ccrs: Sequence[int] = (1, 5),
                    stem: str = "trajectory") -> list[Path]:
    """Against training step, one line per model: tracked-layer z (per CCR level), validation
    loss, and the spectral metrics over the same layers — does z move where loss and spectra
    do not?"""
    ml = df.loc[df["layer_index"] < 0]
    panels: list[tuple[str, str, str]] = []
    for m in ccrs:
        if ((ml["metric"] == "zone_pga_z_min") & (ml["setting"] == f"ccr={m}")).any():
            panels.append(("zone_pga_z_min", f"ccr={m}",
                           f"min z, tracked layers ({setting_label(f'ccr={m}')})"))
    if (ml["metric"] == "val_loss").any():
        panels.append(("val_loss", "", "validation loss"))
    for m in ("rankme", "alpha_req", "isoscore"):
        if (ml["metric"] == f"zone_{m}_mean").any():
            panels.append((f"zone_{m}_mean", "", f"{metric_label(m)} (tracked mean)"))
    if not panels:
        return []
    models = _model_order(ml.loc[ml["metric"].isin([p[0] for p in panels])])
    with rc_context(PLOT_STYLE):
        fig = Figure(figsize=(7.5, 1.9 * len(panels) + 0.8), layout="constrained")
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (metric, setting, ylabel) in zip(axes, panels):
            sel = ml.loc[(ml["metric"] == metric) & (ml["setting"] == setting)]
            for j, model in enumerate(models):
                g = sel.loc[sel["model"] == model]
                if g.empty:
                    continue
                revs = sorted(dict.fromkeys(g["revision"].astype(str)), key=lambda r: (step_of(r) or 0, r))
                xs = _steps_axis(revs)
                g = g.drop_duplicates("revision").set_index("revision").loc[revs]
                ax.plot([xs[r] for r in revs], g["value"].astype(float), marker="o", ms=3,
                        lw=1.4, color=PALETTE[j % len(PALETTE)], label=literal_text(model))
            if metric == "zone_pga_z_min":
                ax.axhline(0.0, color="black", lw=0.8)
            ax.set_ylabel(literal_text(ylabel))
            ax.set_xscale("symlog", linthresh=1.0)
        axes[0].legend(loc="best", ncols=min(4, len(models)))
        axes[-1].set_xlabel("training step (symlog)")
        fig.suptitle("Training trajectories: tracked-layer PGA z, validation loss and spectra",
                     fontsize=10.5)
        return save_figure(fig, out_dir, stem)


def report_sections(df: pd.DataFrame, entries: dict[str, Any], *, n_jobs: int,
                    plots_dir: str | Path, ccrs: Sequence[int] = (1, 5, 10)) -> list[tuple[str, list[Path], str]]:
    """The sweep's own report sections (``extra_figures`` of
    :func:`~lmgeom.report.html.write_report`): z per layer per checkpoint, trajectories, the
    regimes, and checkpoint integrity / failures (identical weights are a warning line)."""
    shown = [m for m in (1, 5, 10) if m in ccrs][:2] or list(ccrs)[:1]
    extra: list[tuple[str, list[Path], str]] = []
    prof = plot_profiles(df, plots_dir, ccrs=shown)
    if prof:
        extra.append(("PGA z per layer at every checkpoint", prof,
                      ("One panel per model (columns) and CCR level (rows); one line per "
                      "checkpoint, coloured by training step.")))
    traj = plot_trajectory(df, plots_dir, ccrs=shown)
    if traj:
        tracked = "; ".join(f"{m}: {', '.join(v) or 'none'}"
                            for m, v in entries.get("tracked_layers", {}).items())
        extra.append(("Training trajectories: z, loss and spectra vs step", traj,
                      ("Lowest PGA z over each model's tracked layers (its last checkpoint's "
                      "collapse zone if that is a detour, else its late non-final layers), the "
                      "validation loss, and spectral metrics averaged over the same layers, "
                      f"against training step. Tracked layers — {tracked}.")))
    if entries.get("regimes"):
        lines = [f"{k}: {v}." for k, v in entries["regimes"].items()]
        extra.append(("Regimes (direct / detour)", [],
                      "Rule: a collapse zone is a run of >= 2 consecutive non-final layers after "
                      "the CCR-1 peak with z < 0, or one such layer with z < -2; a profile with a "
                      "collapse zone is a detour, else direct. " + " ".join(lines)))
    integrity = ["WARNING: identical weights in " + ", ".join(g)
                 + " — these checkpoints are the same model." for g in entries.get("identical_weights", [])]
    integrity += [f"FAILED job {f['name']} ({f.get('attempts', 1)} attempts): {f['error']}"
                  for f in entries.get("failed_jobs", [])]
    extra.append(("Checkpoint integrity and failures", [],
                  " ".join(integrity) if integrity else
                  f"All {n_jobs} jobs ran; no two checkpoints have identical weights (sha256 of the "
                  "weight files, recorded per job in the manifest)."))
    return extra


def write_sweep_report(out_dir: str | Path, df: pd.DataFrame, manifest: dict[str, Any],
                       entries: dict[str, Any], *, n_jobs: int, ccrs: Sequence[int] = (1, 5, 10),
                       title: str = "lmgeom sweep") -> Path:
    """Plots + ``report.html``: the per-layer sections on each model's last checkpoint
    (:func:`report_table`), then :func:`report_sections`."""
    out = Path(out_dir)
    extra = report_sections(df, entries, n_jobs=n_jobs, plots_dir=out / "plots", ccrs=ccrs)
    return write_report(out, report_table(df), manifest, title=title, extra_figures=extra)
