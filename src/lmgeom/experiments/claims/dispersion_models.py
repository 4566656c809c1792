"""Claims D4, D6 and D7 for ``lmgeom claims`` (see :mod:`lmgeom.experiments.claims.dispersion`).

* **D6** (:class:`GapCollector`): per model and domain (code, math),
  :func:`lmgeom.experiments.select.measure_candidate` — the dispersion gap of ``W_U``
  (no forward pass) and the held-out bits per byte of the domain's texts (the first
  ``select_eval_chars`` characters of ``select_eval`` texts, so long source files do not
  dominate the cost). The rule: the two rankings agree (Spearman, Kendall, exact permutation p).
* **D7** (:func:`knn_parts`): :func:`lmgeom.experiments.knnlm.run_knnlm` with the last block's
  ``attn_out`` and ``ffn_out`` as candidate keys. Dispersion: the token-level dispersion of
  each sampled training chunk at both points (the chunks ``run_knnlm`` measures), paired over
  chunks. Keys: ``log ppl`` of the kNN-LM at λ with attention keys minus with FFN keys, paired
  over the held-out chunks; the per-query ``log p_LM`` it needs comes from one more forward pass
  over the same held-out chunks (:func:`lmgeom.lm.knn_states.position_states`) and is checked
  against ``run_knnlm``'s own perplexity at λ.
* **D4** (:func:`cluster_verdict`): :mod:`lmgeom.experiments.clusters` on the earliest and the
  latest checkpoint of each width of a trained suite (the earliest after step 0 when there are
  two such: random initialisation is not a stage of training): the size-weighted within-cluster
  dispersion at ``final``, latest minus earliest, paired bootstrap over clusters.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataError
from ...lm.knn_states import position_states
from ...lm.knnlm import interpolate, perplexity_of
from ...lm.scoring import forward_chunks
from ...metrics import claims_dispersion as rules
from ...metrics.claims import ClaimVerdict, ModelInfo, not_testable
from ...metrics.dispersion import token_dispersion
from ...models import load_model
from ...texts import TextSet, load_texts
from ...texts.chunks import make_chunks
from ..clusters import ClusterConfig, cluster_states, find_clusters
from ..clusters import config_dict as cluster_config_dict
from ..knnlm import KnnConfig, run_knnlm, split_corpus
from ..knnlm import config_dict as knn_config_dict
from ..select import (
    Candidate,
    Corpora,
    SelectConfig,
    load_corpora,
    measure_candidate,
    suite_candidates,
)
from ..select import (
    config_dict as select_config_dict,
)
from .dispersion_base import DispersionClaimsSettings, cached_arrays, content_key

log = logging.getLogger(__name__)

DOMAINS = ("code", "math")


# ---------------------------------------------------------------------- D6
class GapCollector:
    """Collects each model's dispersion gap and held-out bits per byte per domain (D6)."""

    def __init__(self, s: DispersionClaimsSettings) -> None:
        self.s = s
        self.rows: dict[str, list[tuple[ModelInfo, float, float, float]]] = {d: [] for d in DOMAINS}
        self._corpora: dict[str, Any] = {}

    def config(self, domain: str):
        s = self.s
        return SelectConfig(domain=domain, n_eval=s.select_eval, max_length=256, stride=128,
                            batch_size=s.batch_size, n_boot=s.n_boot, seed=s.seed)

    def corpora(self, domain: str):
        """The selection corpora of ``domain`` with each evaluation text cut to its first
        ``select_eval_chars`` characters (at a line end where there is one)."""

        if domain not in self._corpora:
            c = load_corpora(self.config(domain))
            k = self.s.select_eval_chars
            cut = []
            for t in c.eval.texts:
                head = t[:k]
                nl = head.rfind("\n")
                cut.append(head[:nl] if len(t) > k and nl > k // 2 else head)
            ev = TextSet(ids=c.eval.ids, texts=tuple(cut), labels=c.eval.labels,
                         source=f"{c.eval.source} (first {k} characters of each text)")
            self._corpora[domain] = Corpora(general=c.general, domain_states=None,
                                            general_states=None, eval=ev,
                                            info={**c.info, "eval_chars": k})
        return self._corpora[domain]

    def add(self, model, spec: str, info: ModelInfo, work: Path, progress: bool | None) -> None:
        for domain in DOMAINS:
            cfg = self.config(domain)
            corp = self.corpora(domain)
            key = content_key(model, corp.eval.hash, corp.general.hash, select_config_dict(cfg))

            def compute(cfg=cfg, corp=corp) -> dict[str, np.ndarray]:
                r = measure_candidate(model, Candidate(spec=spec, label=spec), cfg, corp,
                                      cache=True, progress=progress)
                return {"gap": np.array(r.gap_wu.gap), "bpb": np.array(r.bits_per_byte),
                        "ppl": np.array(r.perplexity)}

            a = cached_arrays(work, f"gap-{domain}-{spec}", key, compute)
            self.rows[domain].append((info, float(a["gap"]), float(a["bpb"]), float(a["ppl"])))

    def verdicts(self) -> list[ClaimVerdict]:
        """``D6`` (both domains must agree) and ``D6.code`` / ``D6.math``."""
        parts = []
        for domain in DOMAINS:
            rows = self.rows[domain]
            infos = tuple(r[0] for r in rows)
            gap = np.array([r[1] for r in rows])
            bpb = np.array([r[2] for r in rows])
            v = rules.ranking_verdict(f"D6.{domain}", gap, -bpb, models=infos,
                                      what=f" on {domain}")
            v.details["per_model"] = {r[0].name: {"gap_W_U": r[1], "bits_per_byte": r[2],
                                                  "perplexity": r[3]} for r in rows}
            v.details["seed"] = self.s.seed
            parts.append(v)
        return [rules.combine("D6", parts, over="domains"), *parts]


# ---------------------------------------------------------------------- D7
def knn_config(s: DispersionClaimsSettings):
    return KnnConfig(select=True, candidates="last.attn_out,last.ffn_out",
                     chunk_len=s.knn_chunk_len, max_train_tokens=s.knn_train_tokens,
                     max_eval_tokens=s.knn_eval_tokens, select_tokens=s.knn_select_tokens,
                     k=s.knn_k, batch_size=s.batch_size, seed=s.seed)


def _measure_knn(model, ts, cfg, progress: bool | None) -> dict[str, np.ndarray]:
    attn, ffn = model.resolve_points("last.attn_out")[0], model.resolve_points("last.ffn_out")[0]
    run = run_knnlm(model, ts, None, cfg, cache=True, progress=progress)
    lam, cl = float(cfg.lam), cfg.chunk_len
    tr, ev, _ = split_corpus(ts, None, fraction=cfg.eval_fraction, seed=cfg.seed)
    # the held-out queries again, for per-query log p_LM (run_knnlm keeps only the total)
    ev_ch = make_chunks(model, ev, cl, max_chunks=max(1, cfg.max_eval_tokens // cl),
                        seed=cfg.seed, bos=cfg.bos)
    q = position_states(model, ev_ch.tokens, (attn,), lm_log_prob=True,
                        batch_size=cfg.batch_size, progress=progress, desc=f"D7 {model.name}")
    out: dict[str, np.ndarray] = {"n_tokens": np.bincount(q.row, minlength=len(ev_ch))}
    for name, p in (("attn", attn), ("ffn", ffn)):
        ev_p = run.evals[p]
        if len(ev_p.knn_log_prob) != len(q.lm_log_prob):
            raise DataError(f"D7: {len(q.lm_log_prob)} queries here, {len(ev_p.knn_log_prob)} "
                            "in the kNN-LM run: not the same held-out positions")
        mix = interpolate(q.lm_log_prob, ev_p.knn_log_prob, lam)
        ppl = perplexity_of(mix)
        if not math.isclose(ppl, ev_p.perplexity[lam], rel_tol=1e-5):
            raise DataError(f"D7: kNN-LM perplexity at {p} recomputed {ppl:.6g} but the run "
                            f"reports {ev_p.perplexity[lam]:.6g}")
        out[f"nll_{name}"] = np.bincount(q.row, weights=-mix, minlength=len(ev_ch))
        out[f"ppl_{name}"] = np.array(ppl)
        out[f"pooled_{name}"] = np.array(run.dispersion[p].pooled)
    out["ppl_base"] = np.array(run.base_perplexity)
    # per-chunk token dispersion on the training chunks run_knnlm measured dispersion on
    tr_ch = make_chunks(model, tr, cl, max_chunks=max(1, cfg.max_train_tokens // cl),
                        seed=cfg.seed, bos=cfg.bos)
    red_from = 1 if tr_ch.bos else 0
    per_chunk = tr_ch.tokens.shape[1] - red_from
    want = min(len(tr_ch), max(1, math.ceil(cfg.select_tokens / per_chunk)))
    pick = np.sort(np.random.default_rng(cfg.seed).choice(len(tr_ch), size=want, replace=False))
    res = forward_chunks(model, tr_ch.tokens[pick], (attn, ffn),
                         {"token_dispersion": token_dispersion}, nll=False, reduce_from=red_from,
                         batch_size=cfg.batch_size, progress=progress, cache=True,
                         desc=f"D7 dispersion {model.name}")
    out["disp_attn"] = res.reduced["token_dispersion"][attn].astype(np.float64)
    out["disp_ffn"] = res.reduced["token_dispersion"][ffn].astype(np.float64)
    return out


def knn_parts(model, info: ModelInfo, s: DispersionClaimsSettings, work: Path,
              progress: bool | None) -> tuple[ClaimVerdict, ClaimVerdict]:
    """One model's ``D7.dispersion`` and ``D7.knn`` parts."""

    ts = load_texts(s.knn_texts, limit=s.corpus_limit, seed=s.seed)
    cfg = knn_config(s)
    key = content_key(model, ts.hash, knn_config_dict(cfg))
    a = cached_arrays(work, f"knn-{model.name}", key, lambda: _measure_knn(model, ts, cfg,
                                                                            progress))
    est, lo, hi = rules.paired_difference(a["disp_attn"], a["disp_ffn"], n_boot=s.n_boot,
                                          seed=s.seed)
    disp = rules.interval_verdict(
        "D7.dispersion", f"token dispersion of last-block attn_out minus ffn_out, mean over "
        f"{len(a['disp_attn'])} chunks", est, lo, hi, threshold=0.0, direction=">",
        models=(info,), seed=s.seed,
        details={"pooled_attn": float(a["pooled_attn"]), "pooled_ffn": float(a["pooled_ffn"]),
                 "chunk_mean_attn": float(np.nanmean(a["disp_attn"])),
                 "chunk_mean_ffn": float(np.nanmean(a["disp_ffn"]))},
        note=f"pooled over tokens: attn {float(a['pooled_attn']):.3f} vs ffn "
             f"{float(a['pooled_ffn']):.3f}")
    est, lo, hi = rules.ratio_difference(a["nll_attn"], a["nll_ffn"], a["n_tokens"],
                                         n_boot=s.n_boot, seed=s.seed)
    knn = rules.interval_verdict(
        "D7.knn", f"log ppl of the kNN-LM (lambda={float(knn_config(s).lam):g}, k={s.knn_k}) with "
        f"attn_out keys minus with ffn_out keys, {int(a['n_tokens'].sum())} held-out tokens",
        est, lo, hi, threshold=0.0, direction="<", models=(info,), seed=s.seed,
        details={"ppl_attn": float(a["ppl_attn"]), "ppl_ffn": float(a["ppl_ffn"]),
                 "ppl_base": float(a["ppl_base"])},
        note=f"perplexity attn keys {float(a['ppl_attn']):.4g}, ffn keys "
             f"{float(a['ppl_ffn']):.4g}, base LM {float(a['ppl_base']):.4g}")
    return disp, knn


def knn_verdicts(parts: list[tuple[ClaimVerdict, ClaimVerdict]]) -> list[ClaimVerdict]:
    """``D7`` (both parts), ``D7.dispersion`` and ``D7.knn`` (every model)."""
    disp = rules.combine("D7.dispersion", [p[0] for p in parts])
    knn = rules.combine("D7.knn", [p[1] for p in parts])
    return [rules.conjunction("D7", [disp, knn]), disp, knn]


# ---------------------------------------------------------------------- D4
NO_CHECKPOINTS = ("needs training checkpoints of one model: give --suite DIR (a width suite "
                  "from `lmgeom suite train`); the bundled models have no checkpoints and no "
                  "model hub is reachable here")


def cluster_verdict(suite: str | None, s: DispersionClaimsSettings, work: Path,
                    progress: bool | None, *, dtype: str | None = None,
                    device: str | None = None) -> list[ClaimVerdict]:
    """``D4`` and one ``D4.<width>`` per suite width (earliest vs latest checkpoint)."""
    if not suite:
        return [not_testable("D4", rules.statement("D4"), NO_CHECKPOINTS,
                             quantity="within-cluster dispersion, latest - earliest checkpoint")]

    by_width: dict[str, list[Any]] = {}
    for c in suite_candidates(suite):
        by_width.setdefault(c.group, []).append(c)
    parts = []
    for width, cands in by_width.items():
        cands = sorted(cands, key=lambda c: c.step or 0)
        trained = [c for c in cands if (c.step or 0) > 0]
        if len(trained) >= 2:  # random init (step 0) is not a stage of training
            cands = trained
        d = int("".join(ch for ch in width if ch.isdigit()) or 0)
        info = ModelInfo(name=f"{Path(suite).name}/{width}", d=d, family="gpt_neox",
                         tuned="base")
        if len(cands) < 2:
            parts.append(not_testable(f"D4.{width}", rules.statement("D4"),
                                      f"width {width} has one checkpoint; needs two",
                                      models=(info,)))
            continue
        parts.append(_cluster_part(cands[0], cands[-1], info, width, s, work, progress,
                                   dtype=dtype, device=device))
    return [rules.combine("D4", parts, over="widths"), *parts]


def _cluster_part(first, last, info: ModelInfo, width: str, s: DispersionClaimsSettings,
                  work: Path, progress: bool | None, *, dtype: str | None,
                  device: str | None) -> ClaimVerdict:

    ts = load_texts(s.cluster_texts, limit=s.n, seed=s.seed)
    cfg = ClusterConfig(max_clusters=s.cluster_max, layers="final", n_boot=s.n_boot,
                        seed=s.seed, batch_size=s.batch_size)
    m0 = load_model(first.spec, dtype=dtype or "float32", device=device)
    m1 = load_model(last.spec, dtype=dtype or "float32", device=device)
    key = content_key(m0, content_key(m1), ts.hash, cluster_config_dict(cfg))

    def compute() -> dict[str, np.ndarray]:
        cset = find_clusters(m0.tokenizer, ts, cfg, reference=first.spec)
        a = cluster_states(m0, cset, layers="final", batch_size=cfg.batch_size,
                           progress=progress)
        b = cluster_states(m1, cset, layers="final", batch_size=cfg.batch_size,
                           progress=progress)
        return {"first": a.cluster_dispersion[0], "last": b.cluster_dispersion[0],
                "sizes": np.asarray(cset.sizes, dtype=np.float64)}

    a = cached_arrays(work, f"clusters-{width}", key, compute)
    est, lo, hi = rules.paired_difference(a["last"], a["first"], weights=a["sizes"],
                                          n_boot=s.n_boot, seed=s.seed)
    return rules.interval_verdict(
        f"D4.{width}", f"within-cluster dispersion at final, step {last.step} minus step "
        f"{first.step} (size-weighted mean over {len(a['sizes'])} clusters)", est, lo, hi,
        threshold=0.0, direction=">", models=(info,), seed=s.seed,
        details={"first_step": first.step, "last_step": last.step})


__all__ = ["DOMAINS", "GapCollector", "cluster_verdict", "knn_parts", "knn_verdicts"]
