"""lmgeom — representation geometry of causal language models, layer by layer.

Public API (imports are lazy: ``import lmgeom`` does not import torch)::

    import lmgeom
    model = lmgeom.load_model("smollm2-135m")
    texts = lmgeom.load_texts("builtin:domains", limit=256)
    acts = lmgeom.extract(model, texts, layers="all", pooling="last")
    acts.states.shape            # (n_layers, N, d)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load_model": "lmgeom.models",
    "LanguageModel": "lmgeom.models",
    "load_texts": "lmgeom.texts",
    "TextSet": "lmgeom.texts",
    "extract": "lmgeom.activations",
    "extract_tokens": "lmgeom.activations",
    "Activations": "lmgeom.activations",
    "TokenActivations": "lmgeom.activations",
    "load_activations": "lmgeom.activations",
    "export_activations": "lmgeom.activations",
    "metrics": "lmgeom.metrics",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        mod = importlib.import_module(_LAZY[name])
        return mod if name == "metrics" else getattr(mod, name)
    raise AttributeError(f"module 'lmgeom' has no attribute {name!r}")


def __dir__() -> list[str]:
    """``dir(lmgeom)`` lists the lazy public API too (and tab completion finds it)."""
    return sorted({*globals(), *__all__})
