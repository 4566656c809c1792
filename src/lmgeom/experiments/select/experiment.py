"""Label-free model / checkpoint selection with the dispersion gap (METHODS.md,
"Applications": dispersion gap).

``G = D(T) + D(T, T̄)``: ``D(T)`` is the dispersion among the domain tokens' vectors,
``D(T, T̄)`` the mean cosine distance between them and general tokens' vectors
(:func:`lmgeom.metrics.dispersion_gap`). A higher G is read as "the model separates the
domain's tokens better", i.e. a better model for the domain. Two variants; every number says
which one it used (``variant=`` in ``setting``):

* ``variant=W_U`` (no forward pass): the vectors are the tokens' rows of the output
  projection ``W_U``.
* ``variant=states`` (forward pass): the same formula on hidden states — a seeded sample of
  token states (``tokens`` pooling, position 0 excluded) of domain text vs general text at
  ``state_layer`` (default ``final``, the post-norm state the readout reads).

**Domain tokens T** (``W_U`` variant). ``math``: the digits ``0``–``9``; ``code``: Python's
keywords (``keyword.kwlist``); or a user-given comma-separated word list. Each word is
mapped with *each candidate's own tokenizer*: its forms ``word`` and ``" word"`` (leading
space; ``forms="both"``, the default; ``bare`` / ``space`` keep one) are encoded without
special tokens, and a form is kept only when it encodes to **exactly one** token id; words with
no single-id form (e.g. ``nonlocal`` → ``non`` + ``local`` in SmolLM2) are dropped and listed in
the manifest, and duplicate ids are counted once. So T is the set of distinct ids of
single-token forms; its size can differ between tokenizers (the manifest records every kept
``(word, form, id)``).

**General tokens T̄.** The general corpus (``general_texts``, default ``builtin:wiki``,
``n_general_texts`` texts) is tokenized without special tokens; ids are counted; special
tokens and T's ids are removed; of the ``general_pool`` most frequent remaining ids (ties by
id) a seeded sample of ``n_general`` is drawn (``numpy.random.default_rng(seed)``, without
replacement). "Frequent" is therefore measured on real text with the model's own tokenizer.

**Measured quality** (where eval text is available: ``eval_texts``, else ``domain_texts``,
else ``builtin:math`` / ``builtin:code`` for those domains): perplexity of held-out domain text
(:func:`lmgeom.lm.perplexity.perplexity`, sliding windows, every token after the first
scored) and **bits per byte** = ``Σ NLL / ln 2 / Σ scored UTF-8 bytes``. Rankings use bits
per byte: within one tokenizer it orders candidates exactly as perplexity does on the same
texts, and unlike per-token perplexity it is comparable across tokenizers (model families).
Scored bytes = the texts' bytes minus, for tokenizers that prepend no BOS, the bytes of each
text's first (unscored) token. When the states variant and the evaluation use the same corpus
it is split by text into two disjoint halves (seeded), so states never come from scored text.

**Agreement**: Spearman ρ between G and ``-bits_per_byte`` over the candidates (+1: the
label-free ranking equals the measured one). With at least :data:`MIN_N_CI` candidates a
bootstrap 95 % interval (:func:`lmgeom.metrics.correlation_with_ci`); with fewer, the value
and n only (for n = 2 the value is ±1: whether the two orders agree).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...activations.core import extract
from ...errors import ConfigError, ModelError, TextsError
from ...lm.perplexity import perplexity
from ...lm.scoring import model_context
from ...metrics import dispersion_gap, dispersion_gap_states
from ...metrics.sample_size import corr_flag, describe_flag
from ...metrics.uncertainty import MIN_N_CI, Agreement, rank_agreement, ranks_desc
from ...results import table
from ...results.console import FLAG_MARK, flag_footer, format_table
from ...texts import limit_textset, load_texts
from ..base import register
from .inputs import (
    FORMS,
    Candidate,
    TokenSet,
    domain_token_ids,
    domain_words,
    general_token_ids,
)

__all__ = [
    "DEFAULT_EVAL_TEXTS",
    "DEFAULT_GENERAL_TEXTS",
    "VARIANTS",
    "CandidateResult",
    "Corpora",
    "SelectConfig",
    "SelectExperiment",
    "SelectResult",
    "SelectRun",
    "config_dict",
    "load_corpora",
    "measure_candidate",
    "run_select",
    "scored_bytes",
    "select_rows",
]

log = logging.getLogger(__name__)

DEFAULT_EVAL_TEXTS = {"math": "builtin:math", "code": "builtin:code"}
DEFAULT_GENERAL_TEXTS = "builtin:wiki"
VARIANTS = ("W_U", "states")


# ---------------------------------------------------------------------- config & measurement
@dataclass(frozen=True)
class SelectConfig:
    """Settings of a selection run (all recorded in the manifest)."""

    domain: str = "math"
    forms: str = "both"
    n_general: int = 500
    general_pool: int = 5000
    general_texts: str = DEFAULT_GENERAL_TEXTS
    n_general_texts: int = 300
    domain_texts: str | None = None
    state_layer: str = "final"
    state_tokens: int = 2000
    n_state_texts: int = 64
    state_max_length: int = 256
    eval_texts: str | None = None
    n_eval: int = 48
    max_length: int = 512
    stride: int = 256
    perplexity: bool = True
    batch_size: int = 8
    n_boot: int = 1000
    seed: int = 0

    def __post_init__(self):
        if self.forms not in FORMS:
            raise ConfigError(f"forms must be one of {', '.join(FORMS)}, got {self.forms!r}")
        domain_words(self.domain)
        for name in ("n_general", "general_pool", "n_general_texts", "state_tokens",
                     "n_state_texts", "n_eval", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.state_tokens < 2:
            raise ConfigError("state_tokens must be >= 2")
        if not 1 <= self.stride < self.max_length:
            raise ConfigError(f"stride must be in 1..max_length-1, got {self.stride}")

    @property
    def domain_name(self) -> str:
        return domain_words(self.domain)[0]

    @property
    def eval_spec(self) -> str | None:
        if not self.perplexity:
            return None
        return self.eval_texts or self.domain_texts or DEFAULT_EVAL_TEXTS.get(self.domain_name)


@dataclass
class Corpora:
    """The text sets one selection run uses (shared by every candidate)."""

    general: Any
    domain_states: Any | None
    general_states: Any | None
    eval: Any | None
    info: dict[str, Any] = field(default_factory=dict)


def load_corpora(config: SelectConfig, loader=None) -> Corpora:
    """Load / split the corpora (see the module docstring); ``loader(spec)`` → TextSet
    (default :func:`lmgeom.texts.load_texts`)."""
    load = loader or (lambda spec: load_texts(spec))
    seed = config.seed
    general_full = load(config.general_texts)
    general = limit_textset(general_full, config.n_general_texts, seed)
    info: dict[str, Any] = {"general_texts": config.general_texts, "n_general_texts": len(general)}
    dom_states = gen_states = ev = None
    eval_spec = config.eval_spec
    if config.domain_texts:
        dom = load(config.domain_texts)
        if eval_spec and eval_spec == config.domain_texts:
            if len(dom) < 2:
                raise TextsError(f"{config.domain_texts} has fewer than 2 texts: cannot split "
                                 "it into a states half and an evaluation half")
            perm = np.random.default_rng(seed).permutation(len(dom))
            half = len(dom) // 2
            ev = limit_textset(dom.subset(np.sort(perm[:half])), config.n_eval, seed)
            dom = dom.subset(np.sort(perm[half:]))
            info["split"] = (f"{config.domain_texts} split by text (seed {seed}): {half} texts "
                             f"for evaluation, {len(perm) - half} for states")
        dom_states = limit_textset(dom, config.n_state_texts, seed)
        gen_states = limit_textset(general_full, config.n_state_texts, seed + 1)
        info.update({"domain_texts": config.domain_texts, "n_domain_state_texts": len(dom_states),
                     "n_general_state_texts": len(gen_states)})
    if eval_spec and ev is None:
        ev = limit_textset(load(eval_spec), config.n_eval, seed)
    if ev is not None:
        info.update({"eval_texts": eval_spec, "n_eval_texts": len(ev), "eval_hash": ev.hash})
    return Corpora(general=general, domain_states=dom_states, general_states=gen_states, eval=ev,
                   info=info)


@dataclass
class CandidateResult:
    """What was measured for one candidate."""

    candidate: Candidate
    gap_wu: Any  # DispersionGap
    gap_states: Any | None
    tokens: TokenSet
    general_info: dict[str, Any]
    perplexity: float = math.nan
    bits_per_byte: float = math.nan
    n_eval_tokens: int = 0
    n_eval_bytes: int = 0
    describe: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def scored_bytes(model, texts: Sequence[str]) -> int:
    """UTF-8 bytes of the scored part of ``texts``: all bytes, minus each text's first token
    when the tokenizer prepends no BOS (that token is never scored)."""
    total = sum(len(t.encode("utf-8")) for t in texts)
    if model.bos_prepended:
        return total
    tok = model.tokenizer
    first = tok(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
    return total - sum(len(tok.decode([row[0]]).encode("utf-8")) for row in first if row)


def measure_candidate(model, candidate: Candidate, config: SelectConfig, corpora: Corpora, *,
                      cache: bool = True, progress: bool | None = None) -> CandidateResult:
    """Dispersion gap (both variants where requested) and domain perplexity of one model."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    _, words = domain_words(config.domain)
    ts = domain_token_ids(model.tokenizer, words, forms=config.forms)
    if len(ts.ids) < 2:
        raise ConfigError(f"{candidate.name}: only {len(ts.ids)} of the domain words encode to a "
                          f"single token (dropped: {', '.join(ts.dropped)}); use --forms both "
                          "or other words")
    if ts.dropped:
        log.info("%s: %d domain words have no single-token form: %s", candidate.name,
                 len(ts.dropped), ", ".join(ts.dropped))
    gen_ids, ginfo = general_token_ids(model.tokenizer, corpora.general.texts, ts.ids,
                                       n=config.n_general, pool=config.general_pool,
                                       seed=config.seed)
    W = model.W_U.detach()
    if int(max(ts.ids.max(), gen_ids.max())) >= W.shape[0]:
        raise ModelError(f"{candidate.name}: tokenizer ids exceed the W_U rows ({W.shape[0]})")
    gap_wu = dispersion_gap(W, ts.ids, gen_ids, label=candidate.name)
    timings["gap_wu_s"] = time.perf_counter() - t0
    gap_states = None
    if corpora.domain_states is not None:
        t = time.perf_counter()
        layer = model.resolve_points(config.state_layer)
        if len(layer) != 1:
            raise ConfigError(f"state_layer must name one point, got {config.state_layer!r}")
        kw = {"layers": list(layer), "pooling": "tokens", "n_tokens": config.state_tokens,
                  "seed": config.seed, "max_length": config.state_max_length,
                  "batch_size": config.batch_size, "cache": cache, "progress": progress}
        H_dom = extract(model, corpora.domain_states, **kw).layer(layer[0])
        H_gen = extract(model, corpora.general_states, **kw).layer(layer[0])
        gap_states = dispersion_gap_states(H_dom, H_gen, label=candidate.name)
        timings["gap_states_s"] = time.perf_counter() - t
    res = CandidateResult(candidate=candidate, gap_wu=gap_wu, gap_states=gap_states, tokens=ts,
                          general_info=ginfo, describe=model.describe(), timings=timings)
    if corpora.eval is not None:
        t = time.perf_counter()
        ctx = model_context(model)
        max_len = min(config.max_length, ctx) if ctx else config.max_length
        stride = config.stride if config.stride < max_len else max(1, max_len // 2)
        pr = perplexity(model, corpora.eval, max_length=max_len, stride=stride,
                        batch_size=config.batch_size, progress=progress)
        res.describe["eval_window"] = {"max_length": max_len, "stride": stride}
        nll = float(sum(x.nll_sum for x in pr.texts))
        n_tok = int(sum(x.n_predicted for x in pr.texts))
        n_bytes = scored_bytes(model, corpora.eval.texts)
        res.perplexity = float(pr.corpus_perplexity)
        res.bits_per_byte = nll / math.log(2) / n_bytes if n_bytes > 0 else math.nan
        res.n_eval_tokens, res.n_eval_bytes = n_tok, n_bytes
        timings["perplexity_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    return res


@dataclass
class SelectRun:
    """All candidates of one run, their rankings and the agreements."""

    config: SelectConfig
    results: list[CandidateResult]
    agreement: dict[str, Agreement]
    corpora_info: dict[str, Any]
    by_group: dict[str, dict[str, Agreement]] = field(default_factory=dict)
    """``variant -> group -> Agreement`` within each suite width (when there are several)."""

    def gaps(self, variant: str) -> np.ndarray:
        g = [r.gap_wu if variant == "W_U" else r.gap_states for r in self.results]
        return np.array([x.gap if x is not None else math.nan for x in g], dtype=np.float64)

    @property
    def bits_per_byte(self) -> np.ndarray:
        return np.array([r.bits_per_byte for r in self.results], dtype=np.float64)

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(v for v in VARIANTS if np.isfinite(self.gaps(v)).any())

    def summary(self) -> list[dict[str, Any]]:
        rank = {v: ranks_desc(self.gaps(v)) for v in self.variants}
        bpb = self.bits_per_byte
        rank_ppl = ranks_desc(-bpb)
        out = []
        for i, r in enumerate(self.results):
            row: dict[str, Any] = {"candidate": r.candidate.name,
                                   "G (W_U)": r.gap_wu.gap, "D(T)": r.gap_wu.within,
                                   "D(T,T̄)": r.gap_wu.between, "|T|": r.gap_wu.n_domain,
                                   "rank W_U": _rank_str(rank["W_U"][i])}
            if "states" in rank:
                row["G (states)"] = r.gap_states.gap if r.gap_states else math.nan
                row["rank states"] = _rank_str(rank["states"][i])
            if np.isfinite(bpb).any():
                row["ppl"] = r.perplexity
                row["bits/byte"] = r.bits_per_byte
                row["rank measured"] = _rank_str(rank_ppl[i])
            out.append(row)
        return out


def _rank_str(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def run_select(candidates: Sequence[Candidate], config: SelectConfig, *, loader=None,
               model_loader=None, cache: bool = True, progress: bool | None = None) -> SelectRun:
    """Measure every candidate (one model in memory at a time) and the agreements.

    ``model_loader(spec)`` → LanguageModel (default :func:`lmgeom.load_model`).
    """
    from ...models import load_model

    if not candidates:
        raise ConfigError("no candidates: give --model (repeat for several) or --suite DIR")
    if len(candidates) < 2:
        raise ConfigError(f"select ranks candidates against each other, and got one "
                          f"({candidates[0].spec}): give at least two (--model A --model B, "
                          "or a --suite with several checkpoints)")
    corpora = load_corpora(config, loader)
    load = model_loader or load_model
    results = []
    for c in candidates:
        t = time.perf_counter()
        model = load(c.spec)
        load_s = time.perf_counter() - t
        r = measure_candidate(model, c, config, corpora, cache=cache, progress=progress)
        r.timings["load_s"] = load_s
        results.append(r)
        log.info("%s: G(W_U) = %.4f", c.name, r.gap_wu.gap)
        del model
    run = SelectRun(config=config, results=results, agreement={}, corpora_info=corpora.info)
    quality = -run.bits_per_byte
    for v in run.variants if np.isfinite(quality).any() else ():
        run.agreement[v] = rank_agreement(run.gaps(v), quality, n_boot=config.n_boot,
                                          seed=config.seed)
        groups = [r.candidate.group for r in results]
        if len(set(groups)) > 1:
            g = run.gaps(v)
            for grp in dict.fromkeys(groups):
                ix = np.array([x == grp for x in groups])
                run.by_group.setdefault(v, {})[grp] = rank_agreement(
                    g[ix], quality[ix], n_boot=config.n_boot, seed=config.seed)
    return run


def _settings(config: SelectConfig, variant: str) -> str:
    if variant == "W_U":
        return f"variant=W_U;domain={config.domain_name};forms={config.forms}"
    return (f"variant=states;domain={config.domain_name};layer={config.state_layer};"
            f"domain_texts={config.domain_texts};general_texts={config.general_texts}")


def select_rows(run: SelectRun) -> list[dict[str, Any]]:
    """Tidy model-level rows: per candidate ``dispersion_gap``, ``gap_within``,
    ``gap_between``, ``gap_rank`` (per variant, ``variant=`` in ``setting``),
    ``domain_perplexity``, ``domain_bits_per_byte``, ``domain_rank``; and per variant one
    ``gap_rank_agreement`` row (model ``(candidates)``), plus one per suite width (model
    ``(group w64)``) when the candidates come from several widths."""
    c = run.config
    rows: list[dict[str, Any]] = []
    ranks = {v: ranks_desc(run.gaps(v)) for v in run.variants}
    bpb = run.bits_per_byte
    rank_m = ranks_desc(-bpb)
    eval_s = f"texts={c.eval_spec}"
    for i, r in enumerate(run.results):
        base = {"model": r.candidate.label, "revision": r.candidate.revision}
        for v in run.variants:
            g = r.gap_wu if v == "W_U" else r.gap_states
            if g is None:
                continue
            s = _settings(c, v)
            n = g.n_domain + g.n_general
            seed = c.seed
            rows += [
                table.row(**base, metric="dispersion_gap", setting=s, value=g.gap, n=n, seed=seed),
                table.row(**base, metric="gap_within", setting=s, value=g.within, n=g.n_domain,
                          seed=seed),
                table.row(**base, metric="gap_between", setting=s, value=g.between, n=n,
                          seed=seed),
                table.row(**base, metric="gap_rank", setting=s, value=ranks[v][i],
                          n=len(run.results)),
            ]
        if math.isfinite(r.bits_per_byte):
            rows += [
                table.row(**base, metric="domain_perplexity", setting=eval_s, value=r.perplexity,
                          n=r.n_eval_tokens),
                table.row(**base, metric="domain_bits_per_byte", setting=eval_s,
                          value=r.bits_per_byte, n=r.n_eval_bytes),
                table.row(**base, metric="domain_rank", setting=eval_s + ";by=bits_per_byte",
                          value=rank_m[i], n=len(run.results)),
            ]
    for v, a in run.agreement.items():
        rows.append(table.row(model="(candidates)", metric="gap_rank_agreement",
                              setting=f"{_settings(c, v)};vs=-bits_per_byte;method={a.method}",
                              value=a.value, ci_low=a.low, ci_high=a.high, n=a.n,
                              seed=c.seed if a.n >= MIN_N_CI else math.nan,
                              flag=corr_flag(a.n)))
        for grp, ag in run.by_group.get(v, {}).items():
            rows.append(table.row(model=f"(group {grp})", metric="gap_rank_agreement",
                                  setting=f"{_settings(c, v)};vs=-bits_per_byte;group={grp};"
                                          f"method={ag.method}",
                                  value=ag.value, ci_low=ag.low, ci_high=ag.high, n=ag.n,
                                  seed=c.seed if ag.n >= MIN_N_CI else math.nan,
                                  flag=corr_flag(ag.n)))
    return rows


def config_dict(config: SelectConfig) -> dict[str, Any]:
    return asdict(config)


# ---------------------------------------------------------------------- the experiment
_VARIANTS = {
    "W_U": "rows of the output projection W_U, no forward pass",
    "states": "sampled token states at {layer} of {domain} vs {general} (forward pass)",
}


def _fmt_agreement(a: Agreement) -> str:
    if not math.isfinite(a.value):
        return f"undefined (n={a.n})"
    mark = f"{FLAG_MARK} " if corr_flag(a.n) else ""
    if math.isfinite(a.low):
        return f"{mark}{a.value:+.3f} [{a.low:+.3f}, {a.high:+.3f}] (n={a.n}, {a.method})"
    return f"{mark}{a.value:+.3f} (n={a.n}, {a.method})"


def _agreement_dict(a: Agreement) -> dict[str, Any]:
    return {"spearman": a.value, "ci_low": a.low, "ci_high": a.high, "n": a.n,
            "method": a.method}


@register
@dataclass(frozen=True)
class SelectExperiment:
    """``lmgeom select``: rank candidates by their dispersion gap, check against bits/byte.

    Attributes:
        candidates: the models / checkpoints (:func:`model_candidates`, :func:`suite_candidates`).
        select: the selection settings.
        suite: the suite folder the candidates come from, if any.
        revision, dtype, device: how hub candidates load (``revision`` not for suites).
        cache: use the forward cache.
    """

    command: ClassVar[str] = "select"
    table: ClassVar[str] = "select"

    candidates: tuple[Candidate, ...]
    select: SelectConfig = field(default_factory=SelectConfig)
    suite: str | None = None
    revision: str | None = None
    dtype: str = "float32"
    device: str | None = None
    cache: bool = True

    def __post_init__(self) -> None:
        if len(self.candidates) == 1:  # refused before any model loads
            raise ConfigError(f"select ranks candidates against each other, and got one "
                              f"({self.candidates[0].spec}): give at least two (--model A "
                              "--model B, or a --suite with several checkpoints)")

    def settings(self) -> dict[str, Any]:
        return {"candidates": [c.spec for c in self.candidates], "suite": self.suite,
                "revision": self.revision, "dtype": self.dtype,
                "select": config_dict(self.select)}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> SelectResult:
        from ...models import load_model

        def loader(spec):
            return load_model(spec, dtype=self.dtype, device=self.device,
                              revision=self.revision if not self.suite else None)

        t0 = time.perf_counter()
        run = run_select(list(self.candidates), self.select, model_loader=loader,
                         cache=self.cache, progress=progress)
        return SelectResult(self, run, table.frame(select_rows(run)),
                            time.perf_counter() - t0)


@dataclass
class SelectResult:
    """The select table, the measured run, and the text the CLI prints."""

    config: SelectExperiment
    run: SelectRun
    frame: Any
    seconds: float

    def rows(self):
        return self.frame

    def manifest(self) -> dict[str, Any]:
        c, run = self.config.select, self.run
        variants = {v: _VARIANTS[v].format(layer=c.state_layer, domain=c.domain_texts,
                                           general=c.general_texts) for v in run.variants}
        return {
            "models": [x.name for x in self.config.candidates],
            "texts": [t for t in (c.general_texts, c.domain_texts, c.eval_spec) if t],
            "domain": c.domain_name, "domain_words": list(domain_words(c.domain)[1]),
            "variants": variants,
            "ranking_quality": "bits per byte of held-out domain text (lower = better); within "
                               "one tokenizer identical in order to perplexity",
            "corpora": run.corpora_info,
            "candidates": [{
                "name": r.candidate.name, "spec": r.candidate.spec, "label": r.candidate.label,
                "revision": r.candidate.revision, "model_info": r.describe,
                "domain_tokens": r.tokens.describe(), "general_tokens": r.general_info,
                "gap_W_U": {"G": r.gap_wu.gap, "within": r.gap_wu.within,
                            "between": r.gap_wu.between},
                "gap_states": ({"G": r.gap_states.gap, "within": r.gap_states.within,
                                "between": r.gap_states.between} if r.gap_states else None),
                "perplexity": r.perplexity, "bits_per_byte": r.bits_per_byte,
                "n_eval_tokens": r.n_eval_tokens, "n_eval_bytes": r.n_eval_bytes,
                "timings": r.timings} for r in run.results],
            "agreement": {v: _agreement_dict(a) for v, a in run.agreement.items()},
            "agreement_by_group": {v: {g: _agreement_dict(a) for g, a in d.items()}
                                   for v, d in run.by_group.items()},
            "seeds": {"general_sample": c.seed, "texts": c.seed, "states": c.seed,
                      "bootstrap": c.seed},
            "timings": {"select_s": self.seconds},
        }

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        from ...report.figures_select import plot_select
        from ...report.html import write_report

        figs = plot_select(self.run, folder.plots)
        caption = ("Each point is one candidate: its dispersion gap G (x; higher is read as "
                   "better) against the bits per byte it needs on held-out domain text (y; "
                   "lower is better). A perfect label-free ranking makes the points fall from "
                   "left to right (Spearman rho of G with -bits/byte = +1).")
        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom select — domain {self.config.select.domain_name}",
                            extra_figures=[("Dispersion gap vs measured quality", figs, caption)])

    def summary(self) -> str:
        c, run = self.config.select, self.run
        lines = [f"domain {c.domain_name}: {len(self.config.candidates)} candidates; "
                 "variant=W_U uses rows of W_U (no forward pass)"
                 + ("; variant=states uses hidden states of "
                    f"{c.domain_texts} vs {c.general_texts} at {c.state_layer}"
                    if "states" in run.variants else "")]
        for r in run.results:
            dropped = f", dropped {', '.join(r.tokens.dropped)}" if r.tokens.dropped else ""
            lines.append(f"  {r.candidate.name}: |T|={len(r.tokens.ids)} single-token "
                         f"forms{dropped}; |T̄|={r.general_info['n']}")
        lines += ["", format_table(run.summary(), floatfmt="{:.4g}")]
        if run.agreement:
            lines.append(f"\nagreement with the measured ranking (Spearman of G with "
                         f"-bits/byte on {c.eval_spec}):")
            for v, a in run.agreement.items():
                lines.append(f"  variant={v}: {_fmt_agreement(a)}")
                for grp, ag in run.by_group.get(v, {}).items():
                    lines.append(f"    within {grp}: {_fmt_agreement(ag)}")
            footer = flag_footer([corr_flag(a.n) for a in run.agreement.values()]
                                 + [corr_flag(ag.n) for v in run.agreement
                                    for ag in run.by_group.get(v, {}).values()],
                                 describe_flag, "in the agreements marked")
            if footer:
                lines.append(footer)
        elif c.eval_spec is None:
            lines.append("\n(no held-out domain text: ranking only; give --eval-texts to "
                         "check it)")
        order = sorted(range(len(run.results)), key=lambda i: -run.results[i].gap_wu.gap)
        shown = [run.results[i].candidate.name for i in order[:8]]
        more = f" > ... ({len(order) - 8} more)" if len(order) > 8 else ""
        lines.append("\nlabel-free ranking (variant=W_U, best first): " + " > ".join(shown)
                     + more)
        return "\n".join(lines)
