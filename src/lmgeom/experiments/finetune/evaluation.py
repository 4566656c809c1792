"""Measurements of a fine-tuning run (:mod:`lmgeom.experiments.finetune`): held-out
perplexity, NLL and token-level dispersion per evaluation set (:func:`evaluate`), the
cross-domain distance, and the tidy result rows (evaluation, training and paired-delta rows)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ...lm.scoring import forward_chunks
from ...metrics.dispersion import token_dispersion
from ...metrics.regime import parse_setting
from ...metrics.uncertainty import chunk_ci, paired_chunk_delta
from ...results.console import format_table
from ...results.table import frame, row
from .config import ArmResult, FinetuneSettings
from .data import Domain

EVAL_METRICS = ("perplexity", "nll", "dispersion")
TRAIN_METRICS = ("train_lm_loss", "train_dispersion", "train_aux")


def _mean_unit(h, mask):
    """Reducer: ``(B, d)`` mean of the row's L2-normalised masked token states."""
    import torch

    u = h.float() / torch.linalg.vector_norm(h.float(), dim=-1, keepdim=True).clamp_min(1e-30)
    w = mask.float()[..., None]
    return (u * w).sum(1) / w.sum(1).clamp_min(1.0)


def evaluate(lm, eval_sets: dict[str, np.ndarray], label: str, *, batch_size: int = 8,
             skip_first: bool = False, dtype: str = "float32",
             seed: int = 0) -> dict[str, dict[str, float]]:
    """Perplexity, mean NLL and mean token-level dispersion (at ``label``) per evaluation set.

    Returns:
        ``{set name: {"perplexity", "nll", "dispersion", "n_chunks", "n_tokens", "ci"}}``
        (``ci``: :func:`chunk_ci` intervals over the set's chunks, seeded by ``seed``) plus, per
        set, ``"_mean_unit"`` / ``"_n_units"`` (pooled mean unit vector and token count, for
        :func:`cross_dispersion`).
    """
    import torch

    was_training = lm.hf_model.training
    lm.hf_model.eval()
    ac = (torch.autocast(lm.device.type, dtype=torch.bfloat16) if dtype == "bfloat16"
          else contextlib.nullcontext())
    out: dict[str, dict[str, Any]] = {}
    try:
        for name, toks in eval_sets.items():
            with ac:
                res = forward_chunks(lm, toks, points=(label,),
                                     reducers={"token_dispersion": token_dispersion,
                                               "mean_unit": _mean_unit},
                                     nll=True, reduce_from=1 if skip_first else 0,
                                     batch_size=batch_size, progress=False, desc=f"eval {name}")
            n_tok = int(res.n_predicted.sum())
            nll = float(res.nll_sum.sum() / n_tok)
            disp = res.reduced["token_dispersion"][label]
            n_units = (res.n_tokens - (1 if skip_first else 0)).astype(np.float64)
            mu = res.reduced["mean_unit"][label].astype(np.float64)
            out[name] = {"perplexity": math.exp(nll), "nll": nll,
                         "dispersion": float(np.nanmean(disp)), "n_chunks": len(toks),
                         "n_tokens": n_tok,
                         "ci": chunk_ci(res.nll_sum, res.n_predicted, disp, seed=seed),
                         "_chunk_nll": np.asarray(res.nll_sum, dtype=np.float64),
                         "_chunk_ntok": np.asarray(res.n_predicted, dtype=np.float64),
                         "_chunk_disp": np.asarray(disp, dtype=np.float64),
                         "_mean_unit": (mu * n_units[:, None]).sum(0) / n_units.sum(),
                         "_n_units": float(n_units.sum())}
    finally:
        lm.hf_model.train(was_training)
    return out


def cross_dispersion(ev: dict[str, dict[str, Any]], a: str, b: str) -> float:
    """Mean cosine distance between all token states of set ``a`` and of set ``b``
    (``1 − ū_a · ū_b``, the cross-domain term's quantity on held-out data)."""
    return float(1.0 - np.dot(ev[a]["_mean_unit"], ev[b]["_mean_unit"]))


def setting_of(cfg: FinetuneSettings, label: str, eval_name: str, step: int) -> str:
    """The ``setting`` of a result row: ``eval=…;step=…;method=…;lambda=…;mode=…;layer=…``."""
    return (f"eval={eval_name};step={step};method={cfg.method};lambda={cfg.lam:g};"
            f"mode={cfg.aux_mode};layer={label}")


