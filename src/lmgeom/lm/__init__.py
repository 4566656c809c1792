"""Model-side measurements that need the readout: logit lens, perplexity, kNN-LM."""

from .logit_lens import LogitLensResult, logit_lens
from .perplexity import (
    PerplexityResult,
    TextPerplexity,
    TokenNLLWriter,
    perplexity,
    sliding_windows,
)
from .scoring import ForwardResult, default_position_chunk, forward_chunks, model_context

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
from .datastore import Datastore, IndexSpec, build_datastores
from .knnlm import KnnEval

__all__ += ["Datastore", "IndexSpec", "KnnEval", "build_datastores", "knnlm"]
