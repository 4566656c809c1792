"""Cluster dispersion (METHODS.md, "Applications": cluster dispersion).

A cluster is a set of different contexts in the corpus that are followed by the same
``ngram`` (default 10) tokens. The rule, applied with the **reference tokenizer** (the first
model's), is:

1. Each text is tokenized without special tokens. Every position ``p`` with at least
   ``min_context`` tokens before it and ``ngram`` tokens from it is a candidate; its key is
   ``tokens[p : p + ngram]`` (texts are not joined: a context never crosses a text boundary).
2. Candidates with the same key form a group (found by a 64-bit polynomial hash, then checked
   token by token).
3. Within a group, occurrences that overlap an earlier kept one in the same text
   (``p < p_prev + ngram``) are dropped, so a run of repeats counts once per ``ngram`` tokens.
4. The context of an occurrence is the window ``tokens[max(0, p - window) : p]``; occurrences
   whose context window is identical to an earlier one's are dropped (they would have the
   identical state).
5. Only **left-maximal** groups are kept: the tokens just before the occurrences
   (``tokens[p - 1]``) are not all the same. Otherwise the repeat extends further left and
   the group is a shifted copy of the cluster that starts one token earlier.
6. Groups with at least 2 remaining contexts are clusters. At most ``max_clusters`` clusters
   (seeded uniform sample) and ``max_members`` contexts per cluster (seeded sample) are used.

Each context is kept as the **string** it spans in the text, so every model — with its own
tokenizer — sees exactly the same contexts: it tokenizes the string (its BOS in front when it
prepends one), keeps the last ``window`` tokens, and the state of the last context token at
each layer is the context's representation.

Per layer: the dispersion ``D`` of each cluster's context states (``lmgeom.metrics.dispersion``)
averaged over clusters weighted by cluster size (``cluster_dispersion``), with a seeded bootstrap
95 % interval over clusters; ``cluster_dispersion_all`` is the dispersion of all context states
pooled (the spread between clusters, for scale). With several models, ``cluster_dispersion_diff``
(model-level) is the paired difference of the weighted mean to the first model at the ``final``
point, with a paired bootstrap interval over clusters. Settings look like
``texts=builtin:code;ngram=10``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, DataError, TextsError
from ..lm.scoring import forward_chunks
from ..models.bundled import DEFAULT_MODEL
from ..results import table
from ..results.console import format_table
from ..texts import as_textset
from .base import register, timed
from .options import ModelOptions, TextOptions

log = logging.getLogger(__name__)

_MULT = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class ClusterConfig:
    ngram: int = 10
    window: int = 64
    min_context: int = 8
    max_clusters: int = 500
    max_members: int = 16
    layers: str = "all"
    batch_size: int = 16
    n_boot: int = 1000
    seed: int = 0

    def __post_init__(self):
        for name in ("ngram", "window", "min_context", "max_clusters", "max_members",
                     "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_members < 2:
            raise ConfigError(f"max_members must be >= 2, got {self.max_members}")
        if self.min_context > self.window:
            raise ConfigError(f"min_context ({self.min_context}) must be <= window ({self.window})")


@dataclass(frozen=True)
class Cluster:
    """Contexts followed by the same ``ngram`` tokens.

    Attributes:
        continuation: the shared continuation as text.
        members: ``(text_index, token_position)`` of each context's end (reference tokenizer).
        contexts: the context strings.
    """

    continuation: str
    members: tuple[tuple[int, int], ...]
    contexts: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.contexts)


@dataclass(frozen=True)
class ClusterSet:
    clusters: tuple[Cluster, ...]
    n_found: int
    n_candidates: int
    config: ClusterConfig
    reference: str

    def __len__(self) -> int:
        return len(self.clusters)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([c.size for c in self.clusters], dtype=np.int64)


def _hash_ngrams(ids: np.ndarray, n: int) -> np.ndarray:
    """64-bit polynomial hash of every length-``n`` window of ``ids`` (wrapping arithmetic)."""
    w = np.lib.stride_tricks.sliding_window_view(ids.astype(np.uint64), n)
    h = np.zeros(w.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _MULT + w[:, j] + np.uint64(1)
    return h


def find_clusters(tokenizer, texts, config: ClusterConfig | None = None, *,
                  reference: str = "") -> ClusterSet:
    """Find clusters of contexts with identical next ``ngram`` tokens (module docstring rule).

    Args:
        tokenizer: the reference tokenizer (a fast tokenizer gives exact character spans;
            otherwise contexts are decoded from their tokens).
        texts: a TextSet, list of strings or spec.
        config: :class:`ClusterConfig`.
        reference: name recorded as the reference tokenizer.
    """
    config = config or ClusterConfig()
    ts = as_textset(texts)
    n, W, m = config.ngram, config.window, config.min_context
    fast = bool(getattr(tokenizer, "is_fast", False))
    enc = tokenizer(list(ts.texts), add_special_tokens=False, truncation=False, verbose=False,
                    return_offsets_mapping=fast)
    ids = [np.asarray(r, dtype=np.int64) for r in enc["input_ids"]]
    offsets = enc["offset_mapping"] if fast else None
    hs, tx, ps = [], [], []
    for t, row in enumerate(ids):
        if len(row) < m + n:
            continue
        h = _hash_ngrams(row, n)[m:]
        hs.append(h)
        tx.append(np.full(len(h), t, dtype=np.int64))
        ps.append(np.arange(m, m + len(h), dtype=np.int64))
    if not hs:
        raise TextsError(f"no text has the {m + n} tokens a context plus a {n}-gram need")
    H, T, P = np.concatenate(hs), np.concatenate(tx), np.concatenate(ps)
    n_cand = len(H)
    order = np.argsort(H, kind="stable")
    Hs = H[order]
    bounds = np.flatnonzero(np.diff(Hs)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(Hs)]])
    multi = np.flatnonzero(ends - starts >= 2)

    def ctx_of(t: int, p: int) -> str:
        a = max(0, p - W)
        if offsets is not None:
            return ts.texts[t][offsets[t][a][0] : offsets[t][p - 1][1]]
        return tokenizer.decode(ids[t][a:p].tolist())

    found: list[tuple[tuple[int, int], Cluster]] = []
    for g in multi:
        occ = order[starts[g] : ends[g]]
        # exact check of the hash group: split by the actual n-gram
        by_key: dict[bytes, list[tuple[int, int]]] = {}
        for o in occ:
            t, p = int(T[o]), int(P[o])
            by_key.setdefault(ids[t][p : p + n].tobytes(), []).append((t, p))
        for members in by_key.values():
            if len(members) < 2:
                continue
            members.sort()
            kept: list[tuple[int, int]] = []
            seen_ctx: set[bytes] = set()
            for t, p in members:
                if kept and kept[-1][0] == t and p < kept[-1][1] + n:
                    continue
                c = ids[t][max(0, p - W) : p].tobytes()
                if c in seen_ctx:
                    continue
                seen_ctx.add(c)
                kept.append((t, p))
            if len(kept) < 2:
                continue
            if len({int(ids[t][p - 1]) for t, p in kept}) == 1:
                continue  # not left-maximal
            t0, p0 = kept[0]
            cont = tokenizer.decode(ids[t0][p0 : p0 + n].tolist())
            found.append((kept[0], Cluster(cont, tuple(kept), ())))
    if not found:
        raise DataError(
            f"no clusters: no {n}-token continuation follows two different contexts in this "
            "corpus; use a larger or more repetitive corpus (builtin:code has many) or a "
            "smaller --ngram"
        )
    found.sort(key=lambda x: x[0])
    rng = np.random.default_rng(config.seed)
    pick = np.arange(len(found))
    if len(found) > config.max_clusters:
        pick = np.sort(rng.choice(len(found), size=config.max_clusters, replace=False))
    out = []
    for i in pick:
        c = found[int(i)][1]
        mem = c.members
        if len(mem) > config.max_members:
            sel = np.sort(rng.choice(len(mem), size=config.max_members, replace=False))
            mem = tuple(mem[int(j)] for j in sel)
        out.append(Cluster(c.continuation, mem, tuple(ctx_of(t, p) for t, p in mem)))
    return ClusterSet(tuple(out), len(found), n_cand, config, reference)


# ---------------------------------------------------------------------- states
@dataclass
class ClusterStates:
    """Per model: the last-context-token state of every context, per layer.

    Attributes:
        model: spec; layers / layer_index: points; n_blocks: L.
        cluster_dispersion: ``(n_layers, n_clusters)`` D of each cluster.
        all_dispersion: ``(n_layers,)`` D of all contexts pooled.
    """

    model: str
    layers: tuple[str, ...]
    layer_index: tuple[int, ...]
    n_blocks: int
    cluster_dispersion: np.ndarray
    all_dispersion: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)


def context_rows(model, contexts, window: int) -> list[np.ndarray]:
    """Token rows of ``contexts`` for ``model``: the last ``window`` tokens, its BOS first when
    it prepends one."""
    tok = model.tokenizer
    enc = tok(list(contexts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    bos = model.tokenizer.bos_token_id if model.bos_prepended else None
    rows = []
    for r in enc:
        r = list(r)[-window:]
        if not r:
            raise DataError("a context tokenizes to zero tokens")
        rows.append(np.asarray(([bos] if bos is not None else []) + r, dtype=np.int64))
    return rows


def cluster_states(model, cset: ClusterSet, *, layers: Any = "all", batch_size: int = 16,
                   progress: bool | None = None, cache: bool = True) -> ClusterStates:
    """Run ``model`` on every context of ``cset`` and compute per-layer cluster dispersions."""
    from ..metrics import dispersion
    from ..models import load_model
    from .dispersion import last_state

    t0 = time.perf_counter()
    model = load_model(model)
    points = model.resolve_points(layers)
    contexts = [c for cl in cset.clusters for c in cl.contexts]
    rows = context_rows(model, contexts, cset.config.window)
    res = forward_chunks(model, rows, points, {"last": last_state}, nll=False,
                         batch_size=batch_size, progress=progress, cache=cache,
                         desc=f"clusters {model.name}")
    cd = np.full((len(points), len(cset)), np.nan)
    alld = np.full(len(points), np.nan)
    bounds = np.concatenate([[0], np.cumsum(cset.sizes)])
    for li, p in enumerate(points):
        S = res.reduced["last"][p].astype(np.float64)
        for c in range(len(cset)):
            cd[li, c] = dispersion(S[bounds[c] : bounds[c + 1]], label=f"layer {p}")
        alld[li] = dispersion(S, label=f"layer {p}")
    return ClusterStates(model.name, points, tuple(model.point_index(p) for p in points),
                         model.n_blocks, cd, alld, {"forward_s": time.perf_counter() - t0})


def _wmean(d, w):
    return float((d * w).sum() / w.sum())


def _wdiff(a, b, w):
    return float(((a - b) * w).sum() / w.sum())


def cluster_rows(states: list[ClusterStates], cset: ClusterSet, *, texts_label: str,
                 revision: str = "") -> list[dict[str, Any]]:
    """Tidy rows: per layer ``cluster_dispersion`` (weighted mean, bootstrap CI over clusters)
    and ``cluster_dispersion_all``; model-level ``n_clusters``, ``n_contexts`` and, for every
    model after the first, ``cluster_dispersion_diff`` against the first at ``final``."""
    from ..metrics import bootstrap_ci

    cfg = cset.config
    s = f"texts={texts_label};ngram={cfg.ngram}"
    w = cset.sizes.astype(np.float64)
    rows: list[dict[str, Any]] = []
    for st in states:
        L1 = st.n_blocks + 1
        base = {"model": st.model, "revision": revision}
        for li, (lab, idx) in enumerate(zip(st.layers, st.layer_index)):
            d = st.cluster_dispersion[li]
            at = {**base, "layer": lab, "layer_index": idx, "depth": idx / L1}
            if len(d) >= 2:
                b = bootstrap_ci((d, w), _wmean, n_boot=cfg.n_boot, seed=cfg.seed, paired=True)
                lo, hi = b.low, b.high
            else:
                lo = hi = math.nan
            rows.append(table.row(**at, metric="cluster_dispersion", setting=s,
                                  value=_wmean(d, w), ci_low=lo, ci_high=hi, seed=cfg.seed,
                                  n=len(d)))
            rows.append(table.row(**at, metric="cluster_dispersion_all", setting=s,
                                  value=float(st.all_dispersion[li]), n=int(w.sum())))
        rows.append(table.row(**base, metric="n_clusters", setting=s, value=len(cset),
                              n=cset.n_found))
        rows.append(table.row(**base, metric="n_contexts", setting=s, value=int(w.sum())))
    ref = states[0]
    if "final" in ref.layers and len(cset) >= 2:
        a = ref.cluster_dispersion[ref.layers.index("final")]
        for st in states[1:]:
            if "final" not in st.layers:
                continue
            bvals = st.cluster_dispersion[st.layers.index("final")]
            b = bootstrap_ci((bvals, a, w), _wdiff, n_boot=cfg.n_boot, seed=cfg.seed,
                             paired=True)
            rows.append(table.row(model=st.model, revision=revision,
                                  metric="cluster_dispersion_diff",
                                  setting=f"{s};layer=final;vs={ref.model}",
                                  value=_wdiff(bvals, a, w), ci_low=b.low, ci_high=b.high,
                                  seed=cfg.seed, n=len(cset)))
    return rows


def config_dict(config: ClusterConfig) -> dict[str, Any]:
    return asdict(config)


# ---------------------------------------------------------------------- the experiment
@register
@dataclass(frozen=True)
class ClustersExperiment:
    """``lmgeom clusters``: clusters found with the first model's tokenizer, every model's
    within-cluster dispersion per layer.

    Attributes:
        models: model specs (the first is the reference tokenizer).
        texts: which texts.
        model: how models load.
        clusters: the cluster rule and sampling settings.
        cache: use the forward cache.
    """

    command: ClassVar[str] = "clusters"
    table: ClassVar[str] = "clusters"

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    texts: TextOptions = field(default_factory=lambda: TextOptions(spec="builtin:code", n=None))
    model: ModelOptions = field(default_factory=ModelOptions)
    clusters: ClusterConfig = field(default_factory=ClusterConfig)
    cache: bool = True

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError("give at least one model")
        object.__setattr__(self, "models", tuple(self.models))

    def settings(self) -> dict[str, Any]:
        return {"models": list(self.models), "texts": self.texts.spec, "n": self.texts.n,
                "dtype": self.model.dtype, "revision": self.model.revision,
                "clusters": config_dict(self.clusters), "text_column": self.texts.text_column,
                "label_column": self.texts.label_column, "split": self.texts.split}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> ClustersResult:
        config = self.clusters
        timings: dict[str, float] = {}
        texts = self.texts.load()
        states, info = [], []
        cset: ClusterSet | None = None
        for spec in self.models:
            with timed(timings, f"load_s[{spec}]"):
                model = self.model.load(spec)
            if cset is None:
                with timed(timings, "find_clusters_s"):
                    cset = find_clusters(model.tokenizer, texts, config, reference=spec)
            st = cluster_states(model, cset, layers=config.layers, batch_size=config.batch_size,
                                progress=progress, cache=self.cache)
            st.model = spec
            timings[f"forward_s[{spec}]"] = st.timings["forward_s"]
            states.append(st)
            info.append(model.describe())
            del model
        if cset is None:  # pragma: no cover - __post_init__ requires a model
            raise ConfigError("give at least one model")
        df = table.frame(cluster_rows(states, cset, texts_label=self.texts.spec,
                                      revision=self.model.revision or ""))
        return ClustersResult(self, df, cset, states, info, timings,
                              {"source": texts.source, "n": len(texts), "hash": texts.hash})


@dataclass
class ClustersResult:
    """The tidy table, the clusters and every model's per-layer cluster dispersions."""

    config: ClustersExperiment
    frame: Any
    cset: ClusterSet
    states: list[ClusterStates]
    model_info: list[dict[str, Any]]
    timings: dict[str, float]
    texts: dict[str, Any]

    def rows(self):
        return self.frame

    def manifest(self) -> dict[str, Any]:
        cset, sizes = self.cset, self.cset.sizes
        return {
            "models": list(self.config.models), "texts": self.texts["source"],
            "n_texts": self.texts["n"], "texts_hash": self.texts["hash"],
            "reference_tokenizer": cset.reference, "n_candidates": cset.n_candidates,
            "n_clusters_found": cset.n_found, "n_clusters_used": len(cset),
            "n_contexts": int(sizes.sum()), "cluster_size_mean": float(sizes.mean()),
            "examples": [{"continuation": c.continuation,
                          "contexts": [x[-120:] for x in c.contexts[:3]]}
                         for c in cset.clusters[:5]],
            "model_info": self.model_info,
            "seeds": {"texts": self.config.texts.seed,
                      "sampling_and_bootstrap": self.config.clusters.seed},
            "timings": dict(self.timings)}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        from ..report.figures_dispersion import plot_cluster_dispersion
        from ..report.html import write_report

        extra = plot_cluster_dispersion(self.frame, folder.plots)
        manifest["extra_plots"] = [str(p.relative_to(folder.path)) for p in extra]
        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom clusters — {', '.join(self.config.models)}")

    def summary(self) -> str:
        df, cset, models = self.frame, self.cset, self.config.models
        sizes = cset.sizes
        lines = [(f"{self.texts['source']}: {cset.n_found} clusters found (reference "
                  f"tokenizer {cset.reference}), {len(cset)} used, {int(sizes.sum())} contexts "
                  f"(mean size {sizes.mean():.2f})")]
        by: dict[str, dict[str, tuple]] = {}
        cd = df[df.metric == "cluster_dispersion"]
        for r in cd.itertuples():
            by.setdefault(r.layer, {})[r.model] = (r.value, r.ci_low, r.ci_high)
        rows = []
        for lab in dict.fromkeys(cd.layer):
            row = {"layer": lab}
            for m in models:
                v = by[lab].get(m)
                row[m] = (f"{v[0]:.3f} [{v[1]:.3f},{v[2]:.3f}]" if v and np.isfinite(v[1])
                          else (f"{v[0]:.3f}" if v else ""))
            rows.append(row)
        lines += ["\nwithin-cluster dispersion (size-weighted mean over clusters, 95 % CI):",
                  format_table(rows)]
        for r in df[df.metric == "cluster_dispersion_diff"].itertuples():
            lines.append(f"\n{r.model} - {models[0]} at final: {r.value:+.3f} "
                         f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
        return "\n".join(lines)
