"""Token-level states: every non-pad token of every text at chosen points, streamed to disk in
content-addressed shards (:func:`extract_tokens` -> :class:`TokenActivations`). The forward,
the cache and its resumption are those of :func:`lmgeom.activations.core.extract`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from .._io import stable_hash
from ..errors import ConfigError, TextsError
from ..texts import as_textset
from .core import EXTRACT_VERSION, ShardCache, encode_texts
from .forward import check_finite, dtype_name, model_identity, run_batches

__all__ = ["TokenActivations", "extract_tokens"]


@dataclass
class TokenActivations:
    """Each text's ``(T_i, d)`` states at chosen points, stored on disk in shards.

    Nothing is held in memory: :meth:`get` and :meth:`iter_layer` read one shard at a time
    (safetensors, memory-mapped).
    """

    folder: Path
    layers: tuple[str, ...]
    n_texts: int
    n_tokens: np.ndarray
    model: str
    settings: dict[str, Any]
    _where: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)
    text_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] | None = None
    texts_hash: str = ""
    token_ids: tuple[np.ndarray, ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return self.n_texts

    def _shard(self, s: int) -> Path:
        return self.folder / f"shard-{s:05d}.safetensors"

    def get(self, i: int, layer: str) -> np.ndarray:
        """``(T_i, d)`` float32 states of text ``i`` at ``layer``."""
        if layer not in self.layers:
            raise ConfigError(f"layer {layer!r} was not extracted (have: {', '.join(self.layers)})")
        s, j = self._where[i]
        with safe_open(str(self._shard(s)), framework="np") as fh:
            off = fh.get_tensor("offsets")
            x = fh.get_slice(f"h:{layer}")[int(off[j]) : int(off[j + 1])]
        return np.asarray(x)

    def iter_layer(self, layer: str):
        """Yield ``(text_index, (T_i, d) array)`` for every text at ``layer``."""
        for i in range(self.n_texts):
            yield i, self.get(i, layer)

    def export(self, out: str | os.PathLike[str], *, format: str = "parquet",
               push_to_hub: str | None = None) -> list[Path]:
        """Write one row per token as ``parquet`` / ``hf``; see :func:`export_activations`."""
        from .export import export_activations  # export imports this module

        return export_activations(self, out, format=format, push_to_hub=push_to_hub)

    def to_dataset(self):
        """A ``datasets.Dataset`` with one row per token (text id, position, token id)."""
        from .export import to_dataset  # export imports this module

        return to_dataset(self)


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
    settings = {"version": EXTRACT_VERSION, "pooling": "none", "max_length": max_length,
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
