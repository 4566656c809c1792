"""Token-level states: every non-pad token of every text at chosen points, streamed to disk in
content-addressed shards (:func:`extract_tokens` -> :class:`TokenActivations`). The forward,
the cache and its resumption are those of :func:`lmgeom.activations.core.extract`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._io import stable_hash
from ..errors import TextsError
from ..texts import as_textset
from .cache import EXTRACT_VERSION, ShardCache
from .core import encode_texts
from .forward import check_finite, dtype_name, model_identity, run_batches
from .states import TokenActivations

__all__ = ["extract_tokens"]


def extract_tokens(
    model,
    texts,
    *,
    layers: str | int | Sequence[str | int] = "final",
    max_length: int = 512,
    batch_size: int = 8,
    cache: bool = True,
    progress: bool | None = None,
    cache_root: str | os.PathLike[str] | None = None,
) -> TokenActivations:
    """Token-level states: every non-pad token of every text at the chosen points.

    Streams shard by shard to the cache folder (one safetensors per batch holding, per point,
    the concatenated ``(sum T_i, d)`` states and the per-text offsets), so memory stays at one
    batch. Resumes like :func:`extract`.
    """
    import torch

    from ..models import load_model  # torch

    model = load_model(model)
    ts = as_textset(texts)
    if len(ts) == 0:
        raise TextsError("the corpus is empty: nothing to extract")
    points = model.resolve_points(layers)
    enc = encode_texts(model, ts.texts, max_length)
    dtype = dtype_name(model)
    settings = {"version": EXTRACT_VERSION, "pooling": "none", "max_length": enc.max_length,
                "batch_size": batch_size, "dtype": dtype, "layers": list(points)}
    key = "tok-" + stable_hash({"model": model_identity(model), "texts": ts.hash, **settings})[:28]
    if not cache:
        root = Path(tempfile.mkdtemp(prefix="lmgeom-tokens-"))
    else:
        root = Path(cache_root) if cache_root else None
    store = ShardCache(key, {**settings, "model": model.name}, True, root)
    batches = enc.batches(batch_size)
    where = {int(t): (bi, j) for bi, idx in enumerate(batches) for j, t in enumerate(idx)}

    def tokens(label, h, batch):
        """Every real token's state of each row, concatenated: ``(sum T_i, d)``."""
        if "span" not in batch.scratch:
            first = batch.first.cpu().numpy()
            batch.scratch["span"] = [(int(a), int(a + n)) for a, n in
                                     zip(first, batch.lengths.cpu().numpy())]
        hs = h.to(torch.float32).cpu().numpy()
        return np.concatenate([hs[j, a:b] for j, (a, b) in enumerate(batch.scratch["span"])])

    def shard(batch, got):
        for p in points:
            check_finite(p, got[p], dtype)
        lens = batch.lengths.cpu().numpy()
        out = {f"h:{p}": got[p] for p in points}
        out["offsets"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        out["index"] = np.asarray(batch.index, dtype=np.int64)
        return out

    with store.lock():
        store.drop_stale()
        for _ in run_batches(model, enc, points, tokens, shard, batches=batches,
                             store=store, progress=progress, desc=f"tokens {model.name}"):
            pass
    return TokenActivations(
        folder=store.dir, layers=points, n_texts=len(ts), n_tokens=enc.lengths,
        model=model.name, settings=settings, _where=where, text_ids=ts.ids, labels=ts.labels,
        texts_hash=ts.hash, token_ids=enc.ids,
    )
