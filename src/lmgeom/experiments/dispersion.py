"""Dispersion vs perplexity (METHODS.md, "Dispersion vs perplexity").

Procedure, per model × corpus:

1. **Document** and 2. **Chunks**: :func:`lmgeom.texts.chunks.make_chunks` (texts joined
   with the tokenizer's EOS, cut into chunks of exactly ``chunk_len`` tokens, a seeded sample
   of ``max_chunks``).

3. **BOS.** With ``bos="auto"`` (default) a BOS token is put in front of each chunk when the
   tokenizer prepends one to ordinary input (Gemma does, SmolLM2 does not), so the model sees
   inputs like the ones it was trained on. The BOS position is left out of the dispersion.
4. **One forward pass per batch of chunks** (:func:`lmgeom.lm.perplexity.forward_chunks`):
   per chunk its perplexity ``exp(mean NLL of tokens 2..T)`` of the model input, and at each
   requested layer the token-level dispersion ``D = 1 - mean_{i≠j} cos(h_i, h_j)`` of the
   chunk's ``chunk_len`` token states.
5. **Correlations per layer** between per-chunk dispersion and perplexity (raw perplexity;
   Spearman is unchanged by a log, Pearson is not), Spearman and Pearson, each with a seeded
   percentile-bootstrap 95 % interval:

   * ``level=chunk``: over the chunks;
   * ``level=group``: chunks sorted by perplexity and cut into consecutive groups of
     ``group_size`` chunks (incomplete last group dropped); when there are more than
     ``max_groups`` groups, ``max_groups`` of them evenly spread in perplexity rank are kept;
     each group contributes its mean dispersion and mean perplexity. The released code uses
     ``group_size = 100`` (with thousands of chunks); lmgeom's default is
     :data:`DEFAULT_GROUP_SIZE` = 10 so that a few hundred chunks give tens of groups.

Table conventions (tidy table, :mod:`lmgeom.results.table`): the corpus and the level go
into ``setting``, e.g. ``texts=builtin:wiki;level=chunk`` and
``texts=builtin:wiki;level=group;g=10``. Per layer: ``dispersion`` (mean over chunks with its
bootstrap CI; ``level=chunk`` setting), ``corr_spearman`` and ``corr_pearson`` (both levels).
Model-level rows (``layer = ""``): ``perplexity`` (corpus perplexity of the chunks,
``exp(mean NLL)``, bootstrap CI over chunks), ``n_chunks`` and ``n_groups``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from .._io import atomic_path
from ..errors import CacheError, ConfigError
from ..lm.scoring import forward_chunks
from ..metrics.dispersion import group_means, token_dispersion
from ..metrics.sample_size import MIN_CORR_POINTS, corr_flag, describe_flag, warn_low_sample
from ..metrics.uncertainty import correlation_interval, mean_interval
from ..models.bundled import DEFAULT_MODEL
from ..results import table
from ..results.console import flag_footer, format_table, mark_flags
from ..results.folder import acquire_output_lock, is_run_folder, release_output_lock
from ..texts import as_textset
from ..texts.chunks import BOS_CHOICES, DEFAULT_CHUNK_LEN, Chunks, make_chunks
from .base import register, timed
from .options import ModelOptions, TextOptions

log = logging.getLogger(__name__)

DEFAULT_GROUP_SIZE = 10
DEFAULT_MAX_GROUPS = 100
DEFAULT_TEXTS = "builtin:wiki"


# ---------------------------------------------------------------------- reducers
def last_state(h, mask):
    """Reducer: per row, the state at its last masked position, ``(B, d)`` float32."""
    import torch

    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device)[None, :].expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(1).values
    if (last < 0).any():
        raise ConfigError("a row has no position to take its last state from")
    return h[torch.arange(h.shape[0], device=h.device), last].float()


# ---------------------------------------------------------------------- measurements
@dataclass
class ChunkMeasurements:
    """Per-chunk perplexity and per-layer token-level dispersion of one model on one corpus.

    Attributes:
        model: model spec; ``texts``: the corpus label used in ``setting``.
        layers: point labels, ``dispersion[i]`` belongs to ``layers[i]``.
        layer_index: position of each label on the layer axis; ``n_blocks``: L.
        perplexity: ``(N,)``; ``mean_nll``: ``(N,)`` nats per scored token.
        dispersion: ``(n_layers, N)``.
        chunks: the :class:`Chunks` that were run.
        key: forward-cache key; ``batches_cached``: batches reused from the cache.
    """

    model: str
    texts: str
    layers: tuple[str, ...]
    layer_index: tuple[int, ...]
    n_blocks: int
    perplexity: np.ndarray
    mean_nll: np.ndarray
    dispersion: np.ndarray
    chunks: Chunks
    key: str = ""
    batches_cached: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def to_frame(self, revision: str = ""):
        """Long per-chunk table: model, revision, texts, chunk, start, layer, layer_index,
        dispersion, perplexity, mean_nll."""
        n, L = len(self.perplexity), len(self.layers)
        return pd.DataFrame({
            "model": self.model,
            "revision": revision,
            "texts": self.texts,
            "chunk": np.tile(self.chunks.index, L),
            "start": np.tile(self.chunks.start, L),
            "layer": np.repeat(np.array(self.layers, dtype=object), n),
            "layer_index": np.repeat(np.array(self.layer_index, dtype=np.int64), n),
            "dispersion": self.dispersion.reshape(-1),
            "perplexity": np.tile(self.perplexity, L),
            "mean_nll": np.tile(self.mean_nll, L),
        })


def measure_chunks(
    model,
    texts,
    *,
    texts_label: str | None = None,
    chunk_len: int = DEFAULT_CHUNK_LEN,
    layers: Any = "all",
    max_chunks: int | None = None,
    seed: int = 0,
    bos: str | bool | None = "auto",
    batch_size: int = 4,
    position_chunk: int | None = None,
    cache: bool = True,
    progress: bool | None = None,
) -> ChunkMeasurements:
    """Chunk the corpus and run the model once per batch of chunks: perplexity + dispersion.

    Results are cached per batch (``$LMGEOM_CACHE/forward``), so a killed run resumes and a
    rerun is cheap.
    """
    from ..models import load_model

    t0 = time.perf_counter()
    model = load_model(model)
    ts = as_textset(texts)
    points = model.resolve_points(layers)
    ch = make_chunks(model, ts, chunk_len, max_chunks=max_chunks, seed=seed, bos=bos)
    t1 = time.perf_counter()
    res = forward_chunks(model, ch.tokens, points, {"token_dispersion": token_dispersion},
                         nll=True, score_from=1, reduce_from=1 if ch.bos else 0,
                         batch_size=batch_size, position_chunk=position_chunk,
                         progress=progress, cache=cache,
                         desc=f"dispersion {model.name} {texts_label or ts.source}")
    disp = np.stack([res.reduced["token_dispersion"][p] for p in points]).astype(np.float64)
    return ChunkMeasurements(
        model=model.name, texts=texts_label or ts.source, layers=points,
        layer_index=tuple(model.point_index(p) for p in points), n_blocks=model.n_blocks,
        perplexity=res.perplexity, mean_nll=res.mean_nll, dispersion=disp, chunks=ch,
        key=res.key, batches_cached=res.batches_cached,
        timings={"chunking_s": t1 - t0, "forward_s": time.perf_counter() - t1},
    )


@dataclass(frozen=True)
class DispersionConfig:
    """Settings of a dispersion-vs-perplexity run (all recorded in the manifest)."""

    chunk_len: int = DEFAULT_CHUNK_LEN
    layers: str = "all"
    max_chunks: int | None = 256
    group_size: int = DEFAULT_GROUP_SIZE
    max_groups: int = DEFAULT_MAX_GROUPS
    n_boot: int = 1000
    seed: int = 0
    bos: str = "auto"
    batch_size: int = 4
    position_chunk: int | None = None

    def __post_init__(self):
        if self.bos not in BOS_CHOICES:
            raise ConfigError(f"bos must be one of {', '.join(BOS_CHOICES)}, got {self.bos!r}")
        if self.n_boot < 10:
            raise ConfigError(f"n_boot must be >= 10, got {self.n_boot}")
        if self.group_size < 2:
            raise ConfigError(f"group_size must be >= 2, got {self.group_size}")


def correlation_rows(meas: ChunkMeasurements, config: DispersionConfig, *,
                     revision: str = "") -> list[dict[str, Any]]:
    """Tidy rows (see the module docstring) of one :class:`ChunkMeasurements`."""
    L1 = meas.n_blocks + 1
    t = meas.texts
    s_chunk = f"texts={t};level=chunk"
    s_group = f"texts={t};level=group;g={config.group_size}"
    n = len(meas.perplexity)
    seed = config.seed
    gd, gp, _ = group_means(meas.dispersion, meas.perplexity, config.group_size,
                              config.max_groups)
    n_groups = len(gp)
    rows: list[dict[str, Any]] = []
    base = {"model": meas.model, "revision": revision}
    for li, (layer, lidx) in enumerate(zip(meas.layers, meas.layer_index)):
        at = {**base, "layer": layer, "layer_index": lidx, "depth": lidx / L1}
        v, lo, hi = mean_interval(meas.dispersion[li], config.n_boot, seed)
        rows.append(table.row(**at, metric="dispersion", setting=s_chunk, value=v, ci_low=lo,
                              ci_high=hi, seed=seed, n=n))
        for method in ("spearman", "pearson"):
            v, lo, hi = correlation_interval(meas.dispersion[li], meas.perplexity, method,
                                    config.n_boot, seed)
            rows.append(table.row(**at, metric=f"corr_{method}", setting=s_chunk, value=v,
                                  ci_low=lo, ci_high=hi, seed=seed, n=n,
                                  flag=corr_flag(n)))
            if n_groups >= 3:
                v, lo, hi = correlation_interval(gd[li], gp, method, config.n_boot, seed)
            else:
                v = lo = hi = math.nan
            rows.append(table.row(**at, metric=f"corr_{method}", setting=s_group, value=v,
                                  ci_low=lo, ci_high=hi, seed=seed, n=n_groups,
                                  flag=corr_flag(n_groups)))
    # corpus perplexity of the chunks: exp(mean NLL), CI by bootstrap of the mean NLL
    v, lo, hi = mean_interval(meas.mean_nll, config.n_boot, seed)
    rows.append(table.row(**base, metric="perplexity", setting=s_chunk, value=math.exp(v),
                          ci_low=math.exp(lo) if np.isfinite(lo) else math.nan,
                          ci_high=math.exp(hi) if np.isfinite(hi) else math.nan, seed=seed, n=n))
    rows.append(table.row(**base, metric="n_chunks", setting=s_chunk, value=n,
                          n=meas.chunks.n_available))
    rows.append(table.row(**base, metric="n_groups", setting=s_group, value=n_groups, n=n))
    if n < MIN_CORR_POINTS * config.group_size:
        warn_low_sample(f"{meas.model} on {t}: {chunk_advice(meas.chunks, n, n_groups, config)}")
    return rows


def chunk_advice(chunks, n: int, n_groups: int, config: DispersionConfig) -> str:
    """How many chunks and groups a corpus gave, what the correlations need (the floor
    :data:`~lmgeom.metrics.sample_size.MIN_CORR_POINTS`), and the ``--chunk-len`` or
    ``--group-size`` that would give enough from the same tokens."""
    tokens = int(chunks.n_available) * int(chunks.chunk_len)
    need = MIN_CORR_POINTS * config.group_size
    parts = [f"{n} chunks of {chunks.chunk_len} tokens and {n_groups} groups of "
             f"{config.group_size}; a correlation needs at least {MIN_CORR_POINTS} points"]
    if n < MIN_CORR_POINTS:
        parts.append(f"the chunk-level correlation over {n} chunks is flagged")
    parts.append(f"the group-level one over {n_groups} groups is "
                 + ("flagged" if n_groups < MIN_CORR_POINTS else "not") +
                 ("" if n_groups >= 3 else " (and not computed: it needs 3 groups)"))
    fit = tokens // need
    if fit >= 8:
        parts.append(f"--chunk-len {fit} would give {tokens // fit} chunks, enough for "
                     f"{MIN_CORR_POINTS} groups of {config.group_size}")
    elif tokens // max(1, config.chunk_len) >= MIN_CORR_POINTS:
        g = max(2, (tokens // config.chunk_len) // MIN_CORR_POINTS)
        parts.append(f"--group-size {g} would give {MIN_CORR_POINTS} groups")
    else:
        parts.append(f"the corpus has only ~{tokens} tokens: give a larger text")
    return "; ".join(parts)


def config_dict(config: DispersionConfig) -> dict[str, Any]:
    return asdict(config)


# ---------------------------------------------------------------------- analyze integration
RESULT_TABLES = ("dispersion", "hardness", "clusters")


def collect_results(run_dir) -> Any:
    """Tidy rows of every dispersion-family table (``dispersion.parquet``, ``hardness.parquet``,
    ``clusters.parquet``) found in ``run_dir``, concatenated; an empty table when none.

    ``lmgeom analyze`` (or anyone) can append these to its own rows before calling
    :func:`lmgeom.report.html.write_report`, so one report shows both.
    """
    frames = []
    for stem in RESULT_TABLES:
        p = Path(run_dir) / f"{stem}.parquet"
        if p.is_file():
            frames.append(table.read_table(p))
    if not frames:
        return table.frame([])
    return pd.concat(frames, ignore_index=True)


def attach_to_run(run_dir, df, stem: str = "dispersion", *, title: str | None = None):
    """Write ``df`` as ``run_dir/<stem>.parquet|csv`` and regenerate ``run_dir/report.html``
    from the run's own table (``layers.parquet`` of ``lmgeom analyze``) plus every
    dispersion-family table there. Returns the report path."""
    run = check_attach(run_dir)
    key = acquire_output_lock(run, option="--attach")
    try:
        return _attach(run, df, stem, title)
    finally:
        release_output_lock(key)


def check_attach(run_dir, models: Sequence[str] | None = None) -> Any:
    """The run folder ``run_dir`` for ``--attach``: it must be an lmgeom run folder (marker and
    manifest written by lmgeom), so attaching never writes into a folder of other files; with
    ``models``, the run must be of those models (one report never mixes two models' rows)."""
    run = Path(run_dir).expanduser()
    if not run.is_dir():
        raise CacheError(f"--attach {run}: no such run folder (run `lmgeom analyze --out {run}` "
                         "first)")
    if not is_run_folder(run):
        raise CacheError(f"--attach {run}: not a finished lmgeom run folder (no .lmgeom-run marker "
                         "and manifest.json written by lmgeom); give the --out folder of a "
                         "finished `lmgeom analyze` run")
    if models is not None:
        try:
            settings = json.loads((run / "manifest.json").read_text()).get("settings") or {}
        except (OSError, ValueError):
            settings = {}
        theirs = settings.get("models")
        if isinstance(theirs, list) and theirs and set(models) - set(map(str, theirs)):
            other = sorted(set(models) - set(map(str, theirs)))
            raise CacheError(f"--attach {run} is a run of {', '.join(map(str, theirs))}, not of "
                             f"{', '.join(other)}: its report would mix two models' results; "
                             "attach to a run of the same model(s), or leave out --attach")
    return run


def _attach(run, df, stem: str, title: str | None):
    from ..report.html import write_report

    table.write_table(df, run, stem)
    frames = []
    if (run / "layers.parquet").is_file():
        frames.append(table.read_table(run / "layers.parquet"))
    frames.append(collect_results(run))
    manifest: dict[str, Any] = {}
    if (run / "manifest.json").is_file():
        try:
            manifest = json.loads((run / "manifest.json").read_text())
        except ValueError:
            manifest = {}
    manifest = {**manifest, "attached": sorted(
        s for s in RESULT_TABLES if (run / f"{s}.parquet").is_file())}
    return write_report(run, pd.concat(frames, ignore_index=True), manifest, title=title)


# ---------------------------------------------------------------------- the experiment
@register
@dataclass(frozen=True)
class DispersionExperiment:
    """``lmgeom dispersion``: every model × corpus, chunked, one forward per batch of chunks.

    Attributes:
        models: model specs.
        corpora: text specs (each gets its own ``texts=SPEC`` setting).
        texts: how each corpus is read (``n``, seed, columns; its ``spec`` is not used).
        model: how models load.
        dispersion: the measurement and statistics settings.
        cache: use the forward cache (``$LMGEOM_CACHE/forward``).
    """

    command: ClassVar[str] = "dispersion"
    table: ClassVar[str] = "dispersion"

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    corpora: tuple[str, ...] = (DEFAULT_TEXTS,)
    texts: TextOptions = field(default_factory=lambda: TextOptions(spec=DEFAULT_TEXTS, n=None))
    model: ModelOptions = field(default_factory=ModelOptions)
    dispersion: DispersionConfig = field(default_factory=DispersionConfig)
    cache: bool = True
    log_samples: bool = False

    def __post_init__(self) -> None:
        if not self.models or not self.corpora:
            raise ConfigError("give at least one model and one corpus")
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "corpora", tuple(self.corpora))

    def settings(self) -> dict[str, Any]:
        return {"models": list(self.models), "texts": list(self.corpora), "n": self.texts.n,
                "revision": self.model.revision, "dtype": self.model.dtype,
                "dispersion": config_dict(self.dispersion),
                "text_column": self.texts.text_column, "label_column": self.texts.label_column,
                "split": self.texts.split}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> DispersionResult:
        cfg = self.dispersion
        revision = self.model.revision or ""
        timings: dict[str, float] = {}
        with timed(timings, "texts_s"):
            textsets = {spec: self.texts.load(spec) for spec in self.corpora}
        rows, frames, measured, info, model_info = [], [], [], [], []
        for spec in self.models:
            with timed(timings, f"load_s[{spec}]"):
                model = self.model.load(spec)
            for cspec, ts in textsets.items():
                m = measure_chunks(model, ts, texts_label=cspec, chunk_len=cfg.chunk_len,
                                   layers=cfg.layers, max_chunks=cfg.max_chunks, seed=cfg.seed,
                                   bos=cfg.bos, batch_size=cfg.batch_size,
                                   position_chunk=cfg.position_chunk, cache=self.cache,
                                   progress=progress)
                m.model = spec
                timings[f"forward_s[{spec}|{cspec}]"] = m.timings["forward_s"]
                rows.extend(correlation_rows(m, cfg, revision=revision))
                frames.append(m.to_frame(revision=revision))
                measured.append(m)
                info.append({"model": spec, "texts": cspec, "n_texts": len(ts),
                             "texts_hash": ts.hash,
                             "n_document_tokens": m.chunks.n_document_tokens,
                             "n_chunks_available": m.chunks.n_available,
                             "n_chunks": len(m.chunks), "bos": m.chunks.bos,
                             "separator_id": m.chunks.separator, "forward_key": m.key,
                             "batches_cached": m.batches_cached})
            model_info.append(model.describe())
            del model
        return DispersionResult(self, table.frame(rows), pd.concat(frames, ignore_index=True),
                                measured, info, model_info, timings)


