"""Model adapter: the only code that knows architectures.

``load_model(spec)`` returns a :class:`LanguageModel`, which exposes the blocks, the final norm,
``W_U`` (with bias / soft-cap), the tokenizer, and the named measurement points
(``0..L``, ``final``, ``ℓ.attn_out``, ``ℓ.ffn_in``, ``ℓ.ffn_out``).
"""

from .adapter import SUBLAYER_POINTS, LanguageModel, StopForward
from .bundled import BUNDLED, DEFAULT_MODEL, BundledModel
from .load import DEFAULT_DTYPE, load_model, resolve_dtype
from .registry import ARCHS, ArchSpec

__all__ = [
    "ARCHS",
    "ArchSpec",
    "BUNDLED",
    "BundledModel",
    "DEFAULT_DTYPE",
    "DEFAULT_MODEL",
    "LanguageModel",
    "StopForward",
    "SUBLAYER_POINTS",
    "load_model",
    "resolve_dtype",
]