def eval_rows(cfg: FinetuneSettings, arm: str, label: str, step: int,
              ev: dict[str, dict[str, Any]], domains: Sequence[Domain]) -> list[dict[str, Any]]:
    """Rows of one :func:`evaluate`: every :data:`EVAL_METRICS` per set, and the held-out
    ``cross_dispersion`` of every pair of training domains."""
    out = []
    for name, m in ev.items():
        for metric in EVAL_METRICS:
            lo, hi = (m.get("ci") or {}).get(metric, (float("nan"), float("nan")))
            out.append(row(model=cfg.model, revision=arm, metric=metric,
                           setting=setting_of(cfg, label, name, step), value=float(m[metric]),
                           ci_low=float(lo), ci_high=float(hi), seed=cfg.seed, n=m["n_chunks"]))
    names = [f"heldout:{d.spec}" for d in domains]
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            pair = f"{names[i]}|{names[j]}"
            out.append(row(model=cfg.model, revision=arm, metric="cross_dispersion",
                           setting=setting_of(cfg, label, pair, step),
                           value=cross_dispersion(ev, names[i], names[j]), seed=cfg.seed,
                           n=ev[names[i]]["n_chunks"] + ev[names[j]]["n_chunks"]))
    return out


def train_rows(cfg: FinetuneSettings, arm: str, label: str, step: int,
               logs: Sequence[dict[str, float]]) -> list[dict[str, Any]]:
    """Rows :data:`TRAIN_METRICS`: the mean of the step logs since the previous evaluation."""
    if not logs:
        return []
    out = []
    for metric, key in zip(TRAIN_METRICS, ("lm_loss", "dispersion", "aux")):
        out.append(row(model=cfg.model, revision=arm, metric=metric,
                       setting=setting_of(cfg, label, "train", step),
                       value=float(np.mean([g[key] for g in logs])), seed=cfg.seed, n=len(logs)))
    return out


def paired_delta(a: dict[str, Any], b: dict[str, Any], *, seed: int = 0,
                 n_boot: int = 1000) -> dict[str, tuple[float, float, float]]:
    """``arm a − arm b`` on the same evaluation chunks (two :func:`evaluate` results), with a
    paired bootstrap CI (:func:`lmgeom.metrics.uncertainty.paired_chunk_delta`)."""
    def chunks(ev: dict[str, Any]) -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(ev[k], dtype=np.float64)
                     for k in ("_chunk_nll", "_chunk_ntok", "_chunk_disp"))

    (na, ta, da), (nb, tb, db) = chunks(a), chunks(b)
    if na.shape != nb.shape or not np.array_equal(ta, tb):
        raise ValueError("paired_delta needs the same evaluation chunks for both arms")
    return paired_chunk_delta(na, nb, ta, da, db, seed=seed, n_boot=n_boot)


def delta_rows(cfg: FinetuneSettings, label: str, results: dict[str, ArmResult]) -> list[dict[str, Any]]:
    """Rows ``<metric>_delta_vs_none`` for every arm other than ``none`` at the last step:
    the arm minus the none arm on the same held-out chunks, with a paired bootstrap 95 % CI."""
    ref = results.get("none")
    if ref is None or not ref.final_eval:
        return []
    out = []
    for arm, r in results.items():
        if arm == "none" or not r.final_eval:
            continue
        for name, ev in r.final_eval.items():
            base = ref.final_eval.get(name)
            if base is None or "_chunk_nll" not in ev or "_chunk_nll" not in base:
                continue
            for metric, (v, lo, hi) in paired_delta(ev, base, seed=cfg.seed).items():
                out.append(row(model=cfg.model, revision=arm, metric=f"{metric}_delta_vs_none",
                               setting=setting_of(cfg, label, name, cfg.steps), value=float(v),
                               ci_low=float(lo), ci_high=float(hi), seed=cfg.seed,
                               n=ev["n_chunks"]))
    return out


def tidy(rows: Sequence[dict[str, Any]]):
    """The results table with plain ``arm``, ``step`` and ``eval`` columns added."""
    df = frame(rows)
    parsed = [parse_setting(s) for s in df["setting"]]
    df["arm"] = df["revision"]
    df["step"] = np.array([int(p.get("step", -1)) for p in parsed], dtype=np.int64)
    df["eval"] = [p.get("eval", "") for p in parsed]
    return df


