"""Fine-tuning with the push-away / squeeze term, and the three-arm comparison (``lmgeom train``).

What one run does (:class:`FinetuneConfig`, a registered experiment: ``run_experiment(config,
out)``, or :func:`finetune`):

1. **Data.** Each training corpus (``texts``, one or more: one *domain* each) is split by text
   into a training part and a held-out part (a seeded ``heldout_fraction`` of the texts:
   :meth:`lmgeom.texts.TextSet.split` with ``stream`` 0x5EED). Each
   part is joined into one token stream (texts separated by EOS) and cut into chunks of exactly
   ``seq_len`` tokens (BOS in front when the tokenizer prepends one; see
   :func:`lmgeom.experiments.dispersion.make_chunks`). Training batches hold ``batch_size``
   chunks — with several domains, ``batch_size / K`` chunks of each, so every batch has every
   domain (the cross-domain term needs that). Chunks have no padding. The batch of step ``s`` is
   a pure function of ``(seed, s)`` (:class:`lmgeom.training.schedule.BatchSchedule`: a seeded
   permutation of each domain's chunks per epoch), so every arm sees the same data in the same
   order and a resumed run continues exactly.
2. **Evaluation sets.** The held-out chunks of each training corpus (``heldout:SPEC``) and, for
   each ``eval_texts`` corpus not trained on, its chunks (``SPEC``) — at most ``eval_chunks``
   chunks each (seeded sample).
3. **Arms.** ``none`` (plain cross-entropy), ``push-away`` (``L_CE − λ d``) and ``squeeze``
   (``L_CE + λ d``) — one, or all three with ``compare``. Each arm starts from the same weights
   (and the same LoRA initialisation), uses the same seed and the same batches.
4. **Training** (the one loop, :func:`lmgeom.training.loop.train_loop`). Full parameters or LoRA (PEFT; default rank 8, alpha 16, dropout 0, on every
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

The pieces: :mod:`.finetune_data` (split, chunks, batches), :mod:`.finetune_eval` (measurements
and rows), :mod:`.finetune_arms` (one arm: the model, the loop's step hook, what it saves).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .._io import fs_clock_ns, record_tree, write_json
from ..errors import ConfigError
from ..report.figures_training import plot_curves
from ..texts import source_fingerprint
from ..training.checkpoint import CHECKPOINT_VERSION
from .base import register, run_experiment
from .finetune_arms import ArmResult, MakeHooks, load_lm, train_arm
from .finetune_data import Domain, domain_schedule, prepare_data
from .finetune_eval import (
    EVAL_METRICS,
    TRAIN_METRICS,
    decode_eval,
    delta_rows,
    encode_eval,
    evaluate,
    summary_frame,
    summary_text,
    tidy,
)

log = logging.getLogger(__name__)

ARMS = ("none", "push-away", "squeeze")
#: every regulariser an arm may train with (the names of
#: :data:`lmgeom.training.regularisers.REGULARISERS`, kept here so importing this module loads
#: no torch; tests/test_train_geometry.py checks they agree)
ALL_ARMS = (*ARMS, "infonce-l2", "infonce-cos", "hinge-cos", "covariance")
METHODS = ("lora", "full")
DEFAULT_LR = {"lora": 5e-4, "full": 5e-5}
#: LoRA defaults (documented in docs/train.md)
LORA_DEFAULTS = {"r": 8, "alpha": 16, "dropout": 0.0, "targets": "all-linear"}
STATE_VERSION = CHECKPOINT_VERSION  # part of the run signature
DEFAULT_TEXTS = ("builtin:wiki",)


def _cli(**spec: Any) -> dict[str, Any]:
    """How a field appears as a ``lmgeom train`` option (read by
    :func:`lmgeom.commands.options.add_options`; types by name, see its ``TYPES``)."""
    return {"cli": spec}


_OFF = _cli(cli=False)  # set by the command some other way (model options, --compare, --full)


# ---------------------------------------------------------------------- config
@register
@dataclass
class FinetuneConfig:
    """Every setting of a ``lmgeom train`` run, and the experiment itself (``command`` train,
    table ``train``): ``run_experiment(FinetuneConfig(...), out)``. All settings enter the run
    signature except ``device``, ``save_every``, ``stop_after``, ``keep_checkpoint``,
    ``progress`` and ``make_hooks``. The entries below are also the options' ``--help``.

    Attributes:
        model: model spec (bundled name, hub id, folder, .gguf).
        texts: training corpus, one domain each.
        eval_texts: extra evaluation corpus (cross-domain evaluation).
        arms: aux kinds to train, in order (("push-away",); ARMS to compare).
        lam: weight λ of L_aux.
        aux_mode: dispersion within the batch, or between the tokens of two domains (cross:
            needs two or more training corpora).
        layer: measurement point of the loss and of the dispersion measurement (final = after
            the final norm; last = last block, pre-norm; 12; 12.attn_out).
        max_tokens: seeded sample of at most this many token states per batch for L_aux.
        method: lora or full.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        lora_dropout: LoRA dropout.
        lora_targets: LoRA target modules: all-linear, or names like q_proj,v_proj.
        steps: optimizer steps per arm.
        lr: learning rate (default 0.0005 LoRA, 5e-05 full).
        warmup: linear warm-up steps.
        weight_decay: AdamW weight decay.
        grad_clip: max gradient norm (0: off).
        batch_size: chunks per batch (a multiple of the number of --texts).
        seq_len: tokens per training / eval chunk.
        seed: seed of the split, data order, LoRA init and token sampling.
        eval_every: evaluate every this many steps (and at 0 and at the end).
        eval_chunks: chunks per evaluation set (seeded sample).
        eval_batch_size: chunks per evaluation forward.
        heldout_fraction: fraction of each training corpus's texts held out for evaluation.
        n_texts: use a seeded sample of this many texts per corpus (default: all).
        dtype: float32 or bfloat16 (autocast compute dtype; weights stay float32).
        bos: BOS before each chunk: auto = when the tokenizer prepends one.
        skip_first: leave position 0 (BOS / attention sink) out of L_aux and the dispersion.
        merge_lora: also save the merged model (analysable with --model DIR).
        device: torch device (None: cuda if available).
        save_every: checkpoint every this many steps (default: --eval-every).
        stop_after: stop (checkpointed) after this many steps in this call; rerun to go on.
        keep_checkpoint: keep the last checkpoint (optimizer state) after an arm finishes.
        geometry: record each arm's geometry trajectory (arms/<arm>/geometry.parquet: PGA z,
            dispersion, PC1 readout share, RankMe on 128 builtin:domains texts) at every
            evaluation step; training is bit-identical with and without it.
        geometry_every: also record the geometry every this many steps (0: evaluation steps only).
        progress: progress bar (None: when stderr is a terminal).
        make_hooks: ``make_hooks(arm, model, arm_dir)`` → extra step hooks of each arm's
            training loop (e.g. a geometry monitor), called after each optimiser step.
    """

    command: ClassVar[str] = "train"
    table: ClassVar[str] = "train"

    model: str = field(default="smollm2-135m", metadata=_OFF)
    texts: tuple[str, ...] = field(default=DEFAULT_TEXTS, metadata=_cli(metavar="SPEC"))
    eval_texts: tuple[str, ...] = field(default=(), metadata=_cli(metavar="SPEC"))
    arms: tuple[str, ...] = field(default=("push-away",), metadata=_OFF)
    lam: float = field(default=0.01, metadata=_cli(flag="--lambda", dest="lam",
                                                   type="nonneg_float"))
    aux_mode: str = field(default="within", metadata=_cli(choices=("within", "cross")))
    layer: str = "final"
    max_tokens: int | None = field(default=None, metadata=_cli(type="int>=2"))
    method: str = field(default="lora", metadata=_OFF)
    lora_r: int = field(default=LORA_DEFAULTS["r"], metadata=_cli(type="positive_int"))
    lora_alpha: int = field(default=LORA_DEFAULTS["alpha"], metadata=_cli(type="positive_int"))
    lora_dropout: float = field(default=LORA_DEFAULTS["dropout"], metadata=_cli(type="[0,1)"))
    lora_targets: str = LORA_DEFAULTS["targets"]
    steps: int = field(default=200, metadata=_cli(type="positive_int"))
    lr: float | None = field(default=None, metadata=_cli(type="positive_float"))
    warmup: int = field(default=10, metadata=_cli(type="nonneg_int"))
    weight_decay: float = field(default=0.0, metadata=_cli(type="nonneg_float"))
    grad_clip: float = field(default=1.0, metadata=_cli(type="nonneg_float"))
    batch_size: int = field(default=8, metadata=_cli(type="positive_int"))
    seq_len: int = field(default=128, metadata=_cli(type="int>=2"))
    seed: int = field(default=0, metadata=_cli(type="seed_int"))
    eval_every: int = field(default=50, metadata=_cli(type="positive_int"))
    eval_chunks: int = field(default=64, metadata=_cli(type="positive_int"))
    eval_batch_size: int = field(default=8, metadata=_cli(type="positive_int"))
    heldout_fraction: float = field(default=0.1, metadata=_cli(type="open_fraction"))
    n_texts: int | None = field(default=None, metadata=_cli(flag="--n", dest="n",
                                                            type="positive_int"))
    dtype: str = field(default="float32", metadata=_OFF)
    bos: str = field(default="auto", metadata=_cli(choices=("auto", "on", "off")))
    skip_first: bool = False
    merge_lora: bool = False
    device: str | None = field(default=None, metadata=_OFF)
    # not in the signature
    save_every: int | None = field(default=None, metadata=_cli(type="positive_int"))
    stop_after: int | None = field(default=None, metadata=_cli(type="positive_int"))
    keep_checkpoint: bool = False
    geometry: bool = field(default=True, metadata=_cli(flag="--no-geometry", dest="geometry",
                                                       action="store_false"))
    geometry_every: int = field(default=0, metadata=_cli(type="nonneg_int"))
    progress: bool | None = field(default=None, metadata=_OFF)
    make_hooks: MakeHooks | None = field(default=None, repr=False, compare=False, metadata=_OFF)

    _UNSIGNED = ("device", "save_every", "stop_after", "keep_checkpoint", "progress",
                 "make_hooks", "geometry", "geometry_every")

    def __post_init__(self) -> None:
        self.texts = tuple(self.texts)
        self.eval_texts = tuple(self.eval_texts)
        self.arms = tuple(self.arms)
        if not self.texts:
            raise ConfigError("give at least one training corpus (--texts)")
        if len(set(self.texts)) != len(self.texts):
            raise ConfigError(f"--texts repeats a corpus: {list(self.texts)}")
        if not self.arms or any(a not in ALL_ARMS for a in self.arms) or len(set(self.arms)) != len(self.arms):
            raise ConfigError(f"arms must be distinct values of {', '.join(ALL_ARMS)}; got "
                              f"{list(self.arms)}")
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

    def settings(self) -> dict[str, Any]:
        """The run signature's input: :meth:`signed` plus the content of the model and the
        corpora (an edited corpus file or replaced weights make a different run, never a
        resumed one)."""
        from ..models.load import model_fingerprint

        return {**self.signed(), "inputs": {
            "model": model_fingerprint(self.model),
            "texts": {t: source_fingerprint(t) for t in (*self.texts, *self.eval_texts)}}}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> FinetuneResult:
        """Train every arm (resuming what is there). The run folder is ``work_dir``'s parent
        (``run_experiment`` passes ``out/.work``): the arms live in ``out/arms/<arm>``."""
        if work_dir is None:
            raise ConfigError("fine-tuning writes its models into a run folder: run it with "
                              "lmgeom.experiments.run_experiment(config, out) or "
                              "finetune(config, out)")
        out_dir = Path(work_dir).parent
        t_start_ns = fs_clock_ns(out_dir)
        try:
            return _run(self, out_dir, self.progress if progress is None else progress,
                        t_start_ns)
        finally:
            record_tree(out_dir, since_ns=t_start_ns)  # what this run wrote (--overwrite)


# ---------------------------------------------------------------------- the result
@dataclass
class FinetuneResult:
    """What a fine-tuning run produced.

    Attributes:
        table: tidy results (``train.parquet``), one row per arm × step × set × metric.
        arms: per-arm :class:`~lmgeom.experiments.finetune_arms.ArmResult`.
        finished: every arm reached ``steps``.
        out_dir: the run folder.
        report: ``report.html`` (None while unfinished; set by :func:`finetune`).
        entries: what the run adds to ``manifest.json``.
        config: the run's :class:`FinetuneConfig`.
    """

    table: Any
    arms: dict[str, ArmResult]
    finished: bool
    out_dir: Path
    report: Path | None
    entries: dict[str, Any]
    config: Any = None
    t_start_ns: int = 0

    def rows(self):
        return self.table

    def manifest(self) -> dict[str, Any]:
        return dict(self.entries)

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        """``plots/train_curves.png|svg`` and ``report.html`` once every arm is finished."""
        if not self.finished:
            return None
        from ..report.html import write_report

        cfg, out_dir = self.config, folder.path
        label = self.entries["layer"]
        figs = plot_curves(self.table, folder.plots)
        extra = []
        if figs:
            caption = (f"Held-out perplexity and token-level dispersion at layer {label} per "
                       f"arm (none / push-away / squeeze, λ = {cfg.lam:g}, {cfg.method}, "
                       f"mode {cfg.aux_mode}); same seed and data order for every arm.")
            extra.append(("Perplexity and dispersion over training steps", figs, caption))
        manifest["extra_plots"] = [str(Path(p).relative_to(out_dir)) for p in figs]
        page = write_report(out_dir, self.table, manifest, extra_figures=extra,
                            title=f"lmgeom train — {cfg.model}, {cfg.method}, "
                                  f"{'+'.join(cfg.texts)}")
        record_tree(out_dir, since_ns=self.t_start_ns)  # the plots too (--overwrite)
        return page

    def summary(self) -> str:
        """What ``lmgeom train`` prints: the before / after table, or where a stopped run is."""
        cfg = self.config
        if not self.finished:
            done = {a: (r.log[-1]["step"] if r.log else 0) for a, r in self.arms.items()}
            return (f"stopped before the end ({', '.join(f'{a}: step {s}' for a, s in done.items())}"
                    f" of {cfg.steps}); checkpoints are in {self.out_dir}/arms — rerun the same "
                    "command to continue")
        return summary_text(cfg, self.entries.get("layer", cfg.layer), self.table)

    def summary_frame(self):
        """Before / after per arm and evaluation set (a DataFrame)."""
        return summary_frame(self.table)


# ---------------------------------------------------------------------- the run
def _baseline(cfg: FinetuneConfig, lm, label: str, eval_sets, out_dir: Path,
              timings: dict[str, float]) -> dict[str, Any] | None:
    """Step 0 is the same model for every arm: with several arms, measure it once
    (``baseline.json``)."""
    if len(cfg.arms) < 2:
        return None
    base_file = out_dir / "baseline.json"
    if base_file.is_file():
        return decode_eval(json.loads(base_file.read_text()))
    t = time.perf_counter()
    baseline = evaluate(lm, eval_sets, label, batch_size=cfg.eval_batch_size,
                        skip_first=cfg.skip_first, seed=cfg.seed)
    timings["baseline_eval_s"] = time.perf_counter() - t
    write_json(base_file, encode_eval(baseline))
    return baseline


def _train_arms(cfg: FinetuneConfig, domains: list[Domain], eval_sets, out_dir: Path,
                baseline, timings: dict[str, float],
                progress: bool | None) -> dict[str, ArmResult]:
    """Every arm in turn, within the ``stop_after`` budget of this call."""
    results: dict[str, ArmResult] = {}
    budget = cfg.stop_after  # steps left in this call (over all arms)
    for arm in cfg.arms:
        t = time.perf_counter()
        results[arm] = train_arm(cfg, arm, domains, eval_sets, out_dir / "arms" / arm,
                                 baseline=baseline, on_eval=_log_eval, budget=budget,
                                 progress=progress, make_hooks=cfg.make_hooks)
        timings[f"arm_s[{arm}]"] = time.perf_counter() - t
        if not results[arm].finished:
            break
        if budget is not None:
            budget -= int(results[arm].info.get("steps_run", 0))
            if budget <= 0 and arm != cfg.arms[-1]:
                log.warning("stopped after %d steps (--stop-after) before arm %s; rerun to "
                            "continue", cfg.stop_after, cfg.arms[cfg.arms.index(arm) + 1])
                break
    return results


def _run(cfg: FinetuneConfig, out_dir: Path, progress: bool | None,
         t_start_ns: int) -> FinetuneResult:
    from ..training.losses import resolve_layer

    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    lm = load_lm(cfg)
    label = resolve_layer(lm, cfg.layer)
    domains, eval_sets = prepare_data(lm, cfg)
    timings["data_s"] = time.perf_counter() - t
    baseline = _baseline(cfg, lm, label, eval_sets, out_dir, timings)
    model_info = lm.describe()
    del lm
    results = _train_arms(cfg, domains, eval_sets, out_dir, baseline, timings, progress)
    finished = len(results) == len(cfg.arms) and all(r.finished for r in results.values())
    rows = [r for a in results.values() for r in a.rows]
    if finished:
        rows += delta_rows(cfg, label, results)
    timings["total_s"] = time.perf_counter() - t_start
    entries = {
        "models": [cfg.model],
        "texts": list(cfg.texts) + [t for t in cfg.eval_texts if t not in cfg.texts],
        "model_info": model_info, "layer": label, "arms": list(cfg.arms), "complete": finished,
        "data": [d.info for d in domains], "eval_sets": {k: len(v) for k, v in eval_sets.items()},
        "epochs": domain_schedule(domains, cfg.batch_size, cfg.seed).epochs(cfg.steps),
        "lr_used": cfg.learning_rate,
        "seeds": {"split": cfg.seed, "data_order": cfg.seed, "lora_init": cfg.seed,
                  "aux_sampling": cfg.seed, "eval_chunks": cfg.seed},
        "arm_info": {a: r.info | {"model_dir": r.model_dir, "finished": r.finished}
                     for a, r in results.items()},
        "timings": timings,
    }
    return FinetuneResult(tidy(rows), results, finished, out_dir, None, entries, cfg, t_start_ns)


def _log_eval(arm: str, step: int, ev: dict[str, dict[str, Any]]) -> None:
    for name, m in ev.items():
        log.info("%s step %d %s: perplexity %.4g, dispersion %.4f", arm, step, name,
                 m["perplexity"], m["dispersion"])


def finetune(cfg: FinetuneConfig, out: str | os.PathLike[str], *, overwrite: bool = False,
             report: bool = True) -> FinetuneResult:
    """Run every arm of ``cfg`` into the run folder ``out`` (resuming what is there):
    :func:`~lmgeom.experiments.base.run_experiment` — locked against a second run while this
    one writes, refused for a different run unless ``overwrite``."""
    run = run_experiment(cfg, out, overwrite=overwrite, progress=cfg.progress, report=report)
    run.result.report = run.report
    return run.result


def compare_arms(cfg: FinetuneConfig, out: str | os.PathLike[str], **kwargs: Any) -> FinetuneResult:
    """:func:`finetune` with the three arms none / push-away / squeeze."""
    return finetune(dataclasses.replace(cfg, arms=ARMS), out, **kwargs)


__all__ = ["ALL_ARMS", "ARMS", "DEFAULT_LR", "DEFAULT_TEXTS", "EVAL_METRICS", "LORA_DEFAULTS", "METHODS",
           "STATE_VERSION", "TRAIN_METRICS", "FinetuneConfig", "FinetuneResult", "compare_arms",
           "finetune"]
