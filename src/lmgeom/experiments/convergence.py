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
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..activations import extract
from ..activations.forward import progress_bar
from ..errors import ConfigError, LmgeomError
from ..metrics import cross_model_alignment
from ..metrics.regime import parse_setting
from ..metrics.sample_size import describe_flag, warn_low_sample
from ..results import table
from ..results.console import flag_footer, format_table, mark_flags
from .base import register
from .layer_sweep import LayerSweepConfig, fit_k, model_basis, sweep_rows
from .options import ModelOptions, TextOptions


@dataclass(frozen=True)
class ConvergeConfig:
    #: readout dimension: ``None`` = min(100, fitted to the rows), as every command fits it
    #: (:func:`~.layer_sweep.fit_k`); an explicit k that does not fit is refused
    k: int | None = None
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
                                      seed=config.seed, label=f"layers {a} ~ {b}",
                                      names=(model_a.name, model_b.name))
        except LmgeomError as exc:
            raise type(exc)(f"layers {a} ~ {b}: {exc}") from exc
        idx = model_a.point_index(a)
        setting = f"vs={model_b.name};layer_b={b};ccr={config.ccr}"
        common = dict(model=model_a.name, layer=a, layer_index=idx, depth=idx / (L + 1),
                      setting=setting, n=float(r.pairs), flag=r.flag)
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
                # only rho_readout is used (no z): no low-sample warning for n_null=2
                r = cross_model_alignment(acts_a.layer(a), acts_b.layer(b), basis_a, basis_b,
                                          n_null=2, ccr=config.ccr, pairs=config.heatmap_pairs,
                                          seed=config.seed, warn=False)
                matrix[i, j] = r.rho_readout
                bar.update(1)
        bar.close()
    return rows, matrix


def summary_rows(df) -> list[dict[str, Any]]:
    """One row per matched layer pair, with the ``flag`` column of :func:`mark_flags` when a
    z rests on too little data."""
    index = ["model", "layer_index", "layer", "setting"]
    wide = df.pivot_table(index=index, columns="metric", values="value",
                          aggfunc="first").reset_index().sort_values(["model", "layer_index"])
    flags = (df[df["metric"] == "conv_z"].set_index(index)["flag"].fillna("").astype(str)
             if "flag" in df.columns else None)
    rows = [{"model A": r.model, "layer A": r.layer,
             "model B": parse_setting(r.setting)["vs"], "layer B": parse_setting(r.setting)["layer_b"],
             "full": r.conv_full, "readout": r.conv_readout, "null mean": r.conv_null_mean,
             "null sd": r.conv_null_std, "z": r.conv_z} for r in wide.itertuples()]
    marks = [str(flags.get((r.model, r.layer_index, r.layer, r.setting), ""))
             if flags is not None else "" for r in wide.itertuples()]
    return mark_flags(rows, marks)


