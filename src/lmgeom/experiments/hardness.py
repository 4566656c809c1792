"""Hardness ranking without labels (METHODS.md, "Applications": hardness ranking).

Per text, one forward pass gives (a) the token-level dispersion of its token states at one
layer (default ``final``, the post-norm states the readout reads; the BOS position is left
out when the tokenizer prepends one) and (b) its perplexity ``exp(mean NLL of tokens 2..T)``.
Texts are ranked by dispersion, lowest first (rank 1 = least dispersed = predicted hardest).

Evaluation against perplexity (the label-free stand-in for task errors):

* ``hardness_spearman``: Spearman between dispersion and perplexity (equal to Spearman between
  the dispersion rank and perplexity) with a seeded bootstrap 95 % interval; the papers'
  expectation is negative.
* ``hardness_decile_overlap``: the share of the top-perplexity decile (the ``k = round(n·q)``
  texts with the highest perplexity, q = 0.1) that is found among the ``k`` lowest-dispersion
  texts. A random ranking finds ``k/n`` (≈ 10 %) on average: ``hardness_overlap_null`` gives
  the mean share over ``n_perm`` seeded random rankings with the central 95 % of that null as
  its interval, and ``hardness_overlap_p`` the permutation p-value
  ``(1 + #{null ≥ observed}) / (1 + n_perm)``.

Texts with fewer than two counted positions have no dispersion and are left out (counted).
All rows are model-level (``layer = ""``); the layer and corpus are in ``setting``, e.g.
``texts=builtin:domains;layer=final``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from .._io import atomic_path
from ..activations.core import encode_texts
from ..errors import ConfigError, DataError
from ..lm.scoring import forward_chunks
from ..metrics.dispersion import token_dispersion
from ..metrics.sample_size import (
    MIN_CORR_POINTS,
    MIN_QUANTILE_TEXTS,
    corr_flag,
    describe_flag,
    warn_low_sample,
)
from ..metrics.uncertainty import correlation_interval, quantile_overlap
from ..models.bundled import DEFAULT_MODEL
from ..results import table
from ..results.console import FLAG_MARK, flag_footer, format_table
from ..texts import as_textset
from .base import register
from .options import ModelOptions, TextOptions

log = logging.getLogger(__name__)

SNIPPET_CHARS = 80


@dataclass(frozen=True)
class HardnessConfig:
    layer: str = "final"
    max_length: int = 256
    batch_size: int = 8
    n_boot: int = 1000
    n_perm: int = 1000
    quantile: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.quantile <= 0.5:
            raise ConfigError(f"quantile must be in (0, 0.5], got {self.quantile}")
        if self.n_perm < 10:
            raise ConfigError(f"n_perm must be >= 10, got {self.n_perm}")


@dataclass
class HardnessResult:
    """Ranking and its evaluation.

    Attributes:
        ranking: DataFrame (id, label, rank, dispersion, perplexity, n_tokens, snippet), sorted
            by rank (texts without a dispersion last, rank NaN).
        spearman: (value, ci_low, ci_high).
        overlap: observed share of the top-perplexity quantile among the lowest-dispersion one.
        null: ``(n_perm,)`` shares under random rankings.
        k: texts per quantile; n: texts ranked; n_skipped: texts without a dispersion.
        layer: the point used.
        corpus_perplexity: ``exp(Σ NLL / Σ scored tokens)`` over the ranked texts.
    """

    ranking: Any
    spearman: tuple[float, float, float]
    overlap: float
    null: np.ndarray
    k: int
    n: int
    n_skipped: int
    layer: str
    corpus_perplexity: float = math.nan
    settings: dict[str, Any] = field(default_factory=dict)
    per_text: Any = None

    @property
    def null_mean(self) -> float:
        return float(self.null.mean())

    @property
    def null_interval(self) -> tuple[float, float]:
        lo, hi = np.percentile(self.null, [2.5, 97.5])
        return float(lo), float(hi)

    @property
    def p_value(self) -> float:
        return float((1 + np.sum(self.null >= self.overlap - 1e-12)) / (1 + len(self.null)))


def _snippet(text: str, n: int = SNIPPET_CHARS) -> str:
    s = " ".join(text.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def rank_hardness(model, texts, config: HardnessConfig | None = None, *,
                  progress: bool | None = None, cache: bool = True) -> HardnessResult:
    """Rank ``texts`` by dispersion (low first) and evaluate the ranking against perplexity."""
    from ..models import load_model

    config = config or HardnessConfig()
    model = load_model(model)
    ts = as_textset(texts)
    pts = model.resolve_points(config.layer)
    if len(pts) != 1:
        raise ConfigError(f"hardness ranks by one layer; got {config.layer!r} ({len(pts)} points)")
    layer = pts[0]
    t0 = time.perf_counter()
    enc = encode_texts(model, ts.texts, config.max_length)
    res = forward_chunks(model, list(enc.ids), (layer,), {"token_dispersion": token_dispersion},
                         nll=True, reduce_from=1 if model.bos_prepended else 0,
                         batch_size=config.batch_size, progress=progress, cache=cache,
                         desc=f"hardness {model.name}")
    disp = res.reduced["token_dispersion"][layer].astype(np.float64)
    ppl = res.perplexity
    ok = np.isfinite(disp) & np.isfinite(ppl)
    n_skip = int((~ok).sum())
    if n_skip:
        log.warning("%d text(s) too short for a dispersion (< 2 counted tokens): left out", n_skip)
    if ok.sum() < 3:
        raise DataError(f"only {int(ok.sum())} texts have a dispersion; need at least 3")
    if ok.sum() < MIN_CORR_POINTS:
        warn_low_sample(f"{model.name}: the hardness Spearman is over {int(ok.sum())} texts "
                        f"(fewer than {MIN_CORR_POINTS}): its interval is too wide to read; "
                        "rank more texts (marked in the 'flag' column)")
    rank = np.full(len(ts), np.nan)
    order = np.flatnonzero(ok)[np.argsort(disp[ok], kind="stable")]
    rank[order] = np.arange(1, len(order) + 1)
    frame = pd.DataFrame({
        "id": list(ts.ids),
        "label": list(ts.labels) if ts.labels is not None else [""] * len(ts),
        "rank": rank,
        "dispersion": disp,
        "perplexity": ppl,
        "n_tokens": enc.lengths,
        "snippet": [_snippet(t) for t in ts.texts],
    }).sort_values(["rank"], na_position="last", kind="stable").reset_index(drop=True)
    full = np.array([len(x) for x in model.tokenizer(list(ts.texts), add_special_tokens=True,
                                                     truncation=False, verbose=False)
                     ["input_ids"]], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        nll = np.where(res.n_predicted > 0, res.nll_sum / np.maximum(res.n_predicted, 1), np.nan)
    per_text = pd.DataFrame({
        "id": list(ts.ids),
        "label": list(ts.labels) if ts.labels is not None else [""] * len(ts),
        "n_tokens": enc.lengths, "n_tokens_full": full, "truncated": full > config.max_length,
        "nll": nll, "perplexity": ppl, f"dispersion@{layer}": disp, "rank": rank,
    })
    rho = correlation_interval(disp[ok], ppl[ok], "spearman", config.n_boot, config.seed)
    obs, null, k = quantile_overlap(disp[ok], ppl[ok], config.quantile, n_perm=config.n_perm,
                                    seed=config.seed)
    return HardnessResult(
        ranking=frame, spearman=rho, overlap=obs, null=null, k=k, n=int(ok.sum()),
        n_skipped=n_skip, layer=layer,
        corpus_perplexity=float(math.exp(res.nll_sum[ok].sum() / res.n_predicted[ok].sum())),
        settings={**asdict(config), "n_truncated": enc.n_truncated,
                  "forward_s": time.perf_counter() - t0, "batches_cached": res.batches_cached},
        per_text=per_text,
    )


def hardness_rows(res: HardnessResult, *, model: str, texts_label: str, config: HardnessConfig,
                  revision: str = "") -> list[dict[str, Any]]:
    """Model-level tidy rows of one :class:`HardnessResult`."""
    s = f"texts={texts_label};layer={res.layer}"
    q = f"{s};q={config.quantile:g}"
    base = {"model": model, "revision": revision}
    lo, hi = res.null_interval
    rk = res.ranking
    small_q = "small_quantile" if res.k < MIN_QUANTILE_TEXTS else ""
    return [
        table.row(**base, metric="hardness_spearman", setting=s, value=res.spearman[0],
                  ci_low=res.spearman[1], ci_high=res.spearman[2], seed=config.seed, n=res.n,
                  flag=corr_flag(res.n)),
        table.row(**base, metric="hardness_decile_overlap", setting=q, value=res.overlap,
                  seed=config.seed, n=res.k, flag=small_q),
        table.row(**base, metric="hardness_overlap_null", setting=q, value=res.null_mean,
                  ci_low=lo, ci_high=hi, seed=config.seed, n=len(res.null), flag=small_q),
        table.row(**base, metric="hardness_overlap_p", setting=q, value=res.p_value,
                  seed=config.seed, n=len(res.null), flag=small_q),
        table.row(**base, metric="dispersion", setting=s,
                  value=float(np.nanmean(rk["dispersion"].to_numpy(float))), n=res.n),
        table.row(**base, metric="perplexity", setting=s, value=res.corpus_perplexity, n=res.n),
    ]


# ---------------------------------------------------------------------- the experiment
@register
@dataclass(frozen=True)
class HardnessExperiment:
    """``lmgeom hardness``: one model, one text set, ranked by dispersion.

    Attributes:
        spec: the model spec.
        texts: which texts.
        model: how the model loads.
        hardness: the ranking and evaluation settings.
        cache: use the forward cache.
    """

    command: ClassVar[str] = "hardness"
    table: ClassVar[str] = "hardness"

    spec: str = DEFAULT_MODEL
    texts: TextOptions = field(default_factory=lambda: TextOptions(spec="builtin:domains",
                                                                   n=500))
    model: ModelOptions = field(default_factory=ModelOptions)
    hardness: HardnessConfig = field(default_factory=HardnessConfig)
    cache: bool = True
    log_samples: bool = False

    def settings(self) -> dict[str, Any]:
        return {"model": self.spec, "texts": self.texts.spec, "n": self.texts.n,
                "dtype": self.model.dtype, "revision": self.model.revision,
                "hardness": asdict(self.hardness), "text_column": self.texts.text_column,
                "label_column": self.texts.label_column, "split": self.texts.split}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> HardnessRun:
        t0 = time.perf_counter()
        texts = self.texts.load()
        model = self.model.load(self.spec)
        res = rank_hardness(model, texts, self.hardness, progress=progress, cache=self.cache)
        rows = hardness_rows(res, model=self.spec, texts_label=self.texts.spec,
                             config=self.hardness, revision=self.model.revision or "")
        info = {"source": texts.source, "n": len(texts), "hash": texts.hash,
                "model_info": model.describe(), "run_s": time.perf_counter() - t0}
        return HardnessRun(self, table.frame(rows), res, info)


@dataclass
class HardnessRun:
    """The model-level tidy rows, the ranking (``hardness.csv``) and its evaluation."""

    config: HardnessExperiment
    frame: Any
    result: HardnessResult
    info: dict[str, Any]

    def rows(self):
        return self.frame

    def extra_tables(self) -> dict[str, Any]:
        """With ``log_samples``: ``samples`` — one row per text in text order: id, label,
        n_tokens, n_tokens_full, truncated, nll, perplexity, ``dispersion@<layer>``, rank."""
        if not self.config.log_samples:
            return {}
        df = self.result.per_text.copy()
        df.insert(0, "model", self.config.spec)
        return {"samples": df}

    def manifest(self) -> dict[str, Any]:
        res, c = self.result, self.config
        return {"models": [c.spec], "texts": self.info["source"], "n_texts": self.info["n"],
                "texts_hash": self.info["hash"], "layer": res.layer, "n_ranked": res.n,
                "n_skipped": res.n_skipped, "k": res.k, "model_info": self.info["model_info"],
                "seeds": {"texts": c.texts.seed, "bootstrap": c.hardness.seed,
                          "permutation": c.hardness.seed},
                "timings": {"forward_s": res.settings["forward_s"]}}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        """``hardness.csv`` (the per-text ranking, replacing the tidy csv) and the report."""
        from ..report.figures_dispersion import plot_hardness
        from ..report.html import write_report

        with atomic_path(folder.path / "hardness.csv") as tmp:
            self.result.ranking.to_csv(tmp, index=False)
        paths = plot_hardness(self.result, folder.plots)
        figures = [("Dispersion vs perplexity per text", paths,
                    "Each point a text; red: the lowest-dispersion quantile, the texts the "
                    "ranking predicts hardest. A good ranking puts them at high perplexity.")
                   ] if paths else []
        return write_report(folder.path, self.frame, manifest,
                            title=f"lmgeom hardness — {self.config.spec}",
                            extra_figures=figures)

    def summary(self, show: int = 10) -> str:
        res, q = self.result, self.config.hardness.quantile
        r, (lo, hi) = res.spearman, res.null_interval
        short = f", {res.n_skipped} too short" if res.n_skipped else ""
        head = (f"{self.config.spec} on {self.info['source']}: {res.n} texts ranked by "
                f"dispersion at layer {res.layer} (low first){short}; corpus perplexity "
                f"{res.corpus_perplexity:.4g}")
        rho = (f"Spearman(dispersion, perplexity) = {r[0]:+.3f}  95 % CI [{r[1]:+.3f}, "
               f"{r[2]:+.3f}]")
        top = (f"top-perplexity {q:.0%} (k={res.k}) found in the lowest-dispersion {q:.0%}: "
               f"{res.overlap:.1%}  (random ranking {res.null_mean:.1%}, 95 % [{lo:.1%}, "
               f"{hi:.1%}], p = {res.p_value:.3g})")
        flags = [corr_flag(res.n), "small_quantile" if res.k < MIN_QUANTILE_TEXTS else ""]
        rho, top = (f"{FLAG_MARK} {line}  [{f}]" if f else line
                    for line, f in zip((rho, top), flags))
        lines = [head, rho, top]
        footer = flag_footer(flags, describe_flag, "in the lines marked")
        if footer:
            lines.append(footer)
        k = max(0, show)
        if k:
            rk = res.ranking
            cols = ["rank", "id", "dispersion", "perplexity", "snippet"]
            lines += [f"\nlowest dispersion (predicted hardest), {min(k, len(rk))}:",
                      format_table(rk.head(k)[cols].to_dict("records")),
                      "\nhighest dispersion:",
                      format_table(rk[rk["rank"].notna()].tail(k)[cols].iloc[::-1]
                                   .to_dict("records"))]
        return "\n".join(lines)
