"""Activations: the only code that runs a model forward for geometry.

:func:`run_batches` (and :func:`forward_batch` for one :class:`Batch`) is the one public way to
run a model over encoded texts: padding (right or left, position ids from the attention
mask), capture at measurement points, progress, resumable shards. Everything below and
:mod:`lmgeom.lm` use it.

``extract(model, texts)`` → :class:`Activations` (pooled states, ``(n_layers, N, d)``);
``extract_tokens(model, texts, layers=...)`` → :class:`TokenActivations` (each text's
``(T, d)`` states, streamed to disk). Both cache content-addressed shards that survive
interruption and resume.

Inside, modules import one way: :mod:`.forward` and :mod:`.cache` (the cache keys) are the
leaves, :mod:`.export` writes any states object and imports no sibling, :mod:`.states` holds
the result classes and their readers, and :mod:`.core` / :mod:`.tokens` extract.
"""

from .cache import EXTRACT_VERSION, ShardCache, clear_cache
from .core import POOLINGS, ExtractionPlan, encode_texts, extract, plan_extraction
from .export import FORMATS, export_activations
from .forward import (
    Batch,
    BatchOutput,
    forward_batch,
    pad_batch,
    position_ids_from_mask,
    progress_bar,
    run_batches,
)
from .states import Activations, TokenActivations, from_disk, load_activations
from .tokens import extract_tokens

__all__ = [
    "EXTRACT_VERSION",
    "FORMATS",
    "POOLINGS",
    "Activations",
    "Batch",
    "BatchOutput",
    "ExtractionPlan",
    "ShardCache",
    "TokenActivations",
    "encode_texts",
    "export_activations",
    "extract",
    "extract_tokens",
    "clear_cache",
    "forward_batch",
    "from_disk",
    "load_activations",
    "pad_batch",
    "plan_extraction",
    "position_ids_from_mask",
    "progress_bar",
    "run_batches",
]
