"""kNN-LM and its label-free layer selection (METHODS.md, "kNN-LM layer selection").

Procedure, for one model:

1. **Corpora.** ``train_texts`` builds the datastore, ``eval_texts`` is scored. When no eval
   set is given (or it is the same spec), the train corpus is split by *text*: a seeded
   ``eval_fraction`` of its texts (``numpy.random.default_rng(seed)``) is held out, the rest
   is the training corpus, so no evaluated passage is in the datastore.
2. **Chunks.** Each corpus becomes fixed-length token chunks exactly as in
   :func:`lmgeom.texts.chunks.make_chunks` (texts joined by EOS, chunks of
   ``chunk_len`` tokens, BOS in front when the tokenizer adds one, a seeded sample of
   ``max_train_tokens // chunk_len`` resp. ``max_eval_tokens // chunk_len`` chunks).
3. **Dispersion of each candidate point** (the label-free part; with ``select``): a seeded
   sample of training chunks holding about ``select_tokens`` token positions is run once
   (:func:`lmgeom.lm.scoring.forward_chunks`, no logits). Per point two figures:
   ``knnlm_dispersion`` = ``D`` of all sampled token states pooled (``n ≈ select_tokens``;
   the ranking uses this one) and ``knnlm_dispersion_chunk`` = the mean over chunks of the
   token-level ``D`` of each chunk's states (the paper's released code). A prepended BOS is
   left out, as in ``lmgeom dispersion``. Points are ranked by dispersion, high first; the
   paper's claim is that the higher-dispersion point gives the better kNN-LM.
4. **Datastores** (:func:`lmgeom.lm.datastore.build_datastores`) for the evaluated points — every
   candidate, or the ``top`` N by dispersion — from one forward pass over the training chunks.
5. **Queries** of every evaluated point and ``log p_LM(target)`` from one forward pass over the
   eval chunks; the base perplexity is also computed by
   :func:`lmgeom.lm.scoring.forward_chunks` (the shared perplexity) and checked against the
   λ = 0 value.
6. **Retrieval** once per point (k neighbours), then the interpolated perplexity for every
   λ of the sweep (``lambdas`` ∪ {``lam``}).
7. **Selection check**: the point with the highest dispersion vs the point with the lowest
   kNN-LM perplexity at ``lam`` (ties: the first in candidate order); ``selection_match`` is 1
   when they agree.

Tidy rows (:mod:`lmgeom.results.table`; ``setting`` starts with ``eval=SPEC``):
per point: ``knnlm_perplexity`` (setting ``...;lambda=X``), ``knnlm_target_recall``,
``knnlm_datastore_size``, ``knnlm_dispersion`` / ``knnlm_dispersion_chunk`` (setting
``train=SPEC;tokens=N``), ``knnlm_dispersion_rank``; model level (``layer = ""``):
``perplexity`` (base LM on the eval chunks, setting ``eval=SPEC``), ``knnlm_selection_match``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..._paths import check_writable_path
from ...errors import ConfigError, TextsError
from ...lm.datastore import IndexSpec, build_datastores
from ...lm.knn_states import position_states
from ...lm.knnlm import (
    DEFAULT_K,
    DEFAULT_LAMBDA,
    DEFAULT_LAMBDAS,
    DEFAULT_TEMPERATURE,
    DISTANCES,
    KnnEval,
    evaluate,
    perplexity_of,
    temperature_label,
)
from ...lm.scoring import forward_chunks, model_context
from ...metrics.sample_size import MIN_EVAL_TOKENS, corr_flag, describe_flag, join_flags
from ...models.bundled import DEFAULT_MODEL
from ...results import table
from ...results.console import FLAG_MARK, flag_footer, format_table, mark_flags
from ...texts import as_textset
from ...texts.chunks import make_chunks
from ..base import register
from ..options import ModelOptions, TextOptions
from .dispersion import (
    DEFAULT_SELECT_TOKENS,
    PointDispersion,
    measure_point_dispersion,
)

log = logging.getLogger(__name__)

DEFAULT_POINT = "last.ffn_in"
"""The reference kNN-LM key (Khandelwal et al.: the input of the last FFN, after its norm)."""
DEFAULT_CANDIDATES = "last.attn_out,last.ffn_in,last.ffn_out,last,final"
DEFAULT_TRAIN_TEXTS = "builtin:wiki"
DEFAULT_CHUNK_LEN = 512
DEFAULT_MAX_TRAIN_TOKENS = 100_000
DEFAULT_MAX_EVAL_TOKENS = 4096
DEFAULT_EVAL_FRACTION = 0.1


@dataclass(frozen=True)
class KnnConfig:
    """Settings of a kNN-LM run (all recorded in the manifest)."""

    point: str = DEFAULT_POINT
    select: bool = False
    candidates: str = DEFAULT_CANDIDATES
    top: int | None = None
    select_tokens: int = DEFAULT_SELECT_TOKENS
    k: int = DEFAULT_K
    lam: float = DEFAULT_LAMBDA
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    temperature: float | str = DEFAULT_TEMPERATURE
    temperatures: tuple[float | str, ...] = ()
    distance: str = "sqeuclidean"
    index: str = "flat"
    nlist: int | None = None
    nprobe: int | None = None
    pq_m: int | None = None
    recompute: bool = False
    chunk_len: int = DEFAULT_CHUNK_LEN
    max_train_tokens: int = DEFAULT_MAX_TRAIN_TOKENS
    max_eval_tokens: int = DEFAULT_MAX_EVAL_TOKENS
    eval_fraction: float = DEFAULT_EVAL_FRACTION
    batch_size: int = 4
    bos: str = "auto"
    seed: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        for lam in (self.lam, *self.lambdas):
            if not 0.0 <= float(lam) <= 1.0:
                raise ConfigError(f"lambda values must be in [0, 1], got {lam}")
        for temp in (self.temperature, *self.temperatures):
            if isinstance(temp, str) and temp.strip().lower() == "auto":
                continue
            try:
                ok = float(temp) > 0 and math.isfinite(float(temp))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ConfigError(f"temperature must be a positive number or 'auto', got {temp!r}")
        if self.distance not in DISTANCES:
            raise ConfigError(f"distance must be one of {', '.join(DISTANCES)}")
        if self.top is not None and self.top < 1:
            raise ConfigError(f"top must be >= 1, got {self.top}")
        if self.chunk_len < 2:
            raise ConfigError(f"chunk_len must be >= 2, got {self.chunk_len}")
        if self.max_train_tokens < self.chunk_len or self.max_eval_tokens < self.chunk_len:
            raise ConfigError(f"max_train_tokens and max_eval_tokens must be at least one chunk "
                              f"({self.chunk_len} tokens)")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.select_tokens < 2:
            raise ConfigError(f"select_tokens must be >= 2, got {self.select_tokens}")
        IndexSpec(kind=self.index, nlist=self.nlist, nprobe=self.nprobe, pq_m=self.pq_m)

    @property
    def index_spec(self) -> IndexSpec:
        return IndexSpec(kind=self.index, nlist=self.nlist, nprobe=self.nprobe, pq_m=self.pq_m,
                         seed=self.seed)

    @property
    def sweep(self) -> tuple[float, ...]:
        return tuple(sorted({float(x) for x in (*self.lambdas, self.lam)}))


def config_dict(config: KnnConfig) -> dict[str, Any]:
    d = asdict(config)
    d["lambdas"] = list(config.lambdas)
    d["temperatures"] = list(config.temperatures)
    return d


# ---------------------------------------------------------------------- corpora
def split_corpus(train, eval_=None, *, fraction: float = DEFAULT_EVAL_FRACTION, seed: int = 0):
    """``(train TextSet, eval TextSet, how)``: ``eval_`` as given, or a seeded ``fraction`` of
    the train texts held out (the rest trains)."""
    tr = as_textset(train)
    if eval_ is not None:
        ev = as_textset(eval_)
        if ev.hash != tr.hash:
            return tr, ev, "given"
    if len(tr) < 2:
        raise TextsError("the training corpus has fewer than 2 texts: it cannot be split into "
                         "a datastore part and a held-out part; give --eval-texts")
    rest, held = tr.split(fraction, seed)  # the one splitter (TextSet.split)
    return rest, held, f"held-out {len(held)} of {len(tr)} texts (seed {seed})"


# ---------------------------------------------------------------------- the run
@dataclass
class KnnRun:
    """Everything one kNN-LM run measured.

    Attributes:
        model: model spec; ``train`` / ``eval``: corpus labels; ``split``: how eval was made.
        points: the candidate points (canonical labels), ``evaluated``: those with a datastore.
        dispersion: ``point -> PointDispersion`` (every candidate).
        ranking: candidates by dispersion, high first.
        evals: ``point -> KnnEval``.
        base_perplexity: base LM on the eval chunks (:func:`forward_chunks`).
        base_perplexity_lambda0: the same from the kNN-LM pass at λ = 0 (must agree).
        picked, best, match: dispersion's choice, the measured best at ``config.lam``, equal?
        n_train_tokens / n_eval_tokens: datastore entries / scored tokens.
    """

    model: str
    train: str
    eval: str
    split: str
    config: KnnConfig
    points: tuple[str, ...]
    evaluated: tuple[str, ...]
    layer_index: dict[str, int]
    n_blocks: int
    dispersion: dict[str, PointDispersion]
    ranking: tuple[str, ...]
    evals: dict[str, KnnEval]
    base_perplexity: float
    base_perplexity_lambda0: float
    picked: str
    best: str
    match: bool
    n_train_tokens: int
    n_eval_tokens: int
    datastores: dict[str, str] = field(default_factory=dict)
    best_by_setting: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def summary(self) -> list[dict[str, Any]]:
        """One dict per candidate point (CLI table)."""
        out = []
        lam = float(self.config.lam)
        for p in self.ranking:
            ev = self.evals.get(p)
            d = self.dispersion[p]
            row = {"point": p, "dispersion": d.pooled, "disp_chunk": d.chunk_mean,
                   "rank": self.ranking.index(p) + 1}
            if ev is not None:
                row[f"ppl λ={lam:g}"] = ev.perplexity[lam]
                tl, bl, bv = ev.best
                row["best (T, λ)"] = f"{tl}, {bl:g}"
                row["ppl best"] = bv
                row["recall"] = ev.target_recall
            else:
                row[f"ppl λ={lam:g}"] = "not run"
            out.append(row)
        return out


def run_knnlm(model, train, eval_=None, config: KnnConfig | None = None, *,
              train_label: str | None = None, eval_label: str | None = None,
              cache: bool = True, datastore_root=None, threads: int | None = None,
              progress: bool | None = None) -> KnnRun:
    """Dispersion of the candidate points, datastores, retrieval and the λ sweep (see the
    module docstring)."""
    from ...models import load_model

    config = config or KnnConfig()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    model = load_model(model)
    tr, ev, how = split_corpus(train, eval_, fraction=config.eval_fraction, seed=config.seed)
    train_label = train_label or tr.source
    eval_label = eval_label or (f"{train_label} (held out)" if how != "given" else ev.source)
    if config.select:
        points = model.resolve_points(config.candidates)
    else:
        points = model.resolve_points(config.point)
    cl = config.chunk_len

    ctx = model_context(model)
    if ctx is not None and cl + 1 > ctx:
        raise ConfigError(f"chunk_len {cl} (+1 for a BOS) exceeds the context of {model.name} "
                          f"({ctx} tokens); use a smaller --chunk-len")
    tr_ch = make_chunks(model, tr, cl, max_chunks=max(1, config.max_train_tokens // cl),
                        seed=config.seed, bos=config.bos)
    ev_ch = make_chunks(model, ev, cl, max_chunks=max(1, config.max_eval_tokens // cl),
                        seed=config.seed, bos=config.bos)
    timings["chunking_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    disp = measure_point_dispersion(model, tr_ch, points, n_tokens=config.select_tokens,
                                    seed=config.seed, batch_size=config.batch_size,
                                    cache=cache, progress=progress)
    timings["dispersion_s"] = time.perf_counter() - t
    ranking = tuple(sorted(points, key=lambda p: (-_finite(disp[p].pooled), points.index(p))))
    evaluated = ranking[: config.top] if (config.select and config.top) else points
    evaluated = tuple(p for p in points if p in evaluated)  # keep candidate order

    t = time.perf_counter()
    stores = build_datastores(model, tr_ch.tokens, evaluated, batch_size=config.batch_size,
                              cache=cache, root=datastore_root, progress=progress)
    timings["datastore_s"] = time.perf_counter() - t
    t = time.perf_counter()
    q = position_states(model, ev_ch.tokens, evaluated, lm_log_prob=True,
                        batch_size=config.batch_size, progress=progress,
                        desc=f"queries {model.name}")
    timings["queries_s"] = time.perf_counter() - t
    t = time.perf_counter()
    base = forward_chunks(model, ev_ch.tokens, nll=True, batch_size=config.batch_size,
                          progress=progress, desc=f"ppl {model.name}")
    base_ppl = math.exp(float(base.nll_sum.sum()) / float(base.n_predicted.sum()))
    base0 = perplexity_of(q.lm_log_prob)
    if not math.isclose(base_ppl, base0, rel_tol=1e-6):
        log.warning("base perplexity %.6g (perplexity module) differs from the kNN-LM pass at "
                    "lambda=0 (%.6g)", base_ppl, base0)
    timings["base_ppl_s"] = time.perf_counter() - t

    evals: dict[str, KnnEval] = {}
    for p in evaluated:
        t = time.perf_counter()
        evals[p] = evaluate(stores[p], q.states[p], q.targets, q.lm_log_prob, k=config.k,
                            lambdas=config.sweep, temperature=config.temperature,
                            temperatures=config.temperatures, distance=config.distance, index=config.index_spec,
                            recompute=config.recompute, threads=threads)
        timings[f"search_s[{p}]"] = time.perf_counter() - t
    lam = float(config.lam)
    picked = next(p for p in ranking if p in evaluated)
    best = min(evaluated, key=lambda p: (evals[p].perplexity[lam], evaluated.index(p)))
    best_by_setting = {}
    for tl, lam_ in next(iter(evals.values())).grid:
        if lam_ > 0:
            b = min(evaluated, key=lambda p, _k=(tl, lam_): (evals[p].grid[_k], evaluated.index(p)))
            best_by_setting[f"T={tl};lambda={lam_:g}"] = b
    timings["total_s"] = time.perf_counter() - t0
    return KnnRun(
        model=model.name, train=train_label, eval=eval_label, split=how, config=config,
        points=points, evaluated=evaluated,
        layer_index={p: model.point_index(p) for p in points}, n_blocks=model.n_blocks,
        dispersion=disp, ranking=ranking, evals=evals, base_perplexity=base_ppl,
        base_perplexity_lambda0=base0, picked=picked, best=best, match=picked == best,
        n_train_tokens=len(stores[evaluated[0]]), n_eval_tokens=len(q),
        datastores={p: str(stores[p].folder) for p in evaluated},
        best_by_setting=best_by_setting,
        info={"train_texts": len(tr), "eval_texts": len(ev), "train_hash": tr.hash,
              "eval_hash": ev.hash, "train_chunks": len(tr_ch), "eval_chunks": len(ev_ch),
              "train_chunks_available": tr_ch.n_available,
              "eval_chunks_available": ev_ch.n_available, "bos": tr_ch.bos,
              "index": {p: evals[p].index for p in evaluated},
              "k_used": {p: evals[p].k for p in evaluated}},
        timings=timings,
    )


def _tname(t) -> str:
    return temperature_label(t)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def knnlm_rows(run: KnnRun, *, revision: str = "") -> list[dict[str, Any]]:
    """Tidy rows of one :class:`KnnRun` (see the module docstring)."""
    c = run.config
    L1 = run.n_blocks + 1
    base = {"model": run.model, "revision": revision}
    s_eval = f"eval={run.eval}"
    rows = [table.row(**base, metric="perplexity", setting=s_eval, value=run.base_perplexity,
                      n=run.n_eval_tokens)]
    for p in run.points:
        li = run.layer_index[p]
        at = {**base, "layer": p, "layer_index": li, "depth": li / L1}
        d = run.dispersion[p]
        s_train = f"train={run.train};tokens={d.n_tokens}"
        rows.append(table.row(**at, metric="knnlm_dispersion", setting=s_train, value=d.pooled,
                              seed=c.seed, n=d.n_tokens))
        rows.append(table.row(**at, metric="knnlm_dispersion_chunk", setting=s_train,
                              value=d.chunk_mean, seed=c.seed, n=d.n_chunks,
                              flag=corr_flag(d.n_chunks)))
        rows.append(table.row(**at, metric="knnlm_dispersion_rank", setting=s_train,
                              value=run.ranking.index(p) + 1, n=len(run.points)))
        ev = run.evals.get(p)
        if ev is None:
            continue
        knn = f"k={ev.k};distance={ev.distance};index={ev.index['kind']}"
        few = "few_tokens" if ev.n_queries < MIN_EVAL_TOKENS else ""
        order = sorted(ev.grid.items(), key=lambda kv: (kv[0][0] != ev.temperature_name, kv[0]))
        for (tl, lam), ppl in order:
            rows.append(table.row(**at, metric="knnlm_perplexity",
                                  setting=f"{s_eval};lambda={lam:g};T={tl};{knn}", value=ppl,
                                  n=ev.n_queries, flag=few))
        for tl, tv in ev.temperatures.items():
            rows.append(table.row(**at, metric="knnlm_temperature", setting=f"{s_eval};T={tl}",
                                  value=tv, n=ev.n_queries))
        rows.append(table.row(**at, metric="knnlm_nn_distance", setting=f"{s_eval};{knn}",
                              value=ev.nn_distance, n=ev.n_queries))
        rows.append(table.row(**at, metric="knnlm_target_recall", setting=f"{s_eval};{knn}",
                              value=ev.target_recall, n=ev.n_queries))
        rows.append(table.row(**at, metric="knnlm_datastore_size", setting=f"train={run.train}",
                              value=ev.n_keys))
    rows.append(table.row(**base, metric="knnlm_selection_match",
                          setting=f"{s_eval};lambda={c.lam:g};T={_tname(c.temperature)};"
                                  f"picked={run.picked};best={run.best}",
                          value=float(run.match), n=len(run.evaluated),
                          flag="few_tokens" if run.n_eval_tokens < MIN_EVAL_TOKENS else ""))
    return rows


# ---------------------------------------------------------------------- the experiment
@register
@dataclass(frozen=True)
class KnnlmExperiment:
    """``lmgeom knnlm``: one model, a datastore corpus and a held-out corpus.

    Attributes:
        spec: the model spec.
        train_texts: corpus of the datastore.
        eval_texts: held-out corpus (``None``: a seeded share of the training texts).
        n: texts per corpus (a seeded sample; ``None``: all).
        texts_seed: seed of that sample.
        model: how the model loads.
        knnlm: the kNN-LM settings.
        cache: keep datastores and use the forward cache.
        datastore_dir: where datastores live (default ``$LMGEOM_CACHE/knnlm``; not part of the
            run's signature).
        threads: FAISS OpenMP threads (not part of the signature).
    """

    command: ClassVar[str] = "knnlm"
    table: ClassVar[str] = "knnlm"

    spec: str = DEFAULT_MODEL
    train_texts: str = DEFAULT_TRAIN_TEXTS
    eval_texts: str | None = None
    n: int | None = None
    texts_seed: int = 0
    model: ModelOptions = field(default_factory=ModelOptions)
    knnlm: KnnConfig = field(default_factory=KnnConfig)
    cache: bool = True
    datastore_dir: str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.datastore_dir is not None:  # refused before the forward passes, not after
            folder = Path(self.datastore_dir).expanduser()
            if folder.exists() and not folder.is_dir():
                raise ConfigError(f"--datastore-dir {self.datastore_dir} is a file, not a "
                                  "folder; give a folder for the datastores (created if new)")
            check_writable_path(folder, option="--datastore-dir")

    def settings(self) -> dict[str, Any]:
        return {"model": self.spec, "revision": self.model.revision, "dtype": self.model.dtype,
                "train_texts": self.train_texts, "eval_texts": self.eval_texts, "n": self.n,
                "knnlm": config_dict(self.knnlm)}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> KnnlmResult:
        t = time.perf_counter()
        train = TextOptions(spec=self.train_texts, n=self.n, seed=self.texts_seed).load()
        ev = (TextOptions(spec=self.eval_texts, n=self.n, seed=self.texts_seed).load()
              if self.eval_texts else None)
        texts_s = time.perf_counter() - t
        t = time.perf_counter()
        model = self.model.load(self.spec)
        load_s = time.perf_counter() - t
        res = run_knnlm(model, train, ev, self.knnlm, train_label=self.train_texts,
                        eval_label=self.eval_texts, cache=self.cache,
                        datastore_root=self.datastore_dir, threads=self.threads,
                        progress=progress)
        res.model = self.spec
        df = table.frame(knnlm_rows(res, revision=self.model.revision or ""))
        return KnnlmResult(self, df, res, model.describe(),
                           {"texts_s": texts_s, "load_s": load_s})


def _show(point: str) -> str:
    if point.isdigit():
        return f"{point} (residual)"
    return "final (post-norm)" if point == "final" else point


@dataclass
class KnnlmResult:
    """The tidy table and the :class:`KnnRun` behind it."""

    config: KnnlmExperiment
    frame: Any
    run: KnnRun
    model_info: dict[str, Any]
    timings: dict[str, float]

    def rows(self):
        return self.frame

    def manifest(self) -> dict[str, Any]:
        res, c = self.run, self.config
        return {
            "models": [c.spec], "texts": [c.train_texts, c.eval_texts or "held out"],
            "model_info": [self.model_info], "split": res.split, "corpora": res.info,
            "points": list(res.points), "evaluated": list(res.evaluated),
            "dispersion_ranking": list(res.ranking), "picked_by_dispersion": res.picked,
            "best_by_perplexity": res.best, "selection_match": res.match,
            "best_by_setting": res.best_by_setting,
            "base_perplexity": res.base_perplexity,
            "base_perplexity_lambda0": res.base_perplexity_lambda0,
            "n_datastore_tokens": res.n_train_tokens, "n_eval_tokens": res.n_eval_tokens,
            "datastores": res.datastores,
            "distance": "squared L2 (FAISS IndexFlatL2/IVF output) used as d in exp(-d/T)"
                        if c.knnlm.distance == "sqeuclidean" else "L2 (square root of FAISS output)",
            "seeds": {"split": c.knnlm.seed, "chunks": c.knnlm.seed,
                      "dispersion_sample": c.knnlm.seed, "index_training": c.knnlm.seed,
                      "texts": c.texts_seed},
            "timings": {**self.timings, **res.timings}}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        from ...report.figures_dispersion import plot_knnlm
        from ...report.html import write_report

        res, c = self.run, self.config
        figs = plot_knnlm(res, folder.plots)
        caption = (f"Held-out perplexity of the interpolated kNN-LM per measurement point (left) "
                   f"and the token-level dispersion of each point on the training corpus (right, "
                   f"red: the dispersion pick). At lambda={c.knnlm.lam:g} the best point is "
                   f"{res.best}; dispersion picked {res.picked}.")
        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom knnlm — {c.spec} on {c.train_texts}",
                            extra_figures=[("kNN-LM by measurement point", figs, caption)])

    def summary(self) -> str:
        res, c = self.run, self.config
        cfg, lam = c.knnlm, c.knnlm.lam
        ev0 = next(iter(res.evals.values()))
        held = res.split if res.split != "given" else c.eval_texts
        sq = " as is" if cfg.distance == "sqeuclidean" else ", square-rooted"
        n_disp = next(iter(res.dispersion.values())).n_tokens
        lines = [(f"{c.spec}: datastore of {res.n_train_tokens} tokens from {c.train_texts}, "
                  f"{res.n_eval_tokens} held-out tokens ({held})"),
                 (f"base LM perplexity {res.base_perplexity:.4f} (lambda=0 of the kNN-LM pass: "
                  f"{res.base_perplexity_lambda0:.4f})"),
                 (f"k={ev0.k}, T={ev0.temperature_name}, d={cfg.distance} (FAISS squared "
                  f"L2{sq}), index={ev0.index['kind']}; dispersion on {n_disp} training "
                  "tokens\n")]
        table_rows = res.summary()
        for r in table_rows:
            r["point"] = _show(r["point"])
        flags = [join_flags((corr_flag(res.dispersion[p].n_chunks),
                             "few_tokens" if p in res.evals
                             and res.evals[p].n_queries < MIN_EVAL_TOKENS else ""))
                 for p in res.ranking]
        lines.append(format_table(mark_flags(table_rows, flags), floatfmt="{:.4g}"))
        footer = flag_footer(flags, describe_flag, "in the rows marked")
        if footer:
            lines.append(footer)
        sweep = []
        for p in res.evaluated:
            ev_ = res.evals[p]
            for tl, tv in ev_.temperatures.items():
                sweep.append({"point": _show(p), "T": f"{tl} (={tv:.4g})" if tl == "auto" else tl,
                              **{f"λ={lam_:g}": ev_.grid[(tl, lam_)] for lam_ in cfg.sweep}})
        lines += ["", format_table(sweep, floatfmt="{:.4g}")]
        if cfg.select or len(res.evaluated) > 1:
            verdict = "matches" if res.match else "does NOT match"
            if res.n_eval_tokens < MIN_EVAL_TOKENS:
                verdict += (f" ({FLAG_MARK} few_tokens: {res.n_eval_tokens} held-out tokens "
                            "cannot separate the layers' perplexities)")
            gain = res.evals[res.best].perplexity[lam]
            lines.append(f"\ndispersion picks {res.picked}; the lowest kNN-LM perplexity at "
                         f"lambda={lam:g}, T={ev0.temperature_name} is {res.best} ({gain:.4g}): "
                         f"the dispersion choice {verdict} the best")
            others = {k_: v for k_, v in res.best_by_setting.items()
                      if k_ != f"T={ev0.temperature_name};lambda={lam:g}"}
            if others:
                lines.append("best point at the other settings: " + "; ".join(
                    f"{k_}: {v}{' (= pick)' if v == res.picked else ''}"
                    for k_, v in others.items()))
        if not math.isfinite(res.base_perplexity):  # pragma: no cover - defensive
            lines.append("warning: base perplexity is not finite")
        return "\n".join(lines)
