"""Activations: the only code that runs a model forward for geometry.

:func:`run_batches` (and :func:`forward_batch` for one :class:`Batch`) is the one public way to
run a model over encoded texts: padding (right or left, position ids from the attention
mask), capture at measurement points, progress, resumable shards. Everything below and
:mod:`lmgeom.lm` use it.

``extract(model, texts)`` → :class:`Activations` (pooled states, ``(n_layers, N, d)``);
``extract_tokens(model, texts, layers=...)`` → :class:`TokenActivations` (each text's
``(T, d)`` states, streamed to disk). Both cache content-addressed shards that survive
interruption and resume.
"""

from .core import POOLINGS, Activations, encode_texts, extract, load_activations
from .export import FORMATS, export_activations, from_disk
from .forward import (
    Batch,
    BatchOutput,
    forward_batch,
    pad_batch,
    position_ids_from_mask,
    run_batches,
)
from .tokens import TokenActivations, extract_tokens

__all__ = [
    "FORMATS",
    "POOLINGS",
    "Activations",
    "Batch",
    "BatchOutput",
    "TokenActivations",
    "encode_texts",
    "export_activations",
    "extract",
    "extract_tokens",
    "forward_batch",
    "from_disk",
    "load_activations",
    "pad_batch",
    "position_ids_from_mask",
    "run_batches",
]
