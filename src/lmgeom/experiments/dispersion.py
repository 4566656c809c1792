"""Dispersion vs perplexity (METHODS.md, "Dispersion vs perplexity").

Procedure, per model × corpus:

1. **Document.** Every text is tokenized without special tokens and the texts are joined, in
   corpus order, with the tokenizer's EOS id (else its SEP id, else nothing) between them.
2. **Chunks.** The document is cut into consecutive chunks of exactly ``chunk_len`` tokens;
   the incomplete tail is dropped. ``max_chunks`` keeps a seeded uniform sample of the chunks
   (``numpy.random.default_rng(seed)``, without replacement, document order kept).
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

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, TextsError
from ..results import table

log = logging.getLogger(__name__)

DEFAULT_CHUNK_LEN = 512
DEFAULT_GROUP_SIZE = 10
DEFAULT_MAX_GROUPS = 100
BOS_CHOICES = ("auto", "on", "off")


# ---------------------------------------------------------------------- reducers
def _metrics():
    # lazy: lmgeom.metrics is written in parallel; it owns the dispersion definition
    from .. import metrics

    return metrics


def token_dispersion(h, mask):
    """Reducer: per row, the dispersion of its masked token states.

    Args:
        h: ``(B, T, d)`` tensor of one point.
        mask: ``(B, T)`` bool tensor of the positions that count.

    Returns:
        ``(B,)`` float64 numpy array; NaN for a row with fewer than 2 positions.
    """
    disp = _metrics().dispersion
    out = np.full(h.shape[0], np.nan, dtype=np.float64)
    for b in range(h.shape[0]):
        rows = h[b][mask[b]]
        if rows.shape[0] >= 2:
            out[b] = float(disp(rows.double()))
    return out


def last_state(h, mask):
    """Reducer: per row, the state at its last masked position, ``(B, d)`` float32."""
    import torch

    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device)[None, :].expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(1).values
    if (last < 0).any():
        raise ConfigError("a row has no position to take its last state from")
    return h[torch.arange(h.shape[0], device=h.device), last].float()


# ---------------------------------------------------------------------- chunks
@dataclass(frozen=True)
class Chunks:
    """Fixed-length token chunks of one corpus, as fed to the model.

    Attributes:
        tokens: ``(N, chunk_len + bos)`` int64 model inputs (BOS first when ``bos``).
        index: ``(N,)`` position of each chunk among the document's complete chunks.
        start: ``(N,)`` token offset of each chunk in the document.
        n_available: complete chunks in the document (before ``max_chunks``).
        n_document_tokens: tokens in the joined document.
        chunk_len: tokens per chunk (without BOS).
        bos: whether a BOS was prepended.
        separator: token id put between texts (None: none).
    """

    tokens: np.ndarray
    index: np.ndarray
    start: np.ndarray
    n_available: int
    n_document_tokens: int
    chunk_len: int
    bos: bool
    separator: int | None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def resolve_bos(model, bos: str | bool | None) -> bool:
    """``auto`` → whether the tokenizer prepends a BOS; ``on``/``off`` as given."""
    if bos in (None, "auto"):
        return bool(model.bos_prepended)
    if bos in (True, "on"):
        if model.tokenizer.bos_token_id is None:
            raise ConfigError(f"--bos on: the tokenizer of {model.name} has no BOS token")
        return True
    if bos in (False, "off"):
        return False
    raise ConfigError(f"bos must be one of {', '.join(BOS_CHOICES)}, got {bos!r}")


def separator_id(tokenizer) -> int | None:
    """The id joining texts in the document: EOS, else SEP, else None."""
    for name in ("eos_token_id", "sep_token_id"):
        v = getattr(tokenizer, name, None)
        if isinstance(v, int):
            return v
    return None


def document_tokens(model, texts) -> tuple[np.ndarray, int | None]:
    """All texts tokenized without special tokens, joined with the separator: ``(n,)`` ids."""
    tok = model.tokenizer
    enc = tok(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    sep = separator_id(tok)
    parts: list[np.ndarray] = []
    for i, row in enumerate(enc):
        if i and sep is not None:
            parts.append(np.array([sep], dtype=np.int64))
        parts.append(np.asarray(row, dtype=np.int64))
    doc = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return doc, sep


def make_chunks(
    model,
    texts,
    chunk_len: int = DEFAULT_CHUNK_LEN,
    *,
    max_chunks: int | None = None,
    seed: int = 0,
    bos: str | bool | None = "auto",
) -> Chunks:
    """Cut a corpus into fixed-length token chunks (see the module docstring).

    Raises:
        TextsError: the corpus has fewer than ``chunk_len`` tokens.
        ConfigError: ``chunk_len < 2`` or ``max_chunks < 1``.
    """
    from ..texts import as_textset

    if chunk_len < 2:
        raise ConfigError(f"chunk_len must be at least 2 tokens, got {chunk_len}")
    if max_chunks is not None and max_chunks < 1:
        raise ConfigError(f"max_chunks must be >= 1 (or None for all), got {max_chunks}")
    ts = as_textset(texts)
    doc, sep = document_tokens(model, ts.texts)
    n_avail = len(doc) // chunk_len
    if n_avail == 0:
        raise TextsError(
            f"the corpus has {len(doc)} tokens, fewer than one chunk of {chunk_len}; use a "
            "larger corpus or a smaller --chunk-len"
        )
    idx = np.arange(n_avail)
    if max_chunks is not None and n_avail > max_chunks:
        idx = np.sort(np.random.default_rng(seed).choice(n_avail, size=max_chunks, replace=False))
    toks = doc[: n_avail * chunk_len].reshape(n_avail, chunk_len)[idx]
    use_bos = resolve_bos(model, bos)
    if use_bos:
        b = np.full((len(idx), 1), int(model.tokenizer.bos_token_id), dtype=np.int64)
        toks = np.concatenate([b, toks], axis=1)
    return Chunks(tokens=np.ascontiguousarray(toks), index=idx.astype(np.int64),
                  start=(idx * chunk_len).astype(np.int64), n_available=int(n_avail),
                  n_document_tokens=len(doc), chunk_len=int(chunk_len), bos=use_bos,
                  separator=sep)


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
        import pandas as pd

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
    from ..lm.perplexity import forward_chunks
    from ..models import load_model
    from ..texts import as_textset

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


# ---------------------------------------------------------------------- statistics
def group_means(
    dispersion: np.ndarray,
    perplexity: np.ndarray,
    group_size: int = DEFAULT_GROUP_SIZE,
    max_groups: int = DEFAULT_MAX_GROUPS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort chunks by perplexity, cut into groups of ``group_size``, return group means.

    Args:
        dispersion: ``(N,)`` or ``(n_layers, N)``.
        perplexity: ``(N,)``.
        group_size: chunks per group; the incomplete last group (highest perplexities) is
            dropped.
        max_groups: keep at most this many groups, evenly spread over the perplexity ranks.

    Returns:
        ``(group_dispersion (..., G), group_perplexity (G,), kept_group_ids (G,))``.
    """
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if max_groups < 1:
        raise ConfigError(f"max_groups must be >= 1, got {max_groups}")
    ppl = np.asarray(perplexity, dtype=np.float64)
    disp = np.asarray(dispersion, dtype=np.float64)
    order = np.argsort(ppl, kind="stable")
    n_full = len(ppl) // group_size
    gid = np.arange(n_full)
    if n_full > max_groups:
        gid = np.unique(np.round(np.linspace(0, n_full - 1, max_groups)).astype(np.int64))
    members = order[: n_full * group_size].reshape(n_full, group_size)[gid]  # (G, g)
    return disp[..., members].mean(-1), ppl[members].mean(-1), gid


