"""The figure of ``lmgeom train --compare ... --seeds ...``: per regulariser, the change of held-out
perplexity and dispersion with its interval over seeds (phrasing only; the numbers come from
:mod:`lmgeom.experiments.finetune.compare`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure

from .plots import PLOT_STYLE, save_figure


def plot_compare(df, out_dir: Path) -> list[Path]:
    """``plots/compare.png|svg``: one panel per ``<metric>_change`` (perplexity, dispersion),
    one bar per regulariser (the first evaluation set), error bars the rows' intervals."""
    panels = [m for m in ("perplexity_change", "dispersion_change") if m in set(df["metric"])]
    if not panels:
        return []
    with rc_context(PLOT_STYLE):
        fig = Figure(figsize=(4.2 * len(panels), 3.4))
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, metric in zip(axes, panels):
            d = df[df["metric"] == metric]
            d = d[d["setting"] == d["setting"].iloc[0]]
            x = np.arange(len(d))
            v = d["value"].to_numpy(float)
            lo, hi = d["ci_low"].to_numpy(float), d["ci_high"].to_numpy(float)
            err = np.array([[v[i] - lo[i] if math.isfinite(lo[i]) else 0.0 for i in x],
                            [hi[i] - v[i] if math.isfinite(hi[i]) else 0.0 for i in x]])
            ax.bar(x, v, yerr=err, capsize=4, color="#4C72B0")
            ax.axhline(0.0, color="k", lw=0.8)
            ax.set_xticks(x, list(d["revision"]), rotation=30, ha="right")
            ax.set_title(metric.replace("_", " ") + " (after − before)")
        fig.tight_layout()
        return save_figure(fig, out_dir, "compare")


__all__ = ["plot_compare"]
