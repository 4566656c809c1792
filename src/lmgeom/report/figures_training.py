"""Figures of the push-away / squeeze fine-tuning comparison (``lmgeom train``)."""

from __future__ import annotations

from pathlib import Path

from matplotlib import rc_context
from matplotlib.figure import Figure

from .plots import PLOT_STYLE, save_figure

_ARM_COLOURS = {"none": "#7f7f7f", "push-away": "#d62728", "squeeze": "#1f77b4"}


def plot_curves(df, out_dir: Path) -> list[Path]:
    """Perplexity and dispersion (rows) per evaluation set (columns) over steps, one line per
    arm; with two training domains one more column shows their held-out cross-domain
    distance. Returns ``[png, svg]`` (``[]`` when there is nothing to draw)."""
    ev = df[df.metric.isin(["perplexity", "dispersion"]) & (df["eval"] != "train")]
    if ev.empty:
        return []
    cross = df[df.metric == "cross_dispersion"]
    panels = [(name, m) for name in dict.fromkeys(ev["eval"]) for m in ("perplexity", "dispersion")]
    panels += [(name, "cross_dispersion") for name in dict.fromkeys(cross["eval"])]
    cols = list(dict.fromkeys(name for name, _ in panels))
    with rc_context(PLOT_STYLE):
        fig = Figure(figsize=(3.4 * len(cols) + 0.6, 5.2), constrained_layout=True)
        axes = fig.subplots(2, len(cols), squeeze=False)
        for j, name in enumerate(cols):
            mine = [m for n, m in panels if n == name]
            for i in range(2):
                ax = axes[i][j]
                if i >= len(mine):
                    ax.set_visible(False)
                    continue
                metric = mine[i]
                sub = df[(df["eval"] == name) & (df.metric == metric)]
                for arm, g in sub.groupby("arm", sort=False):
                    g = g.sort_values("step")
                    ax.plot(g.step, g.value, marker="o", ms=3, lw=1.4, label=str(arm),
                            color=_ARM_COLOURS.get(str(arm)))
                title = str(name).replace("|", " vs ")
                ax.set_title(title.replace("$", "\\$") if i == 0 else "", fontsize=8)
                ax.set_ylabel(metric.replace("_", " "))
                ax.set_xlabel("step")
                ax.grid(alpha=0.3)
        axes[0][0].legend(title="arm")
        fig.suptitle("Held-out perplexity and token-level dispersion over training")
        return save_figure(fig, out_dir, "train_curves")
