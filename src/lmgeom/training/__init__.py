"""Training: the push-away / squeeze losses (``losses``), the one checkpoint / resume format
(``checkpoint``), the one training loop (``loop``: :func:`train_loop`, with step hooks) and
batch scheduler (``schedule``: :class:`BatchSchedule`) that both the small-model width suite
(``suite``) and the fine-tuning use, and the suite's tokenizer (``tokenizer``).
The fine-tuning comparison that uses them is an experiment: :mod:`lmgeom.experiments.finetune`.

Imports are lazy: ``import lmgeom.training`` loads neither torch nor transformers::

    from lmgeom.training import SuiteConfig, train_suite
    manifest = train_suite("runs/suite", SuiteConfig())
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SuiteConfig": "lmgeom.training.suite_config",
    "train_suite": "lmgeom.training.suite",
    "read_suite": "lmgeom.training.suite_manifest",
    "suite_checkpoints": "lmgeom.training.suite_manifest",
    "checkpoint_steps": "lmgeom.training.suite_config",
    "model_shape": "lmgeom.training.suite_config",
    "train_tokenizer": "lmgeom.training.tokenizer",
    # push-away / squeeze losses (METHODS.md "Push-away loss") and `lmgeom train`
    "DispersionLoss": "lmgeom.training.losses",
    "PushAwayLoss": "lmgeom.training.losses",
    "SqueezeLoss": "lmgeom.training.losses",
    "AuxOutput": "lmgeom.training.losses",
    "make_aux_loss": "lmgeom.training.regularisers",
    "forward_with_aux": "lmgeom.training.losses",
    "DispersionLossMixin": "lmgeom.training.losses",
    "DispersionTrainer": "lmgeom.training.losses",
    "save_checkpoint": "lmgeom.training.checkpoint",
    "load_checkpoint": "lmgeom.training.checkpoint",
    "resume": "lmgeom.training.checkpoint",
    "train_loop": "lmgeom.training.loop",
    "optimisation_step": "lmgeom.training.loop",
    "lm_objective": "lmgeom.training.loop",
    "aux_objective": "lmgeom.training.loop",
    "BatchSchedule": "lmgeom.training.schedule",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmgeom.training' has no attribute {name!r}")
