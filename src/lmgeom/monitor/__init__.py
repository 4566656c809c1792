"""Geometry while a model trains (issue 29): :class:`GeometryMonitor` for any training loop
(``monitor.step(step)`` after each optimiser step) and :class:`GeometryCallback`, a
``transformers.TrainerCallback`` built on it that logs through the Trainer's ``log()`` and writes
a tidy ``geometry.parquet`` into the run folder. See :mod:`lmgeom.monitor.core` for what is
measured, what it costs and how to choose ``every``.

Imports are lazy: ``import lmgeom.monitor`` loads neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "GeometryMonitor": "lmgeom.monitor.core",
    "DEFAULT_EVERY": "lmgeom.monitor.core",
    "GeometryCallback": "lmgeom.monitor.callback",
    "preserved": "lmgeom.monitor.state",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmgeom.monitor' has no attribute {name!r}")
