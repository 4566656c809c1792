"""The settings of a fine-tuning run and the result of one arm: the leaf of
:mod:`lmgeom.experiments.finetune` (it imports none of its siblings).

:class:`FinetuneSettings` holds every field, the checks and the run signature;
:class:`~lmgeom.experiments.finetune.FinetuneConfig` (the registered experiment, in
:mod:`.run`) adds only ``run``, so the data, evaluation and arm modules type against this one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...errors import ConfigError
from ...texts import source_fingerprint
from ...training.checkpoint import CHECKPOINT_VERSION
from ...training.loop import Hook

ARMS = ("none", "push-away", "squeeze")
#: every regulariser an arm may train with (the names of
#: :data:`lmgeom.training.regularisers.REGULARISERS`, kept here so importing this module loads
#: no torch; tests/e2e/test_train_geometry.py checks they agree)
ALL_ARMS = (*ARMS, "infonce-l2", "infonce-cos", "hinge-cos", "covariance")
METHODS = ("lora", "full")
DEFAULT_LR = {"lora": 5e-4, "full": 5e-5}
#: LoRA defaults (documented in docs/train.md)
LORA_DEFAULTS = {"r": 8, "alpha": 16, "dropout": 0.0, "targets": "all-linear"}
STATE_VERSION = CHECKPOINT_VERSION  # part of the run signature
DEFAULT_TEXTS = ("builtin:wiki",)


def _cli(**spec: Any) -> dict[str, Any]:
    """How a field appears as a ``lmgeom train`` option (read by
    ``lmgeom.commands.options.add_options``; types by name, see its ``TYPES``)."""
    return {"cli": spec}


_OFF = _cli(cli=False)  # set by the command some other way (model options, --compare, --full)


#: ``make_hooks(arm, model, arm_dir) -> [hook, ...]``: extra step hooks of one arm
MakeHooks = Callable[[str, Any, Path], Sequence[Hook]]
# ---------------------------------------------------------------------- config
@dataclass
class FinetuneSettings:
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
        if self.method == "full" and self.merge_lora:
            raise ConfigError("--merge-lora merges LoRA adapters into the model, but --full "
                              "trains every weight and has no adapters to merge; drop "
                              "--merge-lora, or train LoRA (leave out --full)")
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
        from ...models.load import model_fingerprint

        return {**self.signed(), "inputs": {
            "model": model_fingerprint(self.model),
            "texts": {t: source_fingerprint(t) for t in (*self.texts, *self.eval_texts)}}}


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


