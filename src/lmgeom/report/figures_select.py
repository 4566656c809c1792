"""Figure of the dispersion-gap selection (``lmgeom select``): G against measured bits/byte."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from .plots import save_figure


def plot_select(run, out_dir, stem: str = "select") -> list:
    """G (x) against measured bits per byte (y), one panel per variant; no panel without
    perplexities."""
    bpb = run.bits_per_byte
    variants = run.variants
    if not np.isfinite(bpb).any():
        variants = ()
    k = max(1, len(variants))
    fig = Figure(figsize=(4.8 * k, 3.8))
    axes = fig.subplots(1, k, squeeze=False)[0]
    if not variants:
        g = run.gaps("W_U")
        ax = axes[0]
        ax.bar(np.arange(len(g)), g)
        ax.set_xticks(np.arange(len(g)), [r.candidate.name for r in run.results], rotation=30,
                      fontsize=7)
        ax.set_ylabel("dispersion gap G (W_U)")
    groups = list(dict.fromkeys(r.candidate.group for r in run.results))
    for ax, v in zip(axes, variants):
        g = run.gaps(v)
        for gi, grp in enumerate(groups):
            ix = [i for i, r in enumerate(run.results) if r.candidate.group == grp]
            style = "o-" if grp and len(ix) > 1 else "o"
            ax.plot(g[ix], bpb[ix], style, color=f"C{gi}", ms=4, lw=0.8,
                    label=grp or None)
        if len(run.results) <= 10:
            for x, y, r in zip(g, bpb, run.results):
                ax.annotate(r.candidate.name, (x, y), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        if any(groups):
            ax.legend(fontsize=7, title="width (line: training steps)", title_fontsize=7)
        a = run.agreement.get(v)
        extra = ""
        if a is not None and math.isfinite(a.value):
            extra = f"ρ = {a.value:+.2f} (n={a.n})"
            if math.isfinite(a.low):
                extra += f" [{a.low:+.2f}, {a.high:+.2f}]"
        ax.set_title(f"variant={v}  {extra}", fontsize=9)
        ax.set_xlabel(f"dispersion gap G ({v})")
        ax.set_ylabel("bits/byte, held-out domain text (lower = better)", fontsize=8)
        ax.grid(alpha=0.25)
    fig.suptitle(f"Dispersion gap vs measured quality, domain={run.config.domain_name}",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)