def _triplet(res) -> tuple[float, float, float]:
    """(value, ci_low, ci_high) of a :class:`~lmgeom.metrics.CorrelationResult` (``r``) or
    :class:`~lmgeom.metrics.BootstrapResult` (``estimate``)."""
    value = res.r if hasattr(res, "r") else res.estimate
    return float(value), float(res.low), float(res.high)


def correlation(x, y, method: str, n_boot: int, seed: int) -> tuple[float, float, float]:
    """Spearman / Pearson with a bootstrap CI via :func:`lmgeom.metrics.correlation_with_ci`;
    NaN when fewer than 3 finite pairs or a constant side."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan, math.nan
    return _triplet(_metrics().correlation_with_ci(x, y, method=method, n_boot=n_boot, seed=seed))


def mean_ci(x, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float, float]:
    """Mean with a bootstrap CI via :func:`lmgeom.metrics.bootstrap_ci`."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    if len(x) < 2:
        return float(x.mean()), math.nan, math.nan
    res = _metrics().bootstrap_ci(x, np.mean, n_boot=n_boot, level=level, seed=seed)
    v, lo, hi = _triplet(res)
    return float(x.mean()) if not np.isfinite(v) else v, lo, hi


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
        v, lo, hi = mean_ci(meas.dispersion[li], config.n_boot, seed)
        rows.append(table.row(**at, metric="dispersion", setting=s_chunk, value=v, ci_low=lo,
                              ci_high=hi, seed=seed, n=n))
        for method in ("spearman", "pearson"):
            v, lo, hi = correlation(meas.dispersion[li], meas.perplexity, method,
                                    config.n_boot, seed)
            rows.append(table.row(**at, metric=f"corr_{method}", setting=s_chunk, value=v,
                                  ci_low=lo, ci_high=hi, seed=seed, n=n))
            if n_groups >= 3:
                v, lo, hi = correlation(gd[li], gp, method, config.n_boot, seed)
            else:
                v = lo = hi = math.nan
            rows.append(table.row(**at, metric=f"corr_{method}", setting=s_group, value=v,
                                  ci_low=lo, ci_high=hi, seed=seed, n=n_groups))
    # corpus perplexity of the chunks: exp(mean NLL), CI by bootstrap of the mean NLL
    v, lo, hi = mean_ci(meas.mean_nll, config.n_boot, seed)
    rows.append(table.row(**base, metric="perplexity", setting=s_chunk, value=math.exp(v),
                          ci_low=math.exp(lo) if np.isfinite(lo) else math.nan,
                          ci_high=math.exp(hi) if np.isfinite(hi) else math.nan, seed=seed, n=n))
    rows.append(table.row(**base, metric="n_chunks", setting=s_chunk, value=n,
                          n=meas.chunks.n_available))
    rows.append(table.row(**base, metric="n_groups", setting=s_group, value=n_groups, n=n))
    if n_groups < 3:
        log.warning("%s on %s: only %d groups of %d chunks: the group-level correlation needs "
                    "at least 3 (use more chunks or a smaller --group-size)", meas.model, t,
                    n_groups, config.group_size)
    return rows


