"""Fine-tuning with the push-away / squeeze term, and the three-arm comparison (``lmgeom train``).

What one run does (:func:`finetune`):

1. **Data.** Each training corpus (``texts``, one or more: one *domain* each) is split by text
   into a training part and a held-out part (a seeded ``heldout_fraction`` of the texts). Each
   part is joined into one token stream (texts separated by EOS) and cut into chunks of exactly
   ``seq_len`` tokens (BOS in front when the tokenizer prepends one; see
   :func:`lmgeom.experiments.dispersion.make_chunks`). Training batches hold ``batch_size``
   chunks — with several domains, ``batch_size / K`` chunks of each, so every batch has every
   domain (the cross-domain term needs that). Chunks have no padding. The batch of step ``s`` is
   a pure function of ``(seed, s)`` (a seeded permutation of each domain's chunks per epoch), so
   every arm sees the same data in the same order and a resumed run continues exactly.
2. **Evaluation sets.** The held-out chunks of each training corpus (``heldout:SPEC``) and, for
   each ``eval_texts`` corpus not trained on, its chunks (``SPEC``) — at most ``eval_chunks``
   chunks each (seeded sample).
3. **Arms.** ``none`` (plain cross-entropy), ``push-away`` (``L_CE − λ d``) and ``squeeze``
   (``L_CE + λ d``) — one, or all three with ``compare``. Each arm starts from the same weights
   (and the same LoRA initialisation), uses the same seed and the same batches.
4. **Training.** Full parameters or LoRA (PEFT; default rank 8, alpha 16, dropout 0, on every
   linear layer of the blocks — ``target_modules="all-linear"``, i.e. q/k/v/o and the MLP
   projections, not the readout). AdamW (β = 0.9, 0.999, weight decay 0), linear warm-up over
   ``warmup`` steps then a constant learning rate, gradient clipping at 1.0. ``dtype="bfloat16"``
   runs the training forward/backward under ``torch.autocast`` (weights and optimizer stay
   float32); evaluation always runs in float32.
5. **Measurements** at step 0 (before), every ``eval_every`` steps and at the end, per
   evaluation set: ``perplexity`` (corpus figure ``exp(Σ NLL / Σ tokens)`` over its chunks,
   tokens 2..T of each chunk scored, chunked readout via :mod:`lmgeom.lm.perplexity`), ``nll``
   (mean NLL per token) and ``dispersion`` (token-level: the dispersion of each chunk's token
   states at the loss layer, averaged over chunks). With two or more training domains also
   ``cross_dispersion`` (mean cosine distance between the held-out token states of two domains,
   what the cross-domain term optimises). From training: ``train_lm_loss``,
   ``train_dispersion`` (the batch ``d`` the loss sees) and ``train_aux``, averaged over the
   steps since the previous evaluation.
6. **Outputs** (in ``out``): ``train.parquet`` / ``train.csv`` (tidy table, one row per arm ×
   step × evaluation set × metric; ``revision`` = arm, ``setting`` = ``eval=…;step=…;…``, plus
   plain ``arm``, ``step``, ``eval`` columns), ``manifest.json``, ``arms/<arm>/model``
   (``save_pretrained``, safetensors: the whole model + tokenizer for full fine-tuning, the adapter
   for LoRA, plus ``arms/<arm>/merged`` with ``merge_lora``), ``arms/<arm>/train_log.csv`` (every
   step), ``plots/train_curves.png|svg`` and ``report.html``.

Resuming: every ``save_every`` steps the arm's state is written to
``arms/<arm>/checkpoint/`` — trainable weights and AdamW state as safetensors, the step, the
loss's sampling counter, the measurements so far and torch's RNG state — atomically (a new
folder renamed into place). Rerunning the same command continues from there; finished arms are
read back from ``arms/<arm>/result.json``. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import write_json
from ..errors import ConfigError, TextsError
from ..metrics.uncertainty import chunk_ci, paired_chunk_delta
from ..report.figures_training import plot_curves
from ..training.checkpoint import (
    CHECKPOINT_VERSION,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    trainable_parameters,
)
from ..training.loop import aux_objective, train_loop

log = logging.getLogger(__name__)

ARMS = ("none", "push-away", "squeeze")
METHODS = ("lora", "full")
DEFAULT_LR = {"lora": 5e-4, "full": 5e-5}
#: LoRA defaults (documented in docs/train.md)
LORA_DEFAULTS = {"r": 8, "alpha": 16, "dropout": 0.0, "targets": "all-linear"}
EVAL_METRICS = ("perplexity", "nll", "dispersion")
TRAIN_METRICS = ("train_lm_loss", "train_dispersion", "train_aux")
STATE_VERSION = CHECKPOINT_VERSION  # part of the run signature


# ---------------------------------------------------------------------- config
@dataclass
class FinetuneConfig:
    """Every setting of a ``lmgeom train`` run (all enter the run signature except the last
    group).

    Attributes:
        model: model spec (bundled name, hub id, folder, .gguf).
        texts: training corpora, one domain each.
        eval_texts: extra evaluation corpora (cross-domain evaluation).
        arms: aux kinds to train, in order (``("push-away",)``; :data:`ARMS` to compare).
        lam: λ of the aux term.
        aux_mode: ``within`` or ``cross`` (needs >= 2 training corpora).
        layer: measurement point of the aux term and of the dispersion measurement.
        max_tokens: seeded token sample per batch for the aux term (None: all tokens).
        method: ``lora`` or ``full``.
        lora_r, lora_alpha, lora_dropout, lora_targets: PEFT LoRA settings.
        steps: optimizer steps per arm.
        lr: learning rate (None: 5e-4 for LoRA, 5e-5 for full).
        warmup: linear warm-up steps.
        weight_decay: AdamW weight decay.
        grad_clip: max gradient norm (0: off).
        batch_size: chunks per batch (divisible by the number of training corpora).
        seq_len: tokens per chunk (without BOS).
        seed: seed of the split, the data order, the LoRA init and the token sampling.
        eval_every: evaluate every this many steps (and at 0 and at the end).
        eval_chunks: chunks per evaluation set (seeded sample).
        eval_batch_size: chunks per evaluation forward pass.
        heldout_fraction: fraction of each training corpus's texts held out.
        n_texts: load a seeded sample of this many texts per corpus (None: all).
        dtype: ``float32`` or ``bfloat16`` (autocast compute dtype; weights stay float32).
        bos: ``auto`` | ``on`` | ``off`` — BOS before each chunk.
        skip_first: leave position 0 out of the aux term and the dispersion measurement.
        merge_lora: also save the merged model (LoRA) as ``arms/<arm>/merged``.
        device: torch device (None: cuda if available).
        save_every: checkpoint every this many steps (None: = eval_every).
        stop_after: stop (checkpointed) after this many training steps in this invocation
            (counted over all arms); rerun to go on. Not part of the signature.
        keep_checkpoint: keep the last checkpoint after an arm finishes.
        progress: progress bar (None: when stderr is a terminal).
    """

    model: str = "smollm2-135m"
    texts: tuple[str, ...] = ("builtin:wiki",)
    eval_texts: tuple[str, ...] = ()
    arms: tuple[str, ...] = ("push-away",)
    lam: float = 0.01
    aux_mode: str = "within"
    layer: str = "final"
    max_tokens: int | None = None
    method: str = "lora"
    lora_r: int = LORA_DEFAULTS["r"]
    lora_alpha: int = LORA_DEFAULTS["alpha"]
    lora_dropout: float = LORA_DEFAULTS["dropout"]
    lora_targets: str = LORA_DEFAULTS["targets"]
    steps: int = 200
    lr: float | None = None
    warmup: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 8
    seq_len: int = 128
    seed: int = 0
    eval_every: int = 50
    eval_chunks: int = 64
    eval_batch_size: int = 8
    heldout_fraction: float = 0.1
    n_texts: int | None = None
    dtype: str = "float32"
    bos: str = "auto"
    skip_first: bool = False
    merge_lora: bool = False
    device: str | None = None
    # not in the signature
    save_every: int | None = None
    stop_after: int | None = None
    keep_checkpoint: bool = False
    progress: bool | None = None

    _UNSIGNED = ("device", "save_every", "stop_after", "keep_checkpoint", "progress")

    def __post_init__(self) -> None:
        self.texts = tuple(self.texts)
        self.eval_texts = tuple(self.eval_texts)
        self.arms = tuple(self.arms)
        if not self.texts:
            raise ConfigError("give at least one training corpus (--texts)")
        if len(set(self.texts)) != len(self.texts):
            raise ConfigError(f"--texts repeats a corpus: {list(self.texts)}")
        if not self.arms or any(a not in ARMS for a in self.arms) or len(set(self.arms)) != len(self.arms):
            raise ConfigError(f"arms must be distinct values of {', '.join(ARMS)}; got {list(self.arms)}")
        if self.method not in METHODS:
            raise ConfigError(f"method must be lora or full, got {self.method!r}")
        if self.aux_mode not in ("within", "cross"):
            raise ConfigError(f"aux_mode must be within or cross, got {self.aux_mode!r}")
        if self.aux_mode == "cross" and len(self.texts) < 2:
            raise ConfigError("--aux-mode cross needs two training domains: repeat --texts "
                              "(e.g. --texts builtin:wiki --texts builtin:code)")
        if self.batch_size < 1 or self.batch_size % len(self.texts):
            raise ConfigError(f"--batch-size {self.batch_size} must be a positive multiple of the "
                              f"number of training corpora ({len(self.texts)}): every batch holds "
                              "the same number of chunks of each domain")
        for name, v, lo in (("steps", self.steps, 1), ("seq_len", self.seq_len, 2),
                            ("eval_every", self.eval_every, 1), ("eval_chunks", self.eval_chunks, 1),
                            ("eval_batch_size", self.eval_batch_size, 1), ("warmup", self.warmup, 0),
                            ("lora_r", self.lora_r, 1)):
            if int(v) < lo:
                raise ConfigError(f"{name} must be >= {lo}, got {v}")
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise ConfigError(f"--lambda must be a finite number >= 0, got {self.lam}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be float32 or bfloat16 (autocast), got {self.dtype!r}")
        if self.save_every is not None and self.save_every < 1:
            raise ConfigError(f"save_every must be >= 1, got {self.save_every}")
        if self.stop_after is not None and self.stop_after < 1:
            raise ConfigError(f"stop_after must be >= 1, got {self.stop_after}")

    @property
    def learning_rate(self) -> float:
        return float(self.lr if self.lr is not None else DEFAULT_LR[self.method])

    @property
    def eval_steps(self) -> list[int]:
        return sorted({0, *range(self.eval_every, self.steps, self.eval_every), self.steps})

    def signed(self) -> dict[str, Any]:
        """The settings that change the results (the run signature's input)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in self._UNSIGNED}
        d["lr"] = self.learning_rate
        d["texts"], d["eval_texts"], d["arms"] = list(self.texts), list(self.eval_texts), list(self.arms)
        if self.method == "full":
            for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets", "merge_lora"):
                d.pop(k)
        d["state_version"] = STATE_VERSION
        return d


# ---------------------------------------------------------------------- data
@dataclass
class Domain:
    """One training corpus: its training chunks and its held-out chunks ``(N, T)`` int64."""

    spec: str
    index: int
    train: np.ndarray
    heldout: np.ndarray
    n_train_texts: int
    n_heldout_texts: int
    info: dict[str, Any] = field(default_factory=dict)


def split_texts(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``n`` texts: ``(train_idx, heldout_idx)``, both sorted, heldout >= 1."""
    if n < 2:
        raise TextsError(f"a training corpus needs at least 2 texts to hold some out; it has {n}")
    k = min(n - 1, max(1, round(fraction * n)))
    perm = np.random.default_rng([seed, 0x5EED]).permutation(n)
    return np.sort(perm[k:]), np.sort(perm[:k])


def prepare_data(model, cfg: FinetuneConfig) -> tuple[list[Domain], dict[str, np.ndarray]]:
    """Training domains and evaluation sets (name → ``(N, T)`` chunks) for ``cfg``."""
    from ..texts import load_texts
    from ..texts.chunks import make_chunks

    domains: list[Domain] = []
    evals: dict[str, np.ndarray] = {}
    for i, spec in enumerate(cfg.texts):
        ts = load_texts(spec, limit=cfg.n_texts, seed=cfg.seed)
        tr, ho = split_texts(len(ts), cfg.heldout_fraction, cfg.seed)
        c_tr = make_chunks(model, ts.subset(tr), cfg.seq_len, bos=cfg.bos)
        try:
            c_ho = make_chunks(model, ts.subset(ho), cfg.seq_len, max_chunks=cfg.eval_chunks,
                               seed=cfg.seed, bos=cfg.bos)
        except TextsError as exc:
            raise TextsError(f"{spec}: the held-out texts are too short for one chunk of "
                             f"{cfg.seq_len} tokens; raise heldout_fraction or lower --seq-len "
                             f"({exc})") from exc
        if len(c_tr) < cfg.batch_size // len(cfg.texts):
            raise TextsError(f"{spec}: only {len(c_tr)} training chunks of {cfg.seq_len} tokens, "
                             "fewer than one batch needs")
        domains.append(Domain(spec, i, c_tr.tokens, c_ho.tokens, len(tr), len(ho), info={
            "texts": spec, "texts_hash": ts.hash, "n_texts": len(ts),
            "n_train_texts": len(tr), "n_heldout_texts": len(ho),
            "n_train_chunks": len(c_tr), "n_train_tokens": int(c_tr.n_document_tokens),
            "n_heldout_chunks": len(c_ho), "n_heldout_chunks_available": c_ho.n_available,
            "bos": c_tr.bos}))
        evals[f"heldout:{spec}"] = c_ho.tokens
    for spec in cfg.eval_texts:
        if spec in cfg.texts:
            continue  # its held-out part is already an evaluation set
        ts = load_texts(spec, limit=cfg.n_texts, seed=cfg.seed)
        evals[spec] = make_chunks(model, ts, cfg.seq_len, max_chunks=cfg.eval_chunks,
                                  seed=cfg.seed, bos=cfg.bos).tokens
    return domains, evals


class BatchSchedule:
    """The batch of step ``s``: ``batch_size / K`` chunks of each of the K domains, taken from
    a stream of per-epoch seeded permutations of each domain's chunks (pure in ``(seed, s)``)."""

    def __init__(self, domains: Sequence[Domain], batch_size: int, seed: int) -> None:
        self.domains = list(domains)
        self.per = batch_size // len(self.domains)
        self.seed = seed
        self._perm: dict[tuple[int, int], np.ndarray] = {}

    def _perm_of(self, d: int, epoch: int) -> np.ndarray:
        key = (d, epoch)
        if key not in self._perm:
            n = len(self.domains[d].train)
            self._perm[key] = np.random.default_rng([self.seed, d, epoch]).permutation(n)
        return self._perm[key]

    def indices(self, step: int) -> list[np.ndarray]:
        """Per domain, the chunk indices used at ``step``."""
        out = []
        for d, dom in enumerate(self.domains):
            n = len(dom.train)
            pos = np.arange(step * self.per, (step + 1) * self.per)
            out.append(np.array([self._perm_of(d, int(p // n))[p % n] for p in pos], dtype=np.int64))
        return out

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids (B, T), domain (B,))`` for ``step``."""
        idx = self.indices(step)
        ids = np.concatenate([dom.train[i] for dom, i in zip(self.domains, idx)])
        dom = np.concatenate([np.full(len(i), d, dtype=np.int64) for d, i in enumerate(idx)])
        return ids, dom

    def epochs(self, steps: int) -> float:
        return min(steps * self.per / len(d.train) for d in self.domains)


# ---------------------------------------------------------------------- evaluation
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
    import contextlib

    import torch

    from ..lm.perplexity import forward_chunks
    from ..metrics.dispersion import token_dispersion

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


# ---------------------------------------------------------------------- rows
def _setting(cfg: FinetuneConfig, label: str, eval_name: str, step: int) -> str:
    return (f"eval={eval_name};step={step};method={cfg.method};lambda={cfg.lam:g};"
            f"mode={cfg.aux_mode};layer={label}")


def eval_rows(cfg: FinetuneConfig, arm: str, label: str, step: int,
              ev: dict[str, dict[str, Any]], domains: Sequence[Domain]) -> list[dict[str, Any]]:
    from ..results.table import row

    out = []
    for name, m in ev.items():
        for metric in EVAL_METRICS:
            lo, hi = (m.get("ci") or {}).get(metric, (float("nan"), float("nan")))
            out.append(row(model=cfg.model, revision=arm, metric=metric,
                           setting=_setting(cfg, label, name, step), value=float(m[metric]),
                           ci_low=float(lo), ci_high=float(hi), seed=cfg.seed, n=m["n_chunks"]))
    names = [f"heldout:{d.spec}" for d in domains]
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            pair = f"{names[i]}|{names[j]}"
            out.append(row(model=cfg.model, revision=arm, metric="cross_dispersion",
                           setting=_setting(cfg, label, pair, step),
                           value=cross_dispersion(ev, names[i], names[j]), seed=cfg.seed,
                           n=ev[names[i]]["n_chunks"] + ev[names[j]]["n_chunks"]))
    return out


def train_rows(cfg: FinetuneConfig, arm: str, label: str, step: int,
               logs: Sequence[dict[str, float]]) -> list[dict[str, Any]]:
    from ..results.table import row

    if not logs:
        return []
    out = []
    for metric, key in zip(TRAIN_METRICS, ("lm_loss", "dispersion", "aux")):
        out.append(row(model=cfg.model, revision=arm, metric=metric,
                       setting=_setting(cfg, label, "train", step),
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


def delta_rows(cfg: FinetuneConfig, label: str, results: dict[str, ArmResult]) -> list[dict[str, Any]]:
    """Rows ``<metric>_delta_vs_none`` for every arm other than ``none`` at the last step:
    the arm minus the none arm on the same held-out chunks, with a paired bootstrap 95 % CI."""
    from ..results.table import row

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
                               setting=_setting(cfg, label, name, cfg.steps), value=float(v),
                               ci_low=float(lo), ci_high=float(hi), seed=cfg.seed,
                               n=ev["n_chunks"]))
    return out


def tidy(rows: Sequence[dict[str, Any]]):
    """The results table with plain ``arm``, ``step`` and ``eval`` columns added."""
    from ..metrics.regime import parse_setting
    from ..results.table import frame

    df = frame(rows)
    parsed = [parse_setting(s) for s in df["setting"]]
    df["arm"] = df["revision"]
    df["step"] = np.array([int(p.get("step", -1)) for p in parsed], dtype=np.int64)
    df["eval"] = [p.get("eval", "") for p in parsed]
    return df


# ---------------------------------------------------------------------- one arm
@dataclass
class ArmResult:
    """Rows and per-step log of one finished (or stopped) arm."""

    arm: str
    rows: list[dict[str, Any]]
    log: list[dict[str, float]]
    finished: bool
    model_dir: str | None = None
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    final_eval: dict[str, Any] | None = None  # evaluate() of the last step (encoded)


def _load_lm(cfg: FinetuneConfig):
    from ..models import load_model

    return load_model(cfg.model, dtype="float32", device=cfg.device)


def _reevaluate_saved(cfg: FinetuneConfig, model_dir: Path,
                      eval_sets: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """:func:`evaluate` of a finished arm's saved model (full: the model folder; LoRA: the base
    model with the saved adapter), encoded; None if the folder is gone."""
    from ..models import load_model

    if not model_dir.is_dir():
        return None
    if cfg.method == "lora":
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        lm = _load_lm(cfg)
        model = _attach(lm, cfg)
        set_peft_model_state_dict(model, load_file(str(model_dir / "adapter_model.safetensors")))
    else:
        lm = load_model(model_dir, dtype="float32", device=cfg.device)
    label = resolve_point(lm, cfg.layer)
    log.info("re-evaluating the saved model in %s (per-chunk results)", model_dir)
    return _encode_eval(evaluate(lm, eval_sets, label, batch_size=cfg.eval_batch_size,
                                 skip_first=cfg.skip_first, seed=cfg.seed))


def _attach(lm, cfg: FinetuneConfig):
    """The module to train: the LoRA-wrapped model (adapters injected in place) or the model."""
    if cfg.method == "full":
        for p in lm.hf_model.parameters():
            p.requires_grad_(True)
        return lm.hf_model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("LoRA needs the 'peft' package: pip install 'lmgeom[train]' (or "
                          "pip install peft), or use --full") from exc
    targets: Any = cfg.lora_targets
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")
    import warnings

    try:
        with warnings.catch_warnings():  # peft probes a deprecated transformers attribute
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                    category=FutureWarning)
            return get_peft_model(lm.hf_model, lcfg)
    except ValueError as exc:
        raise ConfigError(f"LoRA targets {cfg.lora_targets!r} do not match modules of "
                          f"{cfg.model}: {exc}") from exc


def _lr_at(cfg: FinetuneConfig, step: int) -> float:
    if cfg.warmup <= 0:
        return cfg.learning_rate
    return cfg.learning_rate * min(1.0, (step + 1) / cfg.warmup)


def train_arm(
    cfg: FinetuneConfig,
    arm: str,
    domains: Sequence[Domain],
    eval_sets: dict[str, np.ndarray],
    arm_dir: Path,
    *,
    baseline: dict[str, dict[str, Any]] | None = None,
    on_eval: Callable[[str, int, dict], None] | None = None,
    budget: int | None = None,
) -> ArmResult:
    """Train one arm (resuming from its checkpoint when there is one).

    ``budget``: stop (checkpointed) after this many steps of this call (None: no limit).
    """
    import contextlib

    import torch
    from tqdm.auto import tqdm

    from ..training.losses import make_aux_loss, resolve_layer

    done = arm_dir / "result.json"
    if done.is_file():
        r = json.loads(done.read_text())
        if r.get("final_eval") is None and r.get("model_dir"):
            # finished by an older lmgeom without per-chunk results: re-evaluate the saved model
            r["final_eval"] = _reevaluate_saved(cfg, Path(r["model_dir"]), eval_sets)
            write_json(done, r)
        return ArmResult(arm, r["rows"], r["log"], True, r.get("model_dir"), r.get("seconds", 0.0),
                         {**r.get("info", {}), "steps_run": 0}, r.get("final_eval"))
    t0 = time.perf_counter()
    lm = _load_lm(cfg)
    label = resolve_layer(lm, cfg.layer)
    dev = lm.device
    sched = BatchSchedule(domains, cfg.batch_size, cfg.seed)
    ck_dir = arm_dir / "checkpoint"
    save_every = cfg.save_every or cfg.eval_every
    ac = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if cfg.dtype == "bfloat16" \
        else contextlib.nullcontext
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(cfg.seed)
        model = _attach(lm, cfg)
        params = [p for _, p in trainable_parameters(model)]
        n_trainable = int(sum(p.numel() for p in params))
        opt = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(0.9, 0.999),
                                weight_decay=cfg.weight_decay)
        aux = make_aux_loss(arm, lam=cfg.lam, layer=label, mode=cfg.aux_mode,
                            max_tokens=cfg.max_tokens, seed=cfg.seed, skip_first=cfg.skip_first)
        found = find_checkpoint(ck_dir)
        if found is not None:
            st = load_checkpoint(found, model, opt)
            step0, rows, logs = int(st["step"]), st["rows"], st["log"]
            last_eval = st.get("last_eval")
            aux.calls = int(st["aux_calls"])
            elapsed = float(st.get("seconds", 0.0))
            log.info("%s: resuming from step %d (%s)", arm, step0, found)
        else:
            step0, rows, logs, elapsed, last_eval = 0, [], [], 0.0, None
            ev = baseline if baseline is not None else evaluate(
                lm, eval_sets, label, batch_size=cfg.eval_batch_size, skip_first=cfg.skip_first, seed=cfg.seed)
            rows = eval_rows(cfg, arm, label, 0, ev, domains)
            if on_eval:
                on_eval(arm, 0, ev)
        model.train()
        eval_at = set(cfg.eval_steps)
        last_eval = max(s for s in eval_at if s <= step0)
        since_eval = [g for g in logs if g["step"] > last_eval]
        bar = tqdm(total=cfg.steps, initial=step0, desc=f"train {arm}", unit="step",
                   disable=not _show_progress(cfg.progress), leave=False)
        t_run = time.perf_counter()
        state = {"ran": 0, "stopped": False}

        def batch_at(step: int) -> dict[str, Any]:
            ids, dom = sched.batch(step)
            return {"input_ids": torch.from_numpy(ids).to(dev),
                    "attention_mask": torch.ones(ids.shape, dtype=torch.long, device=dev),
                    "domain": torch.from_numpy(dom).to(dev)}

        def on_step(s: int, entry: dict[str, float], lm=lm, model=model, opt=opt) -> bool:
            nonlocal rows, last_eval, since_eval
            logs.append(entry)
            since_eval.append(entry)
            bar.update(1)
            bar.set_postfix(lm=f"{entry['lm_loss']:.3f}", d=f"{entry['dispersion']:.3f}")
            state["ran"] += 1
            if s % 10 == 0:
                recent = logs[-10:]
                log.info("%s step %d/%d: lm_loss %.4f, d %.4f, %.1f s/step", arm, s, cfg.steps,
                         np.mean([g["lm_loss"] for g in recent]),
                         np.mean([g["dispersion"] for g in recent]),
                         np.mean([g.get("seconds", np.nan) for g in recent]))
            if s in eval_at:
                ev = evaluate(lm, eval_sets, label, batch_size=cfg.eval_batch_size,
                              skip_first=cfg.skip_first, seed=cfg.seed)
                rows += eval_rows(cfg, arm, label, s, ev, domains)
                rows += train_rows(cfg, arm, label, s, since_eval)
                last_eval = _encode_eval(ev)
                since_eval = []
                if on_eval:
                    on_eval(arm, s, ev)
            stopping = budget is not None and state["ran"] >= budget and s < cfg.steps
            if s % save_every == 0 or stopping:
                save_checkpoint(ck_dir, model, opt, {
                    "step": s, "rows": rows, "log": logs, "aux_calls": aux.calls, "arm": arm,
                    "last_eval": last_eval,
                    "seconds": elapsed + time.perf_counter() - t_run})
            state["stopped"] = stopping
            return stopping

        train_loop(model, opt, params, start=step0, steps=cfg.steps, batch_at=batch_at,
                   lr_at=lambda step: _lr_at(cfg, step), objective=aux_objective(aux),
                   grad_clip=cfg.grad_clip, autocast=ac, hooks=[on_step], what=arm,
                   hint="lower --lr or --lambda")
        ran = state["ran"]
        if state["stopped"]:
            bar.close()
            log.warning("%s: stopped after step %d of %d (checkpointed); rerun to continue",
                        arm, logs[-1]["step"], cfg.steps)
            return ArmResult(arm, rows, logs, False, None,
                             elapsed + time.perf_counter() - t_run, {"steps_run": ran})
        bar.close()
    seconds = elapsed + time.perf_counter() - t_run
    model_dir = _save_final(lm, model, cfg, arm_dir)
    _write_log(arm_dir / "train_log.csv", logs)
    info = {"steps_run": ran, "n_trainable": n_trainable, "n_parameters": int(sum(p.numel() for p in lm.hf_model.parameters())),
            "layer": label, "aux_degenerate_batches": aux.n_degenerate, "train_seconds": seconds,
            "wall_seconds_this_call": time.perf_counter() - t0}
    write_json(done, {"rows": rows, "log": logs, "model_dir": model_dir, "seconds": seconds,
                      "info": info, "final_eval": last_eval})
    if not cfg.keep_checkpoint:
        shutil.rmtree(ck_dir, ignore_errors=True)
        shutil.rmtree(ck_dir.with_name(ck_dir.name + ".old"), ignore_errors=True)
    del model, lm, opt
    return ArmResult(arm, rows, logs, True, model_dir, seconds, info, last_eval)


def _show_progress(progress: bool | None) -> bool:
    import sys

    if progress is None:
        return sys.stderr.isatty() and not os.environ.get("LMGEOM_QUIET")
    return bool(progress)


def _write_log(path: Path, logs: Sequence[dict[str, float]]) -> None:
    import pandas as pd

    from .._io import atomic_path

    cols = ["step", "lm_loss", "dispersion", "aux", "total", "lr", "grad_norm", "seconds"]
    with atomic_path(path) as tmp:
        pd.DataFrame(list(logs), columns=cols).to_csv(tmp, index=False)


def _save_final(lm, model, cfg: FinetuneConfig, arm_dir: Path) -> str:
    """``save_pretrained`` (safetensors) of the model + tokenizer (full) or the adapter (LoRA)."""
    target = arm_dir / "model"
    tmp = arm_dir / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if cfg.method == "lora":
        model.save_pretrained(str(tmp), safe_serialization=True)  # adapter_model.safetensors
    else:
        model.save_pretrained(str(tmp))  # transformers >= 5 always writes safetensors
        lm.tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    if cfg.method == "lora" and cfg.merge_lora:
        merged = arm_dir / "merged"
        mtmp = arm_dir / "merged.tmp"
        shutil.rmtree(mtmp, ignore_errors=True)
        m = model.merge_and_unload()
        m.save_pretrained(str(mtmp))
        lm.tokenizer.save_pretrained(str(mtmp))
        shutil.rmtree(merged, ignore_errors=True)
        os.replace(mtmp, merged)
    return str(target)


# ---------------------------------------------------------------------- the run
@dataclass
class FinetuneResult:
    """What :func:`finetune` produced.

    Attributes:
        table: tidy results (``train.parquet``), one row per arm × step × set × metric.
        arms: per-arm :class:`ArmResult`.
        finished: every arm reached ``steps``.
        out_dir: the run folder.
        report: ``report.html`` (None while unfinished).
        manifest: the run manifest.
    """

    table: Any
    arms: dict[str, ArmResult]
    finished: bool
    out_dir: Path
    report: Path | None
    manifest: dict[str, Any]
    config: Any = None

    def summary_text(self) -> str:
        """The before / after table the CLI prints (with paired deltas vs the none arm)."""
        from ..results.console import format_table

        cfg = self.config
        summ = self.summary()
        lab = self.manifest.get("layer", cfg.layer)
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
                    if lo is not None and lo == lo:
                        rec[f"{short} after 95% CI"] = f"{lo:.4f}-{hi:.4f}"
            for k, short in (("perplexity", "Δppl vs none"), ("dispersion", "Δdisp vs none")):
                v = r.get(f"{k}_delta_vs_none")
                if v is not None and v == v:
                    rec[f"{short} (95% CI)"] = (f"{v:+.4f} ({r[f'{k}_delta_ci_low']:+.4f}, "
                                               f"{r[f'{k}_delta_ci_high']:+.4f})")
            rows.append(rec)
        cols = list(dict.fromkeys(k for r in rows for k in r))
        table_text = format_table(rows, cols, floatfmt="{:.4f}")
        return head + "\n" + table_text

    def summary(self):
        """Before / after per arm and evaluation set: perplexity and dispersion (a DataFrame)."""
        import pandas as pd

        df = self.table
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


def finetune(cfg: FinetuneConfig, out: str | os.PathLike[str], *, overwrite: bool = False) -> FinetuneResult:
    """Run every arm of ``cfg`` into ``out`` (resuming what is there); see the module docstring.
    The folder is a :class:`~lmgeom.results.folder.RunFolder`: locked against a second run while
    this one writes, refused for a different run unless ``overwrite``."""
    from .._io import record_tree
    from ..models.load import model_fingerprint
    from ..results.folder import RunFolder
    from ..texts import source_fingerprint

    # the arms resume from this folder: key it by content too (an edited corpus file or
    # replaced weights make a different run, never a resumed one)
    signed = {**cfg.signed(), "inputs": {
        "model": model_fingerprint(cfg.model),
        "texts": {t: source_fingerprint(t) for t in (*cfg.texts, *cfg.eval_texts)}}}
    with RunFolder.create(out, "train", signed, overwrite=overwrite) as folder:
        t_start_ns = time.time_ns()
        try:
            return _finetune(cfg, folder)
        finally:
            record_tree(folder.path, since_ns=t_start_ns)  # what this run wrote (--overwrite)


def _finetune(cfg: FinetuneConfig, folder) -> FinetuneResult:
    from ..results.manifest import now
    from ..results.table import write_table

    t_start = time.perf_counter()
    out_dir = folder.path
    manifest = folder.manifest
    manifest["models"] = [cfg.model]
    manifest["texts"] = list(cfg.texts) + [t for t in cfg.eval_texts if t not in cfg.texts]
    timings: dict[str, float] = {}

    t = time.perf_counter()
    lm = _load_lm(cfg)
    label = resolve_point(lm, cfg.layer)
    domains, eval_sets = prepare_data(lm, cfg)
    timings["data_s"] = time.perf_counter() - t
    baseline = None
    if len(cfg.arms) > 1:  # step 0 is the same model for every arm: measure it once
        base_file = out_dir / "baseline.json"
        if base_file.is_file():
            baseline = _decode_eval(json.loads(base_file.read_text()))
        else:
            t = time.perf_counter()
            baseline = evaluate(lm, eval_sets, label, batch_size=cfg.eval_batch_size,
                                skip_first=cfg.skip_first, seed=cfg.seed)
            timings["baseline_eval_s"] = time.perf_counter() - t
            write_json(base_file, _encode_eval(baseline))
    manifest["model_info"] = lm.describe()
    del lm

    results: dict[str, ArmResult] = {}
    budget = cfg.stop_after  # steps left in this call (over all arms)
    for arm in cfg.arms:
        t = time.perf_counter()
        results[arm] = train_arm(cfg, arm, domains, eval_sets, out_dir / "arms" / arm,
                                 baseline=baseline, on_eval=_log_eval, budget=budget)
        timings[f"arm_s[{arm}]"] = time.perf_counter() - t
        if not results[arm].finished:
            break
        if budget is not None:
            budget -= int(results[arm].info.get("steps_run", 0))
            if budget <= 0 and arm != cfg.arms[-1]:
                log.warning("stopped after %d steps (--stop-after) before arm %s; rerun to "
                            "continue", cfg.stop_after, cfg.arms[cfg.arms.index(arm) + 1])
                break
    finished = len(results) == len(cfg.arms) and all(r.finished for r in results.values())
    rows = [r for a in results.values() for r in a.rows]
    if finished:
        rows += delta_rows(cfg, label, results)
    df = tidy(rows)
    write_table(df, out_dir, "train")
    schedule = BatchSchedule(domains, cfg.batch_size, cfg.seed)
    manifest.update({
        "layer": label,
        "arms": list(cfg.arms),
        "finished": now() if finished else None,
        "complete": finished,
        "data": [d.info for d in domains],
        "eval_sets": {k: len(v) for k, v in eval_sets.items()},
        "epochs": schedule.epochs(cfg.steps),
        "lr_used": cfg.learning_rate,
        "seeds": {"split": cfg.seed, "data_order": cfg.seed, "lora_init": cfg.seed,
                  "aux_sampling": cfg.seed, "eval_chunks": cfg.seed},
        "arm_info": {a: r.info | {"model_dir": r.model_dir, "finished": r.finished}
                     for a, r in results.items()},
    })
    report = None
    timings["total_s"] = time.perf_counter() - t_start
    manifest["timings"] = timings
    if finished:
        from ..report.html import write_report

        figs = plot_curves(df, out_dir / "plots")
        extra = []
        if figs:
            caption = (f"Held-out perplexity and token-level dispersion at layer {label} per "
                       f"arm (none / push-away / squeeze, λ = {cfg.lam:g}, {cfg.method}, "
                       f"mode {cfg.aux_mode}); same seed and data order for every arm.")
            extra.append(("Perplexity and dispersion over training steps", figs, caption))
        manifest["extra_plots"] = [str(Path(p).relative_to(out_dir)) for p in figs]
        report = write_report(out_dir, df, manifest, extra_figures=extra,
                              title=f"lmgeom train — {cfg.model}, {cfg.method}, "
                                    f"{'+'.join(cfg.texts)}")
    write_json(out_dir / "manifest.json", manifest)
    return FinetuneResult(df, results, finished, out_dir, report, manifest, cfg)


def resolve_point(lm, layer: str) -> str:
    from ..training.losses import resolve_layer

    return resolve_layer(lm, layer)


def _encode_eval(ev: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: {kk: (vv.tolist() if isinstance(vv, np.ndarray) else vv) for kk, vv in v.items()}
            for k, v in ev.items()}


def _decode_eval(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: {kk: (np.asarray(vv, dtype=np.float64) if kk == "_mean_unit" else vv)
                for kk, vv in v.items()} for k, v in raw.items()}


def _log_eval(arm: str, step: int, ev: dict[str, dict[str, Any]]) -> None:
    for name, m in ev.items():
        log.info("%s step %d %s: perplexity %.4g, dispersion %.4f", arm, step, name,
                 m["perplexity"], m["dispersion"])


def compare_arms(cfg: FinetuneConfig, out: str | os.PathLike[str], **kwargs: Any) -> FinetuneResult:
    """:func:`finetune` with the three arms none / push-away / squeeze."""
    return finetune(dataclasses.replace(cfg, arms=ARMS), out, **kwargs)
