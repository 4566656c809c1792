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

The package imports one way: :mod:`.config` (the settings, the arm result; imports no sibling)
← :mod:`.data` (split, chunks, batches) ← :mod:`.evaluation` (measurements and rows) ←
:mod:`.arms` (one arm: the model, the loop's step hook, what it saves) ← :mod:`.run` (the
registered :class:`FinetuneConfig` and :func:`finetune`) ← :mod:`.compare` (seeds).
"""

from .compare import ComparisonResult, SeedComparison, compare_rows, seed_changes, t_interval
from .config import (
    ALL_ARMS,
    ARMS,
    DEFAULT_LR,
    DEFAULT_TEXTS,
    LORA_DEFAULTS,
    METHODS,
    STATE_VERSION,
    ArmResult,
    FinetuneSettings,
    MakeHooks,
)
from .data import Domain, batch_arrays, domain_schedule, prepare_data
from .evaluation import decode_eval, encode_eval, evaluate
from .run import FinetuneConfig, FinetuneResult, compare_arms, finetune

__all__ = ["ALL_ARMS", "ARMS", "DEFAULT_LR", "DEFAULT_TEXTS", "LORA_DEFAULTS", "METHODS",
           "STATE_VERSION", "ArmResult", "ComparisonResult", "Domain", "FinetuneConfig",
           "FinetuneResult", "FinetuneSettings", "MakeHooks", "SeedComparison", "batch_arrays",
           "compare_arms", "compare_rows", "decode_eval", "domain_schedule", "encode_eval",
           "evaluate", "finetune", "prepare_data", "seed_changes", "t_interval"]
