"""Training: the small-model width suite (``suite``), its tokenizer (``tokenizer``), and — added
by later work — the push-away / squeeze losses and fine-tuning.

Imports are lazy: ``import lmgeom.training`` loads neither torch nor transformers::

    from lmgeom.training import SuiteConfig, train_suite
    manifest = train_suite("runs/suite", SuiteConfig())
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SuiteConfig": "lmgeom.training.suite",
    "train_suite": "lmgeom.training.suite",
    "read_suite": "lmgeom.training.suite",
    "suite_checkpoints": "lmgeom.training.suite",
    "checkpoint_steps": "lmgeom.training.suite",
    "model_shape": "lmgeom.training.suite",
    "train_tokenizer": "lmgeom.training.tokenizer",
    # push-away / squeeze losses (METHODS.md "Push-away loss") and `lmgeom train`
    "DispersionLoss": "lmgeom.training.losses",
    "PushAwayLoss": "lmgeom.training.losses",
    "SqueezeLoss": "lmgeom.training.losses",
    "AuxOutput": "lmgeom.training.losses",
    "make_aux_loss": "lmgeom.training.losses",
    "forward_with_aux": "lmgeom.training.losses",
    "DispersionLossMixin": "lmgeom.training.losses",
    "DispersionTrainer": "lmgeom.training.losses",
    "FinetuneConfig": "lmgeom.training.finetune",
    "FinetuneResult": "lmgeom.training.finetune",
    "finetune": "lmgeom.training.finetune",
    "compare_arms": "lmgeom.training.finetune",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmgeom.training' has no attribute {name!r}")
