"""Per-layer linear probes (METHODS.md "Linear probes") as tidy rows.

Per layer: standardised features, multinomial logistic regression, stratified k-fold CV with a
fixed seed. Rows: ``probe_acc`` (mean over folds, with a t-interval over folds as CI),
``probe_acc_std`` and ``probe_baseline`` (majority class share) — the report plots them on
the same layer axis as ``pga_z``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from scipy import stats

from ..activations import extract
from ..activations.forward import progress_bar
from ..errors import LmgeomError, TextsError
from ..metrics import probe_accuracy
from ..metrics.sample_size import MIN_PROBE_CLASS, warn_low_sample
from ..models.bundled import DEFAULT_MODEL
from ..results import table
from ..results.console import format_table
from .base import register
from .layer_sweep import LayerSweepConfig, config_dict, fit_k, run_layer_sweep
from .options import ModelOptions, TextOptions


def probe_labels(acts) -> np.ndarray:
    """The label of every row of ``acts`` ``(N,)`` (tokens pooling: each row its text's)."""
    if acts.labels is None:
        raise TextsError("linear probes need labeled texts (a label column, or builtin:domains)")
    y = np.asarray(acts.labels)
    if acts.row_text is not None:  # tokens pooling: each row carries its text's label
        y = y[np.asarray(acts.row_text, dtype=np.int64)]
    return y


def probe_skip_reason(labels, *, folds: int = 5, text_labels=None) -> str | None:
    """Why the linear probes cannot run on these labels (a single class, or a class with
    fewer members than ``folds``), with the ``--n`` that would be enough; None when they can.

    Args:
        labels: the label of every row the probes would see ``(N,)``.
        folds: CV folds.
        text_labels: the label of every text (for the ``--n`` suggestion; default ``labels``).
    """
    y = np.asarray(labels)
    classes, counts = np.unique(y, return_counts=True)
    names = [c.item() if hasattr(c, "item") else c for c in classes]
    if classes.size < 2:
        one = f" ({names[0]!r})" if names else ""
        return (f"linear probes skipped: the texts have a single label{one}; a probe needs at "
                "least 2 classes (the rest of the run goes on)")
    small = counts < folds
    if not small.any():
        return None
    tl = y if text_labels is None else np.asarray(text_labels)
    _, tcounts = np.unique(tl, return_counts=True)
    n_texts = int(tcounts.sum())
    lo = max(1, int(tcounts.min()))
    if int(tcounts.max()) - int(tcounts.min()) <= 1:  # a label-balanced sample
        need = folds * int(tcounts.size)
    else:
        need = math.ceil(folds * n_texts / lo)
    desc = ", ".join(f"{c}: {int(k)}" for c, k in zip(names, counts))
    return (f"linear probes skipped: {int(small.sum())} of {classes.size} classes have fewer "
            f"than folds={folds} members ({desc}; {int(counts.sum())} rows); --n {need} or more "
            f"would give every class {folds} (or lower --folds); the rest of the run goes on")


def probe_rows(model, acts, *, folds: int = 5, seed: int = 0, C: float = 1.0, revision: str = "",
               progress: bool | None = None) -> list[dict]:
    y = probe_labels(acts)
    L = model.n_blocks
    smallest = int(np.unique(np.asarray(y), return_counts=True)[1].min()) if len(y) else 0
    flag = "small_class" if smallest < MIN_PROBE_CLASS else ""
    if flag:
        warn_low_sample(f"{model.name}: the smallest probe class has {smallest} texts (fewer "
                        f"than {MIN_PROBE_CLASS}): each held-out fold holds one or two of them, "
                        "so the accuracy and its interval are noise; use more texts per label "
                        "(marked in the 'flag' column)")
    rows = []
    bar = progress_bar(len(acts.layers), f"probes {model.name}", progress)
    for i, label in enumerate(acts.layers):
        try:
            r = probe_accuracy(acts.states[i], y, folds=folds, seed=seed, C=C)
        except LmgeomError as exc:
            raise type(exc)(f"layer {label}: {exc}") from exc
        idx = model.point_index(label)
        accs = np.asarray(r.fold_accuracies, dtype=float)
        half = stats.t.ppf(0.975, len(accs) - 1) * accs.std(ddof=1) / math.sqrt(len(accs)) if len(accs) > 1 else math.nan
        common = dict(model=model.name, revision=revision, layer=label, layer_index=idx,
                      depth=idx / (L + 1), setting=f"folds={folds}", seed=seed, n=len(y), flag=flag)
        rows += [
            table.row(metric="probe_acc", value=float(accs.mean()), ci_low=float(accs.mean() - half),
                      ci_high=float(accs.mean() + half), **common),
            table.row(metric="probe_acc_std", value=float(accs.std(ddof=1)) if len(accs) > 1 else math.nan, **common),
            table.row(metric="probe_baseline", value=float(r.majority_baseline), **common),
        ]
        bar.update(1)
    bar.close()
    return rows


@register
@dataclass(frozen=True)
class ProbeExperiment:
    """``lmgeom probe``: per-layer linear probes with the PGA z beside them.

    Attributes:
        spec: the model spec.
        texts: which (labeled) texts.
        model: how the model loads.
        layers: extraction and PGA settings (spectra and logit lens are off).
        folds: stratified CV folds.
        C: inverse L2 regularisation strength.
        cache: use the activation cache.
    """

    command: ClassVar[str] = "probe"
    table: ClassVar[str] = "probes"

    spec: str = DEFAULT_MODEL
    texts: TextOptions = field(default_factory=TextOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    layers: LayerSweepConfig = field(default_factory=LayerSweepConfig)
    folds: int = 5
    C: float = 1.0
    cache: bool = True

    def __post_init__(self) -> None:
        if self.texts.n is not None:  # at most n texts: a k that cannot fit them stops here
            fit_k(self.layers.k, n=self.texts.n, ccr=self.layers.ccr)

    def settings(self) -> dict[str, Any]:
        return {"model": self.spec, "revision": self.model.revision, "texts": self.texts.spec,
                "n": self.texts.n, "dtype": self.model.dtype, "folds": self.folds, "C": self.C,
                "sweep": config_dict(self.layers), "label_column": self.texts.label_column}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> ProbeResult:
        t0 = time.perf_counter()
        cfg, rev = self.layers, self.model.revision or ""
        texts = self.texts.load()
        fit_k(cfg.k, n=len(texts), ccr=cfg.ccr)  # a k that cannot fit stops before the model
        model = self.model.load(self.spec)
        cfg, note = cfg.fitted(len(texts), model.width)
        if note is not None:
            warn_low_sample(f"{model.name}: {note}")
        acts = extract(model, texts, layers=cfg.layers, pooling=cfg.pooling,
                       max_length=cfg.max_length, batch_size=cfg.batch_size, cache=self.cache,
                       seed=cfg.seed, progress=progress)
        t = time.perf_counter()
        prows = probe_rows(model, acts, folds=self.folds, seed=self.texts.seed, C=self.C,
                           revision=rev, progress=progress)
        t_probe = time.perf_counter() - t
        pga, tm = run_layer_sweep(model, acts, cfg, work_dir=work_dir, revision=rev,
                                  progress=progress)
        pga = pga[pga.metric.isin(["pga_z", "null_z_low", "null_z_high", "p_value",
                                   "pc1_share", "pc1_baseline"])]
        df = pd.concat([table.frame(prows), pga], ignore_index=True)
        manifest = {"models": [{**model.describe(), "activations_key": acts.key}],
                    "texts": texts.source, "n_texts": len(texts), "texts_hash": texts.hash,
                    "labels": texts.label_counts(),
                    "seeds": {"cv_folds": self.texts.seed, "pga": cfg.seed},
                    "timings": {"probe_s": t_probe, "pga_s": tm["metrics_s"],
                                "total_s": time.perf_counter() - t0}}
        return ProbeResult(self, df, manifest, model.name, texts.source, len(texts))


@dataclass
class ProbeResult:
    """Probe rows and the PGA rows beside them (``probes.parquet``)."""

    config: ProbeExperiment
    frame: Any
    entries: dict[str, Any]
    model_name: str
    source: str
    n_texts: int

    def rows(self):
        return self.frame

    def manifest(self) -> dict[str, Any]:
        return dict(self.entries)

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        from ..report.html import write_report

        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom probe — {self.config.spec}")

    def summary(self) -> str:
        c = self.config
        wide = self.frame.pivot_table(index=["layer_index", "layer"], columns="metric",
                                      values="value", sort=True, aggfunc="first")
        rows = [{"layer": layer, "accuracy": r["probe_acc"], "± std": r["probe_acc_std"],
                 "baseline": r["probe_baseline"],
                 f"PGA z (ccr={c.layers.ccr[0]})": r.get("pga_z", float("nan"))}
                for (_, layer), r in wide.iterrows()]
        return (f"Linear probes — {self.model_name} on {self.source} ({self.n_texts} texts, "
                f"{c.folds}-fold, seed {c.texts.seed})\n" + format_table(rows, floatfmt="{:.3f}"))
