"""Model-side measurements that need the readout: logit lens, perplexity, kNN-LM."""

from .logit_lens import LogitLensResult, logit_lens
from .perplexity import (
    ForwardResult,
    PerplexityResult,
    TextPerplexity,
    TokenNLLWriter,
    default_position_chunk,
    forward_chunks,
    model_context,
    perplexity,
    sliding_windows,
)

__all__ = [
    "ForwardResult",
    "LogitLensResult",
    "PerplexityResult",
    "TextPerplexity",
    "TokenNLLWriter",
    "default_position_chunk",
    "forward_chunks",
    "logit_lens",
    "model_context",
    "perplexity",
    "sliding_windows",
]

# kNN-LM (FAISS is imported on first use, not here)
from . import knnlm
from .knnlm import Datastore, IndexSpec, KnnEval, build_datastores

__all__ += ["Datastore", "IndexSpec", "KnnEval", "build_datastores", "knnlm"]