@register
@dataclass(frozen=True)
class ConvergeExperiment:
    """``lmgeom converge``: every pair of models on the same texts.

    Attributes:
        models: at least two model specs.
        texts: the shared texts.
        model: how the models load.
        config: convergence settings (k, null, CCR, pairs, layer map, heatmap).
        layers, pooling, max_length, batch_size: extraction.
        cache: use the activation cache.
    """

    command: ClassVar[str] = "converge"
    table: ClassVar[str] = "converge"

    models: tuple[str, ...] = ("smollm2-135m", "gemma3-270m")
    texts: TextOptions = field(default_factory=TextOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    config: ConvergeConfig = field(default_factory=ConvergeConfig)
    layers: str = "all"
    pooling: str = "last"
    max_length: int = 128
    batch_size: int = 32
    cache: bool = True

    def __post_init__(self) -> None:
        if len(self.models) < 2:
            raise ConfigError("give at least two models (--model A --model B)")
        object.__setattr__(self, "models", tuple(self.models))
        if self.texts.n is not None:  # an explicit k that cannot fit the rows stops here
            fit_k(self.config.k, n=sweep_rows(self.texts.n, self.pooling), ccr=(self.config.ccr,))

    def settings(self) -> dict[str, Any]:
        return {"models": list(self.models), "texts": self.texts.spec, "n": self.texts.n,
                "dtype": self.model.dtype, "config": self.config.__dict__,
                "pooling": self.pooling, "max_length": self.max_length}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> ConvergeResult:
        t0 = time.perf_counter()
        texts = self.texts.load()
        fit_k(self.config.k, n=sweep_rows(len(texts), self.pooling), ccr=(self.config.ccr,))
        extracted = []
        for spec in self.models:
            m = self.model.load(spec)
            acts = extract(m, texts, layers=self.layers, pooling=self.pooling,
                           max_length=self.max_length, batch_size=self.batch_size,
                           cache=self.cache, seed=self.config.seed, progress=progress)
            extracted.append((m, acts))
        # one k for every model, fitted to the rows and the narrowest width, said once
        rows_n = min(int(a.states.shape[1]) for _, a in extracted)
        k, k_note = fit_k(self.config.k, n=rows_n, ccr=(self.config.ccr,),
                          d=min(m.width for m, _ in extracted))
        if k_note is not None:
            warn_low_sample(f"converge: {k_note}")
        config = replace(self.config, k=k)
        loaded = [(m, a, model_basis(m, LayerSweepConfig(k=k))) for m, a in extracted]
        rows: list[dict[str, Any]] = []
        pairs = []
        for (ma, aa, ba), (mb, ab, bb) in itertools.combinations(loaded, 2):
            r, matrix = converge_pair(ma, aa, ba, mb, ab, bb, config, progress=progress)
            rows += r
            pairs.append((ma.name, mb.name, list(aa.layers), list(ab.layers), matrix,
                          table.frame(r)))
        entries = {"models": [m.describe() for m, _, _ in loaded], "texts": texts.source,
                   "n_texts": len(texts), "texts_hash": texts.hash,
                   "seeds": {"null_and_pairs": self.config.seed},
                   "k": k, "k_asked": self.config.k, "k_note": k_note,
                   "timings": {"total_s": time.perf_counter() - t0}}
        return ConvergeResult(self, table.frame(rows), pairs, entries, texts.source, len(texts),
                              k, k_note)


@dataclass
class ConvergeResult:
    """The convergence rows of every model pair, with what their figures need."""

    config: ConvergeExperiment
    frame: Any
    pairs: list[tuple[Any, ...]]
    entries: dict[str, Any]
    source: str
    n_texts: int
    k: int | None = None
    k_note: str | None = None

    def rows(self):
        return self.frame

    def manifest(self) -> dict[str, Any]:
        return dict(self.entries)

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        from ..report.figures_convergence import plot_bars, plot_heatmap
        from ..report.html import write_report

        figures = []
        for name_a, name_b, la, lb, matrix, df_pair in self.pairs:
            stem = f"converge-{len(figures)}"
            if matrix is not None:
                figures.append((f"Readout-space Spearman, {name_a} × {name_b}",
                                plot_heatmap(matrix, la, lb, name_a, name_b, folder.plots,
                                             stem + "-heatmap"),
                                "Every layer pair; brighter = the two models' distance "
                                "structures agree more inside their readout subspaces."))
            figures.append((f"Full vs readout vs null, {name_a} × {name_b}",
                            plot_bars(df_pair, name_a, name_b, folder.plots, stem + "-bars"),
                            "Matched layers (nearest relative depth, plus final~final)."))
        return write_report(folder.path, self.frame, manifest,
                            title="lmgeom converge — " + " vs ".join(self.config.models),
                            extra_figures=figures)

    def summary(self) -> str:
        c = self.config.config
        rows = summary_rows(self.frame)
        flags = self.frame.loc[self.frame["metric"] == "conv_z", "flag"] \
            if "flag" in self.frame.columns else []
        footer = flag_footer(flags, describe_flag, "in the rows marked")
        return (f"Cross-model convergence on {self.source} ({self.n_texts} texts), "
                f"k={self.k if self.k is not None else c.k}"
                + (f" ({self.k_note})" if self.k_note else "")
                + f", CCR-{c.ccr}, n_null={c.n_null}, seed={c.seed}\n"
                + format_table(rows, floatfmt="{:.3f}") + (f"\n{footer}" if footer else ""))
