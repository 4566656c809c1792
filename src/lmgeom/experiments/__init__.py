"""The papers' analyses, composed from texts, models, activations and metrics.

Every experiment is a config dataclass → ``run()`` → a result with ``rows()`` (the tidy table,
:data:`lmgeom.results.table.COLUMNS`), ``manifest()``, ``figures()`` and ``summary()``
(:mod:`lmgeom.experiments.base`); :func:`run_experiment` writes the same run folder the CLI
writes::

    from lmgeom.experiments import AnalyzeConfig, run_experiment
    run = run_experiment(AnalyzeConfig(models=("smollm2-135m",)), "runs/demo")

Imports are lazy: ``import lmgeom.experiments`` imports no experiment module.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_experiment": "lmgeom.experiments.base",
    "experiment_for": "lmgeom.experiments.base",
    "registered": "lmgeom.experiments.base",
    "Run": "lmgeom.experiments.base",
    "ModelOptions": "lmgeom.experiments.options",
    "TextOptions": "lmgeom.experiments.options",
    "LayerSweepConfig": "lmgeom.experiments.layer_sweep",
    "AnalyzeConfig": "lmgeom.experiments.analyze",
    "AnalyzeResult": "lmgeom.experiments.analyze",
    "analyze_model": "lmgeom.experiments.analyze",
    "SweepConfig": "lmgeom.experiments.sweep",
    "SweepResult": "lmgeom.experiments.sweep",
    "FinetuneConfig": "lmgeom.experiments.finetune",
    "FinetuneResult": "lmgeom.experiments.finetune",
    "finetune": "lmgeom.experiments.finetune",
    "compare_arms": "lmgeom.experiments.finetune",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmgeom.experiments' has no attribute {name!r}")