def encode_eval(ev: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """:func:`evaluate`'s result as JSON values (arrays as lists)."""
    return {k: {kk: (vv.tolist() if isinstance(vv, np.ndarray) else vv) for kk, vv in v.items()}
            for k, v in ev.items()}


def decode_eval(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The inverse of :func:`encode_eval` (the pooled mean unit vector back as an array)."""
    return {k: {kk: (np.asarray(vv, dtype=np.float64) if kk == "_mean_unit" else vv)
                for kk, vv in v.items()} for k, v in raw.items()}



def summary_frame(df):
    """Before / after per arm and evaluation set of the results table ``df``: perplexity and
    dispersion (a DataFrame)."""
    out = []
    ev = df[df.metric.isin(["perplexity", "dispersion", "cross_dispersion"])]
    for (arm, name), g in ev.groupby(["arm", "eval"], sort=False):
        first, last = g.step.min(), g.step.max()
        rec = {"arm": arm, "eval": name, "step": int(last)}
        for metric in ("perplexity", "dispersion", "cross_dispersion"):
            m = g[g.metric == metric]
            if len(m):
                rec[f"{metric}_before"] = float(m[m.step == first].value.iloc[0])
                after = m[m.step == last].iloc[0]
                rec[f"{metric}_after"] = float(after.value)
                rec[f"{metric}_after_ci_low"] = float(after.ci_low)
                rec[f"{metric}_after_ci_high"] = float(after.ci_high)
        for metric in ("perplexity", "dispersion"):
            dl = df[(df.metric == f"{metric}_delta_vs_none") & (df.arm == arm)
                    & (df["eval"] == name)]
            if len(dl):
                rec[f"{metric}_delta_vs_none"] = float(dl.value.iloc[0])
                rec[f"{metric}_delta_ci_low"] = float(dl.ci_low.iloc[0])
                rec[f"{metric}_delta_ci_high"] = float(dl.ci_high.iloc[0])
        out.append(rec)
    return pd.DataFrame(out)


def summary_text(cfg: FinetuneSettings, layer: str, df) -> str:
    """The before / after table ``lmgeom train`` prints (with paired deltas vs the none arm)
    of the results table ``df``."""
    summ = summary_frame(df)
    lab = layer
    head = (f"{cfg.model}, {cfg.method}, {cfg.steps} steps x batch {cfg.batch_size} x "
            f"{cfg.seq_len} tokens, lambda {cfg.lam:g}, aux mode {cfg.aux_mode}, layer {lab}, "
            f"lr {cfg.learning_rate:g}")
    rows = []
    for r in summ.to_dict("records"):
        rec = {"arm": r["arm"], "eval": r["eval"]}
        for k in ("perplexity", "dispersion", "cross_dispersion"):
            if f"{k}_before" in r and r[f"{k}_before"] == r[f"{k}_before"]:
                short = {"perplexity": "ppl", "dispersion": "disp", "cross_dispersion": "cross"}[k]
                rec[f"{short} before"] = r[f"{k}_before"]
                rec[f"{short} after"] = r[f"{k}_after"]
                lo, hi = r.get(f"{k}_after_ci_low"), r.get(f"{k}_after_ci_high")
                if lo is not None and not math.isnan(lo):
                    rec[f"{short} after 95% CI"] = f"{lo:.4f}-{hi:.4f}"
        for k, short in (("perplexity", "Δppl vs none"), ("dispersion", "Δdisp vs none")):
            v = r.get(f"{k}_delta_vs_none")
            if v is not None and not math.isnan(v):
                rec[f"{short} (95% CI)"] = (f"{v:+.4f} ({r[f'{k}_delta_ci_low']:+.4f}, "
                                           f"{r[f'{k}_delta_ci_high']:+.4f})")
        rows.append(rec)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    table_text = format_table(rows, cols, floatfmt="{:.4f}")
    return head + "\n" + table_text


__all__ = ["EVAL_METRICS", "TRAIN_METRICS", "cross_dispersion", "decode_eval", "delta_rows",
           "encode_eval", "eval_rows", "evaluate", "paired_delta", "setting_of", "summary_frame",
           "summary_text", "tidy",
           "train_rows"]
