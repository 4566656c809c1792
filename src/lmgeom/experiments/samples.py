"""Per-item outputs (``--log-samples``): one row per text, the lm-evaluation-harness
``--log_samples`` idea for representation geometry.

Columns of ``samples.parquet`` written by ``analyze``:

::

    ``model``, ``revision``        as in the results table
    ``id``, ``label``              the text's id and label (``""`` when unlabeled)
    ``n_tokens``                   tokens the model saw (after truncation to ``max_length``)
    ``n_tokens_full``              tokens of the whole text
    ``truncated``                  whether the text was cut to ``max_length``
    ``nll``                        mean NLL (nats / token) of tokens 2..T of what the model saw
    ``perplexity``                 ``exp(nll)``
    ``norm@<layer>``               L2 norm of the text's pooled state at that layer
    ``readout_share@<layer>``      share of the text's *centred* pooled state inside the readout
                                   subspace, ``‖V_kᵀ (x − x̄)‖² / ‖x − x̄‖²`` (random baseline k/d): the
                                   per-text view of what PGA measures over pairs
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..lm import perplexity


def text_facts(model, texts, max_length: int | None) -> dict[str, object]:
    """The columns every per-item table starts with: id, label, n_tokens (seen), n_tokens_full,
    truncated (``max_length=None``: nothing is cut)."""
    full = model.tokenizer(list(texts.texts), add_special_tokens=True, truncation=False,
                           verbose=False)["input_ids"]
    n_full = np.array([len(x) for x in full], dtype=np.int64)
    seen = n_full if max_length is None else np.minimum(n_full, max_length)
    return {"id": [str(x) for x in texts.ids],
            "label": list(texts.labels) if texts.labels is not None else [""] * len(texts),
            "n_tokens": seen, "n_tokens_full": n_full,
            "truncated": n_full > max_length if max_length is not None else
            np.zeros(len(n_full), dtype=bool)}


def perplexity_samples(model, texts, result) -> pd.DataFrame:
    """One row per text of a :class:`~lmgeom.lm.perplexity.PerplexityResult`: the facts of
    :func:`text_facts`, ``n_predicted``, ``nll`` (mean, nats / token) and ``perplexity``."""
    stride = result.settings.get("stride")
    facts = text_facts(model, texts, None if stride else int(result.settings["max_length"]))
    n_pred = np.array([t.n_predicted for t in result], dtype=np.int64)
    nll = np.array([t.nll_sum / t.n_predicted if t.n_predicted else math.nan for t in result])
    return pd.DataFrame({"model": model.name, **facts, "n_predicted": n_pred, "nll": nll,
                         "perplexity": np.exp(nll)})


def sample_rows(model, texts, acts, basis: np.ndarray, *, revision: str = "",
                label: str | None = None, batch_size: int = 8,
                progress: bool | None = None) -> pd.DataFrame:
    """One row per text of ``acts`` (``last`` or ``mean`` pooling) — see the module docstring.

    Args:
        model: the loaded model the activations come from.
        texts: the :class:`~lmgeom.texts.TextSet` the activations were extracted from.
        acts: its :class:`~lmgeom.activations.Activations`.
        basis: ``(d, k)`` orthonormal readout basis.
        revision, label: the ``revision`` and ``model`` columns.
        batch_size: texts per forward pass of the perplexity.
    """
    if acts.row_text is not None:
        raise ConfigError("--log-samples needs one vector per text (pooling last or mean), not "
                          "pooling tokens")
    if tuple(acts.text_ids) != tuple(texts.ids):
        raise ConfigError("the activations belong to another text set than the one given")
    max_length = int(acts.settings["max_length"])
    facts = text_facts(model, texts, max_length)
    ppl = perplexity(model, texts, max_length=max_length, batch_size=batch_size,
                     progress=progress)
    nll = np.array([t.nll_sum / t.n_predicted if t.n_predicted else math.nan for t in ppl],
                   dtype=np.float64)
    data: dict[str, object] = {
        "model": label if label is not None else model.name,
        "revision": revision,
        **facts,
        "nll": nll,
        "perplexity": np.exp(nll),
    }
    B = np.asarray(basis, dtype=np.float64)
    for i, layer in enumerate(acts.layers):
        X = np.asarray(acts.states[i], dtype=np.float64)
        data[f"norm@{layer}"] = np.linalg.norm(X, axis=1)
        Xc = X - X.mean(axis=0, keepdims=True)
        tot = np.einsum("ij,ij->i", Xc, Xc)
        P = Xc @ B
        with np.errstate(invalid="ignore", divide="ignore"):
            data[f"readout_share@{layer}"] = np.where(tot > 0, np.einsum("ij,ij->i", P, P) / tot,
                                                      np.nan)
    return pd.DataFrame(data)


__all__ = ["perplexity_samples", "sample_rows", "text_facts"]
