"""Cross-model convergence in the readout space (METHODS.md "Cross-model convergence").

Models with different tokenizers are compared on per-text pooled states of the same texts.
For every pair of models, a layer map says which layers to compare: by default each layer of
model A against the layer of model B at the nearest relative depth (``index / (L+1)``), plus
``final`` against ``final``. Matched pairs get the full treatment (full / readout / null with a
z); the heatmap of readout-space Spearman covers every layer pair with a small null
(``heatmap_null`` draws, z not reported there).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, LmgeomError
from ..results import table


@dataclass(frozen=True)
class ConvergeConfig:
    k: int = 100
    n_null: int = 100
    ccr: int = 1
    pairs: int | None = None
    seed: int = 0
    layer_map: str = "depth"  # "depth" | "all" | "A:B,A:B"
    heatmap: bool = True
    heatmap_pairs: int | None = 50_000


def matched_layers(labels_a, labels_b, index_a, index_b, L_a: int, L_b: int) -> list[tuple[str, str]]:
    """Nearest-relative-depth map from A's layers to B's, plus final ↔ final."""
    out = []
    depth_b = np.array([index_b(lb) / (L_b + 1) for lb in labels_b])
    for la in labels_a:
        if la == "final":
            continue
        da = index_a(la) / (L_a + 1)
        lb = labels_b[int(np.argmin(np.abs(depth_b - da)))]
        if lb == "final":
            lb = str(L_b)
        out.append((la, lb))
    if "final" in labels_a and "final" in labels_b:
        out.append(("final", "final"))
    return out


def parse_layer_map(spec: str, labels_a, labels_b) -> list[tuple[str, str]]:
    out = []
    for item in spec.split(","):
        if ":" not in item:
            raise ConfigError(f"layer map entries look like 10:6 (A's layer : B's layer), got {item!r}")
        a, b = (s.strip() for s in item.split(":", 1))
        if a not in labels_a or b not in labels_b:
            raise ConfigError(f"layer map entry {item!r}: unknown layer (A has {labels_a[0]}..{labels_a[-1]}, "
                              f"B has {labels_b[0]}..{labels_b[-1]})")
        out.append((a, b))
    return out


def converge_pair(model_a, acts_a, basis_a, model_b, acts_b, basis_b, config: ConvergeConfig,
                  progress: bool | None = None) -> tuple[list[dict], np.ndarray | None]:
    """Rows for one model pair, and the readout-Spearman matrix over all layer pairs."""
    from ..activations.core import progress_bar
    from ..metrics import cross_model_alignment

    if acts_a.texts_hash != acts_b.texts_hash:
        raise ConfigError("the two models must see the same texts")
    la, lb = list(acts_a.layers), list(acts_b.layers)
    if config.layer_map == "depth":
        pairs = matched_layers(la, lb, model_a.point_index, model_b.point_index,
                               model_a.n_blocks, model_b.n_blocks)
    elif config.layer_map == "all":
        pairs = list(itertools.product(la, lb))
    else:
        pairs = parse_layer_map(config.layer_map, la, lb)
    rows: list[dict] = []
    L = model_a.n_blocks
    bar = progress_bar(len(pairs), f"converge {model_a.name}~{model_b.name}", progress)
    for a, b in pairs:
        try:
            r = cross_model_alignment(acts_a.layer(a), acts_b.layer(b), basis_a, basis_b,
                                      n_null=config.n_null, ccr=config.ccr, pairs=config.pairs,
                                      seed=config.seed)
        except LmgeomError as exc:
            raise type(exc)(f"layers {a} ~ {b}: {exc}") from exc
        idx = model_a.point_index(a)
        setting = f"vs={model_b.name};layer_b={b};ccr={config.ccr}"
        common = dict(model=model_a.name, layer=a, layer_index=idx, depth=idx / (L + 1),
                      setting=setting, n=float(r.pairs))
        rows += [
            table.row(metric="conv_full", value=r.rho_full, **common),
            table.row(metric="conv_readout", value=r.rho_readout, **common),
            table.row(metric="conv_null_mean", value=r.null_mean, seed=config.seed, **common),
            table.row(metric="conv_null_std", value=r.null_std, seed=config.seed, **common),
            table.row(metric="conv_z", value=r.z, seed=config.seed, **common),
            table.row(metric="conv_p_value", value=r.p_value, seed=config.seed, **common),
        ]
        bar.update(1)
    bar.close()
    matrix = None
    if config.heatmap:
        matrix = np.full((len(la), len(lb)), np.nan)
        bar = progress_bar(len(la) * len(lb), "heatmap", progress)
        for i, a in enumerate(la):
            for j, b in enumerate(lb):
                r = cross_model_alignment(acts_a.layer(a), acts_b.layer(b), basis_a, basis_b,
                                          n_null=2, ccr=config.ccr, pairs=config.heatmap_pairs,
                                          seed=config.seed)
                matrix[i, j] = r.rho_readout
                bar.update(1)
        bar.close()
    return rows, matrix


def plot_heatmap(matrix: np.ndarray, labels_a, labels_b, name_a: str, name_b: str,
                 out_dir: Path, stem: str) -> list[Path]:
    from matplotlib.figure import Figure

    from ..report.plots import save_figure

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
    from matplotlib.figure import Figure

    from ..report.plots import save_figure

    sub = df[(df.model == name_a) & df.setting.str.startswith(f"vs={name_b};")]
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
    ticks = [f"{a}~{s.split('layer_b=')[1].split(';')[0]}" for a, s in zip(wide["layer"], wide["setting"])]
    ax.set_xticks(x, ticks, rotation=90, fontsize=7)
    ax.set_ylabel("Spearman(D_A, D_B)")
    ax.set_title(f"{name_a} vs {name_b}, matched layers".replace("$", r"\$"), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def summary_rows(df) -> list[dict[str, Any]]:
    wide = df.pivot_table(index=["model", "layer_index", "layer", "setting"], columns="metric",
                          values="value", aggfunc="first").reset_index().sort_values(["model", "layer_index"])
    return [{"model A": r.model, "layer A": r.layer,
             "model B": r.setting.split(";")[0][3:], "layer B": r.setting.split("layer_b=")[1].split(";")[0],
             "full": r.conv_full, "readout": r.conv_readout, "null mean": r.conv_null_mean,
             "null sd": r.conv_null_std, "z": r.conv_z} for r in wide.itertuples()]
