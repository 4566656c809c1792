"""``extract``: pooled states of every layer of one model, locally or on Ray actors, with a
per-layer summary (norms, mean cosine) of what was written."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..activations import extract
from ..engines.base import EngineConfig
from ..engines.ray_extract import extract_distributed
from .options import ModelOptions


def extract_activations(spec: str, texts, *, model_options: ModelOptions | None = None,
                        engine: EngineConfig | None = None, **params: Any):
    """:func:`lmgeom.extract` of ``spec`` on ``texts``: in this process, or with
    ``engine.engine == "ray"`` on model-holding Ray actors
    (:func:`lmgeom.engines.ray_extract.extract_distributed`) — the same activations, cache key
    and shards either way. ``params``: layers, pooling, max_length, batch_size, cache,
    n_tokens, seed, progress."""
    opts = model_options or ModelOptions()
    if engine is not None and engine.engine == "ray":
        return extract_distributed(spec, texts, engine=engine, load_kwargs=opts.load_kwargs(),
                                   **params)

    return extract(opts.load(spec), texts, **params)


def layer_summary(acts) -> list[dict[str, Any]]:
    """Per layer: mean and std of the row norms and the mean pairwise cosine (float64)."""
    rows = []
    for i, label in enumerate(acts.layers):
        X = acts.states[i].astype(np.float64)
        norms = np.linalg.norm(X, axis=1)
        U = X / np.maximum(norms[:, None], 1e-30)
        s = U.sum(0)
        n = len(U)
        mean_cos = (s @ s - n) / (n * (n - 1)) if n > 1 else float("nan")
        rows.append({"layer": label, "mean_norm": float(norms.mean()),
                     "std_norm": float(norms.std()), "mean_cosine": float(mean_cos)})
    return rows


__all__ = ["extract_activations", "layer_summary"]
