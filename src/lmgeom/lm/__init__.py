"""Model-side measurements that need the readout: logit lens, perplexity, kNN-LM."""

from .logit_lens import LogitLensResult, logit_lens

__all__ = ["LogitLensResult", "logit_lens"]
