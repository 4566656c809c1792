"""Model adapter: the only code that knows architectures.

``load_model(spec)`` returns a :class:`LanguageModel`, which exposes the blocks, the final norm,
``W_U`` (with bias / soft-cap), the tokenizer, and the named measurement points
(``0..L``, ``final``, ``ℓ.attn_out``, ``ℓ.ffn_in``, ``ℓ.ffn_out``).

Imports are lazy: ``import lmgeom.models`` (and :mod:`lmgeom.models.bundled`, which the CLI
reads for ``lmgeom --help`` and ``lmgeom models``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .bundled import BUNDLED, DEFAULT_MODEL, BundledModel

if TYPE_CHECKING:  # pragma: no cover
    from .adapter import SUBLAYER_POINTS, LanguageModel, StopForward
    from .load import DEFAULT_DTYPE, load_model, resolve_dtype
    from .registry import ARCHS, ArchSpec

#: public name -> the module that defines it (imported on first use: those import torch)
_LAZY = {
    "SUBLAYER_POINTS": "lmgeom.models.adapter",
    "LanguageModel": "lmgeom.models.adapter",
    "StopForward": "lmgeom.models.adapter",
    "DEFAULT_DTYPE": "lmgeom.models.load",
    "load_model": "lmgeom.models.load",
    "resolve_dtype": "lmgeom.models.load",
    "ARCHS": "lmgeom.models.registry",
    "ArchSpec": "lmgeom.models.registry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmgeom.models' has no attribute {name!r}")


__all__ = [
    "ARCHS",
    "BUNDLED",
    "DEFAULT_DTYPE",
    "DEFAULT_MODEL",
    "SUBLAYER_POINTS",
    "ArchSpec",
    "BundledModel",
    "LanguageModel",
    "StopForward",
    "load_model",
    "resolve_dtype",
]
