"""Figures of the dispersion family of experiments (``lmgeom dispersion``, ``hardness``,
``clusters``, ``knnlm``): drawn from their results, no computation beyond group means."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..lm.knnlm import temperature_label
from ..metrics.dispersion import group_means
from .plots import plot_metric_by_layer, save_figure


def plot_dispersion_correlation(df, out_dir) -> list:
    """Spearman and Pearson correlation of dispersion with perplexity per layer."""
    return plot_metric_by_layer(df, ["corr_spearman", "corr_pearson"], out_dir,
                                "dispersion_correlation",
                                title="Correlation of dispersion with perplexity per layer",
                                zero_line=True)


def plot_cluster_dispersion(df, out_dir) -> list:
    """Within-cluster dispersion per layer (dashed: all contexts pooled)."""
    return plot_metric_by_layer(df, [("cluster_dispersion", "cluster_dispersion_all")],
                                out_dir, "clusters", title="Within-cluster dispersion per layer",
                                dashed={"cluster_dispersion_all"})


def scatter_layers(m: Any, layers: Sequence[str] | None = None) -> list[str]:
    """Layers drawn in the scatter: the given ones that were measured, else the last block
    ``L`` (pre-norm) and ``final`` (post-norm) when measured, else the last requested."""
    if layers:
        got = [lab for lab in layers if lab in m.layers]
        if got:
            return got
    got = [lab for lab in (str(m.n_blocks), "final") if lab in m.layers]
    return got or [m.layers[-1]]


def plot_scatter(measurements: Sequence[Any], config: Any, out_dir,
                 stem: str = "dispersion_scatter", layers: Sequence[str] | None = None) -> list:
    """Dispersion vs perplexity at the last layer(s) (:func:`scatter_layers`): chunk-level
    points and perplexity-sorted group means; one row per model × corpus, one panel per layer.

    Args:
        measurements: :class:`~lmgeom.experiments.dispersion.ChunkMeasurements` (``model``,
            ``texts``, ``layers``, ``n_blocks``, ``perplexity (N,)``, ``dispersion
            (n_layers, N)``).
        config: the :class:`~lmgeom.experiments.dispersion.DispersionConfig` (``group_size``,
            ``max_groups``, ``chunk_len``).
        out_dir: the plots folder.

    Returns:
        The written PNG/SVG paths.
    """
    if not measurements:
        return []

    matplotlib.use("Agg", force=False)

    per = [scatter_layers(m, layers) for m in measurements]
    cols = max(len(p) for p in per)
    rws = len(measurements)
    fig, axes = plt.subplots(rws, cols, figsize=(4.3 * cols, 3.3 * rws), squeeze=False)
    for r, (m, labs) in enumerate(zip(measurements, per)):
        for c in range(cols):
            ax = axes[r, c]
            if c >= len(labs):
                ax.set_visible(False)
                continue
            lab = labs[c]
            li = m.layers.index(lab)
            ax.scatter(m.perplexity, m.dispersion[li], s=6, alpha=0.35, color="#1f77b4",
                       label=f"chunks (n={len(m.perplexity)})")
            gd, gp, _ = group_means(m.dispersion[li], m.perplexity, config.group_size,
                                    config.max_groups)
            if len(gp):
                ax.plot(gp, gd, "o-", ms=3.5, lw=1.0, color="#d62728",
                        label=f"group means (g={config.group_size}, {len(gp)} groups)")
            lo_p, hi_p = np.nanmin(m.perplexity), np.nanmax(m.perplexity)
            if lo_p > 0 and hi_p / lo_p > 5:
                ax.set_xscale("log")
                ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_xlabel("perplexity (log scale)")
            else:
                ax.set_xlabel("perplexity")
            ax.set_ylabel(f"dispersion, layer {lab}")
            ax.set_title(f"{m.model} — {m.texts} — layer {lab}", fontsize=8.5)
            ax.legend(fontsize=7, loc="best")
            ax.grid(alpha=0.25)
    fig.suptitle(f"Dispersion vs perplexity ({config.chunk_len}-token chunks)", fontsize=10.5)
    fig.tight_layout()
    paths = save_figure(fig, out_dir, stem)
    plt.close(fig)
    return paths


def plot_knnlm(run: Any, out_dir, stem: str = "knnlm") -> list:
    """Left: kNN-LM perplexity per point for each λ > 0 (dashed: the base LM); right: the
    dispersion of each candidate point (the label-free ranking).

    Args:
        run: a :class:`~lmgeom.experiments.knnlm.KnnRun`.
        out_dir: the plots folder.
    """
    fig = Figure(figsize=(10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    pts = list(run.points)
    x = np.arange(len(pts))
    grid_keys = next(iter(run.evals.values())).grid
    lams = sorted({lam for _, lam in grid_keys if lam > 0})
    colors = {lam: f"C{i}" for i, lam in enumerate(lams)}
    for tl, lam in grid_keys:
        if lam == 0:
            continue
        ys = [run.evals[p].grid[(tl, lam)] if p in run.evals else np.nan for p in pts]
        ax1.plot(x, ys, "o-" if tl == temperature_label(run.config.temperature) else "s:", ms=4,
                 color=colors[lam], label=f"λ = {lam:g}, T = {tl}")
    ax1.axhline(run.base_perplexity, ls="--", color="k", lw=1,
                label=f"base LM {run.base_perplexity:.3g}")
    ax1.set_xticks(x, pts, rotation=20, fontsize=8)
    ax1.set_ylabel("perplexity (eval)")
    ax1.set_title(f"kNN-LM, k={run.config.k}", fontsize=9)
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.25)
    vals = [run.dispersion[p].pooled for p in pts]
    colors = ["#d62728" if p == run.picked else "#1f77b4" for p in pts]
    ax2.bar(x, vals, color=colors)
    ax2.set_xticks(x, pts, rotation=20, fontsize=8)
    ax2.set_ylabel("dispersion (train tokens)")
    ax2.set_title(f"dispersion ranking: picked {run.picked}, best {run.best} "
                  f"({'match' if run.match else 'no match'})", fontsize=9)
    ax2.grid(alpha=0.25, axis="y")
    fig.suptitle(f"{run.model}: kNN-LM by measurement point", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


__all__ = ["plot_cluster_dispersion", "plot_dispersion_correlation", "plot_knnlm",
           "plot_scatter", "scatter_layers"]


def plot_hardness(result: Any, out_dir, stem: str = "hardness", title: str = "") -> list:
    """Per-text dispersion vs perplexity of a hardness ranking, the lowest-dispersion quantile
    (the texts predicted hardest) in red.

    Args:
        result: a :class:`~lmgeom.experiments.hardness.HardnessResult` (``ranking`` with
            ``dispersion``, ``perplexity``, ``rank``; ``k`` texts per quantile; ``layer``).
        out_dir: the plots folder.

    Returns:
        The written PNG/SVG paths (``[]`` without ranked texts).
    """
    rk = result.ranking
    ok = rk[np.isfinite(rk["dispersion"].astype(float))
            & np.isfinite(rk["perplexity"].astype(float))]
    if ok.empty:
        return []
    matplotlib.use("Agg", force=False)
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    hard = ok["rank"] <= result.k
    ax.scatter(ok.loc[~hard, "perplexity"], ok.loc[~hard, "dispersion"], s=9, alpha=0.45,
               color="#1f77b4", label="texts")
    ax.scatter(ok.loc[hard, "perplexity"], ok.loc[hard, "dispersion"], s=12, alpha=0.8,
               color="#d62728", label=f"lowest dispersion (k={result.k}): predicted hardest")
    lo_p, hi_p = float(ok["perplexity"].min()), float(ok["perplexity"].max())
    if lo_p > 0 and hi_p / lo_p > 5:
        ax.set_xscale("log")
        ax.set_xlabel("perplexity (log scale)")
    else:
        ax.set_xlabel("perplexity")
    ax.set_ylabel(f"dispersion, layer {result.layer}")
    rho = result.spearman[0]
    ax.set_title(title or f"Hardness: dispersion vs perplexity per text (Spearman {rho:+.2f})",
                 fontsize=9.5)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.25)
    fig.tight_layout()
    paths = save_figure(fig, out_dir, stem)
    plt.close(fig)
    return paths