@dataclass
class DispersionResult:
    """The tidy table, the per-chunk table (``chunks.parquet``) and the measurements."""

    config: DispersionExperiment
    frame: pd.DataFrame
    chunks: pd.DataFrame
    measured: list[ChunkMeasurements]
    runs: list[dict[str, Any]]
    model_info: list[dict[str, Any]]
    timings: dict[str, float]

    def rows(self) -> pd.DataFrame:
        return self.frame

    def extra_tables(self) -> dict[str, pd.DataFrame]:
        """With ``log_samples``: ``samples`` — one row per chunk (the items dispersion is
        measured on: fixed-length token chunks of the joined corpus), wide: model, revision,
        texts, id (``chunk<i>``), start (token offset in the joined corpus), n_tokens, nll
        (mean, nats / token), perplexity, ``dispersion@<layer>`` per layer."""
        if not self.config.log_samples:
            return {}
        c = self.chunks
        key = ["model", "revision", "texts", "chunk", "start"]
        wide = c.pivot_table(index=key, columns="layer", values="dispersion", sort=False)
        order = list(dict.fromkeys(c["layer"]))
        wide = wide[order].rename(columns=lambda x: f"dispersion@{x}").reset_index()
        first = c.drop_duplicates(key)[key + ["perplexity", "mean_nll"]]
        out = first.merge(wide, on=key, how="left", sort=False)
        out.insert(3, "id", [f"chunk{int(i)}" for i in out["chunk"]])
        out.insert(6, "n_tokens", int(self.config.dispersion.chunk_len))
        out = out.rename(columns={"mean_nll": "nll"})
        return {"samples": out[["model", "revision", "texts", "id", "chunk", "start",
                                "n_tokens", "nll", "perplexity",
                                *[f"dispersion@{x}" for x in order]]]}

    def manifest(self) -> dict[str, Any]:
        c = self.config
        return {"model_info": self.model_info, "models": list(c.models),
                "texts": list(c.corpora), "runs": self.runs,
                "group_size_used": c.dispersion.group_size,
                "seeds": {"chunk_sample": c.dispersion.seed, "bootstrap": c.dispersion.seed,
                          "texts": c.texts.seed},
                "timings": dict(self.timings)}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        """``chunks.parquet``, the scatter and correlation plots, and ``report.html``."""
        from ..report.figures_dispersion import plot_dispersion_correlation, plot_scatter
        from ..report.html import write_report

        with atomic_path(folder.path / "chunks.parquet") as tmp:
            self.chunks.to_parquet(tmp, index=False)
        extra = plot_scatter(self.measured, self.config.dispersion, folder.plots)
        extra += plot_dispersion_correlation(self.frame, folder.plots)
        manifest["extra_plots"] = [str(p.relative_to(folder.path)) for p in extra]
        c = self.config
        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom dispersion — {', '.join(c.models)} on "
                                  f"{', '.join(c.corpora)}")

    def summary(self) -> str:
        cfg, df, parts = self.config.dispersion, self.frame, []
        for m in self.measured:
            s_chunk = f"texts={m.texts};level=chunk"
            s_group = f"texts={m.texts};level=group;g={cfg.group_size}"
            sub = df[(df.model == m.model)]
            ppl = sub[(sub.metric == "perplexity") & (sub.setting == s_chunk)].iloc[0]
            ng = (int(sub[(sub.metric == "n_groups")].iloc[0].value)
                  if (sub.metric == "n_groups").any() else 0)
            sub = sub[sub.setting.isin([s_chunk, s_group])]
            parts.append(f"\n{m.model} on {m.texts}: {len(m.perplexity)} chunks of "
                         f"{cfg.chunk_len} tokens (of {m.chunks.n_available}), perplexity "
                         f"{ppl.value:.4g}; groups: {ng} of g={cfg.group_size}")
            out, flags = [], []
            for layer in m.layers:
                r = sub[sub.layer == layer]

                def get(metric, setting, r=r):
                    x = r[(r.metric == metric) & (r.setting == setting)]
                    return _fmt(*x[["value", "ci_low", "ci_high"]].iloc[0]) if len(x) else ""

                d = r[(r.metric == "dispersion")]
                flags.append(";".join(dict.fromkeys(
                    c for f in r.loc[r.metric.str.startswith("corr_"), "flag"].fillna("")
                    for c in str(f).split(";") if c)))
                out.append({"layer": layer,
                            "dispersion": float(d.value.iloc[0]) if len(d) else float("nan"),
                            "spearman chunk": get("corr_spearman", s_chunk),
                            "pearson chunk": get("corr_pearson", s_chunk),
                            "spearman group": get("corr_spearman", s_group),
                            "pearson group": get("corr_pearson", s_group)})
            parts.append(format_table(mark_flags(out, flags), floatfmt="{:.3f}"))
            footer = flag_footer(flags, describe_flag, "in the rows marked")
            if footer:
                parts.append(footer + " " + chunk_advice(m.chunks, len(m.perplexity), ng, cfg)
                             + ".")
        return "\n".join(parts)


def _fmt(v, lo, hi) -> str:
    if not math.isfinite(v):
        return "n/a"
    if math.isfinite(lo) and math.isfinite(hi):
        return f"{v:+.2f} [{lo:+.2f},{hi:+.2f}]"
    return f"{v:+.2f}"
