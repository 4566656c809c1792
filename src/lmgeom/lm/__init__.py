"""Model-side measurements that need the readout: logit lens, perplexity, kNN-LM."""

from .logit_lens import LogitLensResult, logit_lens
from .perplexity import (
    ForwardResult,
    PerplexityResult,
    TextPerplexity,
    default_position_chunk,
    forward_chunks,
    perplexity,
    sliding_windows,
)

__all__ = [
    "ForwardResult",
    "LogitLensResult",
    "PerplexityResult",
    "TextPerplexity",
    "default_position_chunk",
    "forward_chunks",
    "logit_lens",
    "perplexity",
    "sliding_windows",
]
