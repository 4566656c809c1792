"""Figures of cross-model convergence (``lmgeom converge``): the readout-space heatmap over
layer pairs and the full / readout / null bars of matched layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..metrics.regime import parse_setting
from .plots import save_figure


def plot_heatmap(matrix: np.ndarray, labels_a, labels_b, name_a: str, name_b: str,
                 out_dir: Path, stem: str) -> list[Path]:
    fig = Figure(figsize=(max(5, 0.22 * len(labels_b) + 2), max(4, 0.18 * len(labels_a) + 1.5)))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(matrix, aspect="auto", origin="lower", cmap="viridis")
    ax.set_xticks(range(len(labels_b)), labels_b, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels_a)), labels_a, fontsize=7)
    ax.set_xlabel(f"layer of {name_b}".replace("$", r"\$"))
    ax.set_ylabel(f"layer of {name_a}".replace("$", r"\$"))
    ax.set_title("readout-space Spearman of pairwise distances".replace("$", r"\$"), fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def plot_bars(df, name_a: str, name_b: str, out_dir: Path, stem: str) -> list[Path]:
    sub = df[(df.model == name_a) & df.setting.map(lambda s: parse_setting(s).get("vs") == name_b)]
    wide = sub.pivot_table(index=["layer_index", "layer", "setting"], columns="metric", values="value",
                           aggfunc="first").reset_index().sort_values("layer_index")
    if wide.empty:
        return []
    x = np.arange(len(wide))
    fig = Figure(figsize=(max(6, 0.3 * len(wide) + 2), 3.8))
    ax = fig.add_subplot(1, 1, 1)
    w = 0.28
    ax.bar(x - w, wide["conv_full"], w, label="full space")
    ax.bar(x, wide["conv_readout"], w, label="readout spaces")
    ax.bar(x + w, wide["conv_null_mean"], w, yerr=1.96 * wide["conv_null_std"], label="random k-frames (±1.96 sd)")
    ticks = [f"{a}~{parse_setting(s)['layer_b']}" for a, s in zip(wide["layer"], wide["setting"])]
    ax.set_xticks(x, ticks, rotation=90, fontsize=7)
    ax.set_ylabel("Spearman(D_A, D_B)")
    ax.set_title(f"{name_a} vs {name_b}, matched layers".replace("$", r"\$"), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)
