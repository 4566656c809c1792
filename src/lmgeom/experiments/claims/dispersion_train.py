"""Claims D3 and D8 for ``lmgeom claims``: fine-tuning the smallest model
(see :mod:`lmgeom.experiments.claims.dispersion`).

Two short fine-tuning runs of :mod:`lmgeom.experiments.finetune` on ``finetune_texts`` (the
target domain), one with LoRA and one with full fine-tuning, each with the arms ``none`` (plain
cross-entropy) and ``push-away`` (``L_CE - λ d``), same data, order and seed. Their run folders
live in ``work_dir`` (named by a content key) and resume when interrupted.

* **D3** (fine-tuning raises dispersion on the target domain): the ``none`` arm's token-level
  dispersion at the loss layer on the held-out target chunks, after minus before, with a paired
  bootstrap over the chunks (the run's shared step-0 evaluation and the arm's last one). Where
  a run does not keep per-chunk values, the interval of the difference combines the table's two
  half-widths as if independent (``sqrt(h_a² + h_b²)``): conservative, since both are measured
  on the same chunks.
* **D8** (the push-away loss lowers perplexity): ``perplexity_delta_vs_none`` of the
  ``push-away`` arm on the held-out target chunks (the run's paired bootstrap over chunks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..._io import stable_hash
from ...metrics import claims_dispersion as rules
from ...metrics.claims import ClaimVerdict, ModelInfo
from ...models.load import model_fingerprint
from ..finetune import FinetuneConfig, decode_eval, finetune
from .dispersion_base import DispersionClaimsSettings

log = logging.getLogger(__name__)

METHODS = ("lora", "full")


def smallest(models: Sequence[str], infos: Sequence[ModelInfo]) -> tuple[str, ModelInfo]:
    """The model with the smallest width (then fewest layers; first on ties)."""
    i = min(range(len(infos)), key=lambda k: (infos[k].d, infos[k].n_layers, k))
    return models[i], infos[i]


def finetune_config(spec: str, method: str, s: DispersionClaimsSettings, *,
                    device: str | None = None):

    # no geometry trajectory (PGA on probe texts at every evaluation): D3/D8 do not read it
    extra = {"geometry": False} if "geometry" in {
        f.name for f in dataclasses.fields(FinetuneConfig)} else {}
    return FinetuneConfig(**extra, model=spec, texts=(s.finetune_texts,),
                          arms=("none", "push-away"),
                          lam=s.finetune_lam, method=method, steps=s.finetune_steps,
                          eval_every=s.finetune_steps, eval_chunks=s.finetune_eval_chunks,
                          seq_len=s.finetune_seq_len, batch_size=s.finetune_batch,
                          n_texts=s.finetune_n_texts, seed=s.seed, device=device,
                          warmup=min(10, s.finetune_steps // 3), progress=False)


def run_finetune(cfg, out: Path):
    """One fine-tuning run through the public API of :mod:`lmgeom.experiments.finetune`
    (``finetune(cfg, out)``, which runs the registered ``train`` experiment): its result, with
    ``table`` (the tidy rows), ``arms`` and ``out_dir``."""

    return finetune(cfg, out)


def paired_before_after(res, arm: str, target: str) -> tuple[Any, Any] | None:
    """Per-chunk token dispersion of the held-out ``target`` chunks at step 0 and at the end of
    ``arm``, when the run kept both (the step-0 evaluation every arm shares, ``baseline.json``,
    and the arm's last evaluation); ``None`` otherwise."""

    try:

        base_file = Path(res.out_dir) / "baseline.json"
        before = decode_eval(json.loads(base_file.read_text()))[target]["_chunk_disp"]
        after = res.arms[arm].final_eval[target]["_chunk_disp"]
    except (ImportError, OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    b, a = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    return (b, a) if b.shape == a.shape and b.size >= 2 else None


def _key(spec: str, cfg) -> str:
    return stable_hash([cfg.signed(), model_fingerprint(spec)])[:12]


def _rows(df, metric: str, arm: str, target: str):
    return df[(df["metric"] == metric) & (df["arm"] == arm) & (df["eval"] == target)]


def d3_part(res, method: str, target: str, info: ModelInfo, s: DispersionClaimsSettings,
            layer: str = "final") -> ClaimVerdict:
    """D3 for one method (the ``none`` arm, before vs after): paired over the held-out chunks
    when the run kept both per-chunk evaluations, else from the table's two intervals."""
    r = _rows(res.table, "dispersion", "none", target).sort_values("step")
    if len(r) < 2:
        return rules.interval_verdict(f"D3.{method}", "dispersion after - before", math.nan,
                                      math.nan, math.nan, models=(info,), seed=s.seed,
                                      note="the run has no before/after dispersion rows")
    b, a = r.iloc[0], r.iloc[-1]
    paired = paired_before_after(res, "none", target)
    if paired is not None:
        est, lo, hi = rules.paired_difference(paired[1], paired[0], n_boot=s.n_boot,
                                              seed=s.seed)
        how = "paired bootstrap over the held-out chunks"
    else:
        est = float(a.value - b.value)
        half = math.hypot((a.ci_high - a.ci_low) / 2, (b.ci_high - b.ci_low) / 2)
        lo, hi = est - half, est + half
        how = ("the two chunk-bootstrap half-widths combined as if independent (conservative; "
               "the run kept no per-chunk step-0 values)")
    return rules.interval_verdict(
        f"D3.{method}", f"token dispersion at {layer} on held-out {s.finetune_texts} chunks, "
        f"after {int(a.step)} steps of {method} fine-tuning minus before", est, lo, hi,
        threshold=0.0, direction=">", models=(info,), seed=s.seed,
        details={"before": float(b.value), "after": float(a.value), "steps": int(a.step),
                 "n_chunks": int(a.n), "paired": paired is not None},
        note=f"before {b.value:.4f}, after {a.value:.4f}; interval: {how}")


def d8_part(df, method: str, target: str, info: ModelInfo,
            s: DispersionClaimsSettings) -> ClaimVerdict:
    """D8 for one method: the push-away arm's perplexity minus the none arm's (paired)."""
    r = _rows(df, "perplexity_delta_vs_none", "push-away", target)
    if not len(r):
        return rules.interval_verdict(f"D8.{method}", "perplexity(push-away) - perplexity(none)",
                                      math.nan, math.nan, math.nan, models=(info,), seed=s.seed,
                                      note="the run has no perplexity_delta_vs_none row")
    x = r.iloc[-1]
    base = _rows(df, "perplexity", "none", target).sort_values("step")
    after = float(base.iloc[-1].value) if len(base) else math.nan
    return rules.interval_verdict(
        f"D8.{method}", f"held-out {s.finetune_texts} perplexity, push-away (lambda="
        f"{s.finetune_lam:g}) minus none, after {s.finetune_steps} steps of {method} "
        "fine-tuning", float(x.value), float(x.ci_low), float(x.ci_high), threshold=0.0,
        direction="<", models=(info,), seed=s.seed,
        details={"perplexity_none": after, "n_chunks": int(x.n)},
        note=f"perplexity of the none arm {after:.4g}; paired bootstrap over held-out chunks")


def finetune_verdicts(models: Sequence[str], infos: Sequence[ModelInfo],
                      s: DispersionClaimsSettings, work: Path, want: Sequence[str], *,
                      device: str | None = None) -> list[ClaimVerdict]:
    """``D3``, ``D3.lora``, ``D3.full``, ``D8``, ``D8.lora``, ``D8.full`` (those in ``want``)
    on the smallest model."""
    spec, info = smallest(models, infos)
    target = f"heldout:{s.finetune_texts}"
    parts: dict[str, list[ClaimVerdict]] = {"D3": [], "D8": []}
    for method in s.finetune_methods:
        cfg = finetune_config(spec, method, s, device=device)
        out = Path(work) / f"finetune-{method}-{_key(spec, cfg)}"
        log.info("D3/D8: %s fine-tuning of %s in %s", method, spec, out)
        res = run_finetune(cfg, out)
        parts["D3"].append(d3_part(res, method, target, info, s))
        parts["D8"].append(d8_part(res.table, method, target, info, s))
    out_rows: list[ClaimVerdict] = []
    for claim in ("D3", "D8"):
        if claim in want:
            note = f"the smallest model ({info.name}) on {s.finetune_texts}"
            out_rows += [rules.combine(claim, parts[claim], over="methods",
                                       note=note), *parts[claim]]
    return out_rows


def describe(s: DispersionClaimsSettings) -> dict[str, Any]:
    return {"texts": s.finetune_texts, "steps": s.finetune_steps, "lambda": s.finetune_lam,
            "methods": list(s.finetune_methods)}


__all__ = ["METHODS", "d3_part", "d8_part", "finetune_verdicts", "run_finetune", "smallest"]