def config_dict(config: DispersionConfig) -> dict[str, Any]:
    return asdict(config)


# ---------------------------------------------------------------------- plots
def scatter_layers(m: ChunkMeasurements, layers: Sequence[str] | None = None) -> list[str]:
    """Layers drawn in the scatter: the given ones that were measured, else the last block
    ``L`` (pre-norm) and ``final`` (post-norm) when measured, else the last requested."""
    if layers:
        got = [lab for lab in layers if lab in m.layers]
        if got:
            return got
    got = [lab for lab in (str(m.n_blocks), "final") if lab in m.layers]
    return got or [m.layers[-1]]


def plot_scatter(measurements: list[ChunkMeasurements], config: DispersionConfig, out_dir,
                 stem: str = "dispersion_scatter", layers: Sequence[str] | None = None) -> list:
    """Dispersion vs perplexity at the last layer(s) (:func:`scatter_layers`): chunk-level
    points and perplexity-sorted group means; one row per model × corpus, one panel per layer."""
    if not measurements:
        return []
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from ..report.plots import save_figure

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


# ---------------------------------------------------------------------- analyze integration
RESULT_TABLES = ("dispersion", "hardness", "clusters")


def collect_results(run_dir) -> Any:
    """Tidy rows of every dispersion-family table (``dispersion.parquet``, ``hardness.parquet``,
    ``clusters.parquet``) found in ``run_dir``, concatenated; an empty table when none.

    ``lmgeom analyze`` (or anyone) can append these to its own rows before calling
    :func:`lmgeom.report.html.write_report`, so one report shows both.
    """
    from pathlib import Path

    import pandas as pd

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
    import json
    from pathlib import Path

    import pandas as pd

    from ..errors import CacheError
    from ..report.html import write_report

    run = Path(run_dir)
    if not run.is_dir():
        raise CacheError(f"--attach {run}: no such run folder (run `lmgeom analyze --out {run}` "
                         "first)")
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
