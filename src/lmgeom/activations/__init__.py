"""Activations: the only code that runs a model forward for geometry.

``extract(model, texts)`` → :class:`Activations` (pooled states, ``(n_layers, N, d)``);
``extract_tokens(model, texts, layers=...)`` → :class:`TokenActivations` (each text's
``(T, d)`` states, streamed to disk). Both cache content-addressed shards that survive
interruption and resume.
"""

from .core import (
    POOLINGS,
    Activations,
    TokenActivations,
    encode_texts,
    extract,
    extract_tokens,
    load_activations,
)
from .export import FORMATS, export_activations, from_disk

__all__ = [
    "FORMATS",
    "POOLINGS",
    "Activations",
    "TokenActivations",
    "encode_texts",
    "export_activations",
    "extract",
    "extract_tokens",
    "from_disk",
    "load_activations",
]
