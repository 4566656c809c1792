"""``analyze``: the main job — the layer sweep of one or more models, with probes and a report.

One pipeline, :func:`analyze_model` (load → extract through the cache → per-layer metrics →
probes), shared by this experiment and by every job of :mod:`lmgeom.experiments.sweep`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ..activations import extract
from ..engines import EngineConfig, make_engine
from ..errors import ConfigError
from ..metrics.sample_size import describe_flag, join_flags, split_flags, warn_low_sample
from ..models.bundled import DEFAULT_MODEL
from ..results import table
from ..results.console import flag_footer, format_table, mark_flags
from ..texts import nested_sample_indices
from .base import register
from .layer_sweep import (
    LayerSweepConfig,
    config_dict,
    fit_k,
    layer_span,
    model_basis,
    run_layer_sweep,
    sweep_rows,
)
from .options import ModelOptions, TextOptions
from .probes import probe_labels, probe_rows, probe_skip_reason
from .samples import sample_rows

#: ``k = "auto"``: min(AUTO_K_MAX, width // AUTO_K_DIV)
AUTO_K_MAX = 100
AUTO_K_DIV = 4


def resolve_k(k: int | str, width: int) -> int:
    """The readout dimension for a model of ``width``: ``k`` itself, or for ``"auto"``
    ``min(100, width // 4)`` (the paper's k = 100 where d >= 400, a quarter of d below)."""
    if isinstance(k, str):
        if k != "auto":
            try:
                k = int(k)
            except ValueError as exc:
                raise ConfigError(f"k must be an integer or 'auto', got {k!r}") from exc
        else:
            return max(1, min(AUTO_K_MAX, int(width) // AUTO_K_DIV))
    if int(k) < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    return int(k)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch and BLAS use ``n`` threads inside the block (``None``: leave as is)."""
    if n is None:
        yield
        return
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        limits: Any = contextlib.nullcontext()
    else:
        limits = threadpool_limits(limits=int(n))
    try:
        with limits:
            yield
    finally:
        torch.set_num_threads(prev)


@dataclass
class ModelAnalysis:
    """What :func:`analyze_model` produced for one model: its rows, facts, timings."""

    frame: pd.DataFrame
    info: dict[str, Any]
    timings: dict[str, float]
    k: int
    samples: pd.DataFrame | None = None
    #: with ``ladder``: the rows of each smaller n (column ``n_texts``), else None
    ladder: pd.DataFrame | None = None


def _sweep(model, acts, texts, cfg: LayerSweepConfig, *, probes: bool, folds: int,
           revision: str, name: str, work_dir, progress) -> tuple[list[pd.DataFrame],
                                                                   dict[str, float], str | None]:
    """The layer sweep of ``acts`` and, when asked and the labels allow it, the probes."""
    df, timings = run_layer_sweep(model, acts, cfg, work_dir=work_dir, revision=revision,
                                  progress=progress)
    frames, skipped = [df], None
    if probes:
        # too few texts per class for the optional probes: skip them, keep the run
        skipped = probe_skip_reason(probe_labels(acts), folds=folds,
                                    text_labels=getattr(texts, "labels", None))
        if skipped is not None:
            warn_low_sample(f"{name}: {skipped}")
        else:
            t = time.perf_counter()
            frames.append(table.frame(probe_rows(model, acts, folds=folds, seed=cfg.seed,
                                                 revision=revision, progress=progress)))
            timings["probes_s"] = time.perf_counter() - t
    return frames, timings, skipped


def _ladder(model, acts, texts, config: LayerSweepConfig, sizes, **kw) -> pd.DataFrame | None:
    """The sweep (and probes) again on nested seeded subsets of the texts, one per size in
    ``sizes`` below n: the states sliced from ``acts``, no forward pass; k fitted per size.
    ``sizes`` may be the subsets themselves (``{n: positions in texts}``, as
    :meth:`~.options.TextOptions.nested_picks` gives them)."""

    if isinstance(sizes, Mapping):
        picks = {int(m): np.asarray(v, dtype=np.int64) for m, v in sizes.items()
                 if int(m) < len(texts)}
        sizes = sorted(picks)
    else:
        sizes = sorted({int(m) for m in sizes if int(m) < len(texts)})
        picks = nested_sample_indices(len(texts), sizes, labels=getattr(texts, "labels", None),
                                      seed=config.seed) if sizes else {}
    if not sizes:
        return None
    frames = []
    for m in sizes:
        sub = texts.subset(picks[m])
        cfg, note = config.rung(m, model.width)
        if note is not None:
            warn_low_sample(f"{kw['name']} (ladder n = {m}): {note}")
        parts, _, _ = _sweep(model, acts.subset(picks[m], texts_hash=sub.hash), sub, cfg, **kw)
        frames.append(pd.concat(parts, ignore_index=True).assign(n_texts=m))
    return pd.concat(frames, ignore_index=True)


def analyze_model(
    spec: str,
    texts,
    config: LayerSweepConfig,
    *,
    model_options: ModelOptions | None = None,
    hub_revision: str | None = None,
    revision: str = "",
    label: str | None = None,
    k: int | str | None = None,
    probes: bool = False,
    folds: int = 5,
    cache: bool = True,
    threads: int | None = None,
    work_dir: str | Path | None = None,
    progress: bool | None = None,
    log_samples: bool = False,
    ladder: tuple[int, ...] = (),
) -> ModelAnalysis:
    """One model through the whole pipeline: load, extract (through the activation cache),
    per-layer metrics (:func:`~.layer_sweep.run_layer_sweep`, resumable per layer in
    ``work_dir``), and linear probes when asked.

    Plain, picklable arguments and results, so an engine can run it as one remote task.

    Args:
        spec: what :func:`~lmgeom.load_model` gets (bundled name, hub id, folder, .gguf).
        texts: the :class:`~lmgeom.texts.TextSet`.
        config: per-layer metric settings.
        model_options: loading options; ``hub_revision`` overrides its revision.
        revision: the ``revision`` column of the rows.
        label: the ``model`` column (``None``: the model's name).
        k: readout dimension (``None``: ``config.k``; ``"auto"``: min(100, d // 4)), fitted to
            the texts by :func:`~.layer_sweep.fit_k` (an explicit k that does not fit raises
            :class:`ConfigError` before the forward pass).
        probes: add the per-layer linear probes (the texts need labels).
        folds: CV folds of the probes.
        cache: use the activation cache.
        threads: torch / BLAS threads inside the call (``None``: leave as is).
        work_dir: folder of the per-layer metric cache (``None``: none).
        progress: progress bars.
        log_samples: also compute the per-text rows of :mod:`~.samples` (one more forward
            pass, for the per-text perplexity).
        ladder: smaller numbers of texts to sweep again on nested seeded subsets of
            ``texts`` (their states sliced from this extraction; ``ModelAnalysis.ladder``).
    """
    opts = model_options or ModelOptions()
    if hub_revision is not None:
        opts = replace(opts, revision=hub_revision)
    timings: dict[str, float] = {}
    with torch_threads(threads):
        t = time.perf_counter()
        model = opts.load(spec)
        timings["load_s"] = time.perf_counter() - t
        cfg = replace(config, k=config.k if k is None else k)
        t = time.perf_counter()
        acts = extract(model, texts, layers=cfg.layers, pooling=cfg.pooling,
                       max_length=cfg.max_length, batch_size=cfg.batch_size, cache=cache,
                       seed=cfg.seed, progress=progress)
        timings["extract_s"] = time.perf_counter() - t
        # k is fitted to the rows a layer holds (one per text, or the sampled tokens) and the
        # width; k does not change the forward pass, so this can wait for the exact row count
        cfg, note = cfg.fitted(int(acts.states.shape[1]), model.width)
        if note is not None:
            warn_low_sample(f"{label or model.name}: {note}")
        kk = cfg.k
        kw = {"probes": probes, "folds": folds, "revision": revision,
              "name": label or model.name, "work_dir": work_dir, "progress": progress}
        frames, tm, skipped = _sweep(model, acts, texts, cfg, **kw)
        timings.update(tm)
        t = time.perf_counter()
        # the rungs: no logit lens (no claim reads it; it would repeat the V-wide readout)
        ladder_rows = _ladder(model, acts, texts, replace(cfg, logit_lens=False), ladder,
                              **kw) if ladder else None
        if ladder_rows is not None:
            timings["ladder_s"] = time.perf_counter() - t
        samples = None
        if log_samples:
            t = time.perf_counter()
            samples = sample_rows(model, texts, acts, model_basis(model, cfg), revision=revision,
                                  label=label, progress=progress)
            timings["samples_s"] = time.perf_counter() - t
        info = {**model.describe(), "width": model.width, "n_blocks": model.n_blocks, "k": kk,
                "k_note": note,
                "weights_sha256": model.identity.get("weights_sha256"),
                "commit": model.identity.get("commit"), "model_type": model.model_type,
                "vocab_size": model.vocab_size, "activations_key": acts.key,
                "n_truncated": acts.n_truncated,
                "batches_cached": acts.timings["batches_cached"],
                "host": socket.gethostname(), "pid": os.getpid()}
        if skipped is not None:
            info["probes_skipped"] = skipped
        del model, acts
    out = pd.concat(frames, ignore_index=True)
    if label is not None:
        out["model"] = label
    if label is not None and ladder_rows is not None:
        ladder_rows["model"] = label
    return ModelAnalysis(out, info, timings, kk, samples, ladder_rows)


@register
@dataclass(frozen=True)
class AnalyzeConfig:
    """``lmgeom analyze``: every setting of the main job (plain values; the manifest holds them).

    Attributes:
        models: model specs, one row group per model.
        texts: which texts.
        model: how models load (revision, dtype, device ...).
        layers: per-layer metric settings (PGA, CCR levels, pooling ...).
        probes: run the per-layer linear probes when the texts have labels.
        folds: CV folds of the probes.
        cache: use the activation cache.
        engine: where the models run (one task per model on ``ray``).
        log_samples: also write ``samples.parquet``, one row per text (:mod:`~.samples`);
            not part of the run's signature (it adds a file, changes no number).
        ladder: smaller numbers of texts whose sweep is repeated on nested seeded subsets of
            the texts, states sliced from the one extraction (``ladder`` table; ``claims
            --n-ladder``).
    """

    command: ClassVar[str] = "analyze"
    table: ClassVar[str] = "layers"

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    texts: TextOptions = field(default_factory=TextOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    layers: LayerSweepConfig = field(default_factory=LayerSweepConfig)
    probes: bool = True
    folds: int = 5
    cache: bool = True
    engine: EngineConfig = field(default_factory=EngineConfig)
    log_samples: bool = False
    ladder: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError("give at least one model")
        if self.log_samples and self.layers.pooling == "tokens":
            raise ConfigError("--log-samples needs one vector per text (pooling last or mean), "
                              "not pooling tokens")
        object.__setattr__(self, "models", tuple(self.models))
        if self.texts.n is not None:  # at most n texts: a k that cannot fit them stops here
            fit_k(self.layers.k, n=sweep_rows(self.texts.n, self.layers.pooling),
                  ccr=self.layers.ccr)

    def settings(self) -> dict[str, Any]:
        return {"probes": self.probes, "folds": self.folds, "models": list(self.models),
                "revision": self.model.revision, "texts": self.texts.spec, "n": self.texts.n,
                "dtype": self.model.dtype, "sweep": config_dict(self.layers),
                "text_column": self.texts.text_column, "label_column": self.texts.label_column,
                "split": self.texts.split, **({"ladder": list(self.ladder)} if self.ladder else {})}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> AnalyzeResult:
        timings: dict[str, float] = {}
        t = time.perf_counter()
        texts = self.texts.load()
        timings["texts_s"] = time.perf_counter() - t
        # k against n before any model loads: an explicit k that cannot fit stops here
        fit_k(self.layers.k, n=sweep_rows(len(texts), self.layers.pooling), ccr=self.layers.ccr)
        probes = texts.labels is not None and self.probes
        # the ladder's subsets, decided here where the texts' options are known (with
        # ``within``: the texts each smaller n loads on its own)
        ladder = (self.texts.nested_picks(texts, self.ladder, seed=self.layers.seed)
                  if self.ladder else ())
        local = self.engine.engine == "local"
        # in this process a failure is raised as it is, at once (no retries)
        engine = make_engine(replace(self.engine, retries=0) if local else self.engine)
        calls = [((spec, texts, self.layers),
                  {"model_options": self.model, "cache": self.cache, "probes": probes,
                   "folds": self.folds, "revision": self.model.revision or "",
                   "work_dir": str(Path(work_dir)) if work_dir else None,
                   "progress": progress if local else False,
                   "log_samples": self.log_samples, "ladder": ladder})
                 for spec in self.models]
        frames, infos, samples, ladders = [], [], [], []
        for spec, oc in zip(self.models, engine.map(analyze_model, calls,
                                                    names=list(self.models))):
            if not oc.ok:
                if oc.exception is not None:
                    raise oc.exception
                raise RuntimeError(f"{spec} failed after {oc.attempts} attempts on "
                                   f"{self.engine.engine}: {oc.error}\n{oc.traceback or ''}")
            res: ModelAnalysis = oc.value
            frames.append(res.frame)
            if res.samples is not None:
                samples.append(res.samples)
            if res.ladder is not None:
                ladders.append(res.ladder)
            infos.append({**res.info, "attempts": oc.attempts})
            timings.update({f"{k}[{spec}]": v for k, v in res.timings.items()})
        return AnalyzeResult(self, pd.concat(frames, ignore_index=True), infos, timings,
                             {"source": texts.source, "n": len(texts), "hash": texts.hash,
                              "n_dropped": texts.n_dropped},
                             pd.concat(samples, ignore_index=True) if samples else None,
                             pd.concat(ladders, ignore_index=True) if ladders else None)


@dataclass
class AnalyzeResult:
    """The layer table of every model, facts about the models and texts, and timings."""

    config: AnalyzeConfig
    frame: pd.DataFrame
    models: list[dict[str, Any]]
    timings: dict[str, float]
    texts: dict[str, Any]
    samples: pd.DataFrame | None = None
    ladder: pd.DataFrame | None = None

    def rows(self) -> pd.DataFrame:
        return self.frame

    def extra_tables(self) -> dict[str, pd.DataFrame]:
        """``samples`` (per-text rows) with ``--log-samples``, ``ladder`` with a ladder."""
        return {k: v for k, v in (("samples", self.samples), ("ladder", self.ladder))
                if v is not None}

    def manifest(self) -> dict[str, Any]:
        c = self.config
        return {"engine": c.engine.describe(), "models": self.models,
                "texts": self.texts["source"], "n_texts": self.texts["n"],
                "texts_hash": self.texts["hash"], "n_dropped_texts": self.texts["n_dropped"],
                "seeds": {"texts": c.texts.seed, "pga_null_and_pairs": c.layers.seed},
                "timings": dict(self.timings)}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        from ..report.html import write_report

        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom analyze — {', '.join(self.config.models)}")

    def z_table(self, model: str) -> list[dict[str, Any]]:
        """One dict per layer: ``layer`` and ``z ccr=m`` per CCR level, and (when some z of
        the model is flagged) the ``flag`` column of :func:`~lmgeom.results.console.mark_flags`:
        the layer's flags over its CCR levels."""
        g = self.frame.loc[self.frame["model"] == model]
        z = g[g.metric == "pga_z"].pivot_table(index=["layer_index", "layer"],
                                               columns="setting", values="value", sort=True)
        cols = [f"ccr={m}" for m in self.config.layers.ccr if f"ccr={m}" in z.columns]
        rows = [{"layer": layer, **{f"z {c}": float(r[c]) for c in cols}}
                for (_, layer), r in z.iterrows()]
        return mark_flags(rows, self._layer_flags(model, [idx for idx, _ in z.index]))

    def _layer_flags(self, model: str, indices: list[int]) -> list[str]:
        """Each layer's flags over its PGA z rows (``""``: none), in ``indices`` order."""
        df = self.frame
        if "flag" not in df.columns:
            return [""] * len(indices)
        g = df.loc[(df["model"] == model) & (df["metric"] == "pga_z")]
        by = {int(i): join_flags(c for f in fs for c in split_flags(f))
              for i, fs in g.groupby("layer_index")["flag"]}
        return [by.get(int(i), "") for i in indices]

    def flag_note(self, model: str) -> str:
        """The line under a model's z table when some of its z values rest on too little data
        (``""`` when none): the shared footer (:func:`~lmgeom.results.console.flag_footer`:
        each flag and its meaning) and the layers it covers."""
        df = self.frame
        if "flag" not in df.columns:
            return ""
        g = df.loc[(df["model"] == model) & (df["metric"] == "pga_z") & (df["flag"] != "")]
        if g.empty:
            return ""
        layers = list(dict.fromkeys(g.sort_values("layer_index")["layer"].astype(str)))
        return flag_footer(g["flag"], describe_flag,
                           f"in the rows marked (layer(s) {layer_span(layers)}; the table's "
                           "'flag' column and the warnings say more)")

    def summary(self) -> str:
        cfg = self.config.layers
        parts = []
        for model in dict.fromkeys(self.frame["model"].astype(str)):
            k = next((i.get("k") for i in self.models if i.get("name") == model), cfg.k)
            parts.append(f"\nSubspace PGA z per layer — {model} (k={k}, n_null={cfg.n_null})")
            parts.append(format_table(self.z_table(model), floatfmt="{:.2f}"))
            note = self.flag_note(model)
            if note:
                parts.append(note)
        return "\n".join(parts).lstrip("\n") if parts else "(no rows)"


__all__ = ["AnalyzeConfig", "AnalyzeResult", "ModelAnalysis", "analyze_model", "resolve_k",
           "torch_threads"]
