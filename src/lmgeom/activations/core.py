"""Batched, hooked, pooled, cached extraction of hidden states.

Design:
* texts are tokenized once, truncated to ``max_length`` (counted and reported), sorted by
  length (less padding) and cut into batches; batch ``i`` is cache shard ``i``;
* the forward is :func:`lmgeom.activations.forward.run_batches`: right padding by default
  (``padding_side="left"`` works too: position ids come from the attention mask), pooling
  uses the attention mask, so pads never enter a pooled vector;
* hooks on the requested points pool each ``(B, T, d)`` tensor on the fly (nothing per layer
  is kept at full size), the base model runs without the readout head, and the forward stops
  after the last block any requested point needs;
* each finished shard is written atomically with a sha256 of its contents; a rerun verifies
  and reuses every valid shard, recomputing only missing or corrupt ones; a file lock makes
  two processes extracting the same key end with one valid entry.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import stable_hash
from .._testing import pause
from ..errors import ConfigError, TextsError
from ..texts import as_textset
from .cache import EXTRACT_VERSION, ShardCache
from .forward import (
    PADDING_SIDES,
    check_finite,
    dtype_name,
    length_batches,
    model_identity,
    run_batches,
)
from .states import Activations

log = logging.getLogger(__name__)

POOLINGS = ("last", "mean", "tokens")


# ---------------------------------------------------------------------- encoding
@dataclass(frozen=True)
class Encoded:
    """Token ids of a corpus after truncation, and the batch plan."""

    ids: tuple[np.ndarray, ...]
    n_truncated: int
    max_length: int

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.ids], dtype=np.int64)

    def batches(self, batch_size: int) -> list[np.ndarray]:
        """Row indices per batch, longest rows first (:func:`~.forward.length_batches`)."""
        return length_batches(self.lengths, batch_size)


def encode_texts(model, texts: Sequence[str], max_length: int, *,
                 cap_to_context: bool = True) -> Encoded:
    """Tokenize ``texts`` (with the model's special tokens), truncating to ``max_length`` and,
    unless ``cap_to_context=False``, to the model's context (its config's
    ``max_position_embeddings``): positions past it were never trained, so a longer row is cut
    there, with a warning, as ``ppl`` does."""
    if max_length < 2:
        raise ConfigError(f"max_length must be at least 2 tokens, got {max_length}")
    ctx = getattr(model, "context_length", None) if cap_to_context else None
    if isinstance(ctx, int) and max_length > ctx:
        log.warning("max_length %d exceeds the context of %s (%d tokens): texts are cut at %d",
                    max_length, getattr(model, "name", "the model"), ctx, ctx)
        max_length = ctx
    tok = model.tokenizer
    enc = tok(list(texts), add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    ids, n_trunc = [], 0
    for t, row in zip(texts, enc):
        if len(row) > max_length:
            n_trunc += 1
            row = row[:max_length]
        if len(row) == 0:
            raise TextsError(f"a text tokenizes to zero tokens: {t[:40]!r}")
        ids.append(np.asarray(row, dtype=np.int64))
    if n_trunc:
        log.info("%d of %d texts truncated to %d tokens", n_trunc, len(ids), max_length)
    return Encoded(tuple(ids), n_trunc, max_length)


# ---------------------------------------------------------------------- extract
def extract(
    model,
    texts,
    *,
    layers: str | int | Sequence[str | int] = "all",
    pooling: str = "last",
    max_length: int = 128,
    batch_size: int = 32,
    cache: bool = True,
    n_tokens: int = 2048,
    seed: int = 0,
    progress: bool | None = None,
    cache_root: str | os.PathLike[str] | None = None,
    padding_side: str = "right",
) -> Activations:
    """Pooled hidden states of ``model`` on ``texts`` at every requested point.

    Args:
        model: a :class:`~lmgeom.models.LanguageModel` or anything :func:`~lmgeom.load_model`
            accepts (a bundled name, hub id, folder, .gguf).
        texts: a :class:`~lmgeom.texts.TextSet`, a list of strings, or a text spec
            (``builtin:domains``, a file path, ``hf:...``).
        layers: ``"all"`` (``0..L`` and ``final``), labels, ints, ranges, sublayer points.
        pooling: ``last`` (last non-pad token), ``mean`` (non-pad tokens, excluding a prepended
            BOS), or ``tokens`` (a seeded uniform sample of ``n_tokens`` token positions over the
            corpus, position 0 excluded: one row per sampled token).
        max_length: tokens kept per text (longer texts are truncated; the count is reported).
        batch_size: texts per forward pass (and per cache shard).
        cache: reuse / write the on-disk cache (``$LMGEOM_CACHE/activations``).
        n_tokens, seed: sample size and seed of ``tokens`` pooling.
        progress: show a progress bar (default: when stderr is a terminal).
        cache_root: another cache folder.
        padding_side: ``"right"`` (default) or ``"left"``; both give the same states (position
            ids come from the attention mask). Left padding is part of the cache key.

    Returns:
        :class:`Activations` with ``states`` of shape ``(n_layers, N, d)``, float32.
    """
    from ..models import load_model

    t0 = time.perf_counter()
    model = load_model(model)
    ts = as_textset(texts)
    plan = plan_extraction(model, ts, layers=layers, pooling=pooling, max_length=max_length,
                           batch_size=batch_size, n_tokens=n_tokens, seed=seed,
                           padding_side=padding_side)
    store = plan.store(cache, cache_root)
    n_computed = 0
    shards: list[dict[str, np.ndarray]] = []
    pause("extract-lock")
    with store.lock():
        store.drop_stale()
        for out in run_batches(model, plan.enc, plan.points, plan.pool, plan.shard,
                               batches=plan.batches, padding_side=plan.padding_side,
                               store=store, progress=progress, desc=f"extract {model.name}"):
            if out.computed:
                n_computed += 1
                pause("extract")
            shards.append(out.tensors)
    return plan.assemble(shards, ts, timings={
        "extract_s": time.perf_counter() - t0, "batches_computed": n_computed,
        "batches_cached": len(plan.batches) - n_computed})


@dataclass
class ExtractionPlan:
    """Everything an extraction needs besides the model's forward: the encoded corpus, the
    batch plan (batch ``i`` = cache shard ``i``), the settings and the cache key. Built by
    :func:`plan_extraction`; the same plan (same key, same batches) on any process or machine,
    which is what lets a distributed extraction fill the cache a local run reads."""

    points: tuple[str, ...]
    enc: Encoded
    dtype: str
    settings: dict[str, Any]
    key: str
    sample_pos: dict[int, np.ndarray]
    bos: bool
    batches: list[np.ndarray]
    model_name: str
    model_identity: dict[str, Any]
    texts_source: str
    padding_side: str = "right"

    def store(self, cache: bool, cache_root=None) -> ShardCache:
        return ShardCache(self.key, {**self.settings, "model": self.model_name,
                                      "texts": self.texts_source}, cache,
                           Path(cache_root) if cache_root else None)

    def run_batch(self, model, bi: int, torch=None) -> dict[str, np.ndarray]:
        """The tensors of shard ``bi`` (one forward of batch ``bi``)."""
        from .forward import forward_batch, pad_batch

        batch = pad_batch(model, self.enc, self.batches[bi], padding_side=self.padding_side)
        return self.shard(batch, forward_batch(model, batch, self.points, self.pool))

    def pool(self, label: str, h, batch) -> np.ndarray:
        """The :data:`~.forward.Capture` of this plan: point ``label``'s ``(B, T, d)`` states
        pooled per row (``last`` / ``mean``) or at the sampled positions (``tokens``)."""
        return _pool(h, batch, self.settings["pooling"], self.bos, self.sample_pos)

    def shard(self, batch, pooled: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The :data:`~.forward.Finish` of this plan: the cache shard of one batch."""
        for p in self.points:
            check_finite(p, pooled[p], self.dtype)
        out = {"states": np.stack([pooled[p] for p in self.points])}
        if self.settings["pooling"] == "tokens":
            _, cols, owners = _sampled(batch, self.sample_pos)
            out["row_text"] = np.asarray(owners, dtype=np.int64)
            out["row_pos"] = np.asarray(cols, dtype=np.int64)
        else:
            out["index"] = np.asarray(batch.index, dtype=np.int64)
        return out

    def assemble(self, shards: Sequence[dict[str, np.ndarray]], ts,
                 timings: dict[str, float] | None = None) -> Activations:
        pooling = self.settings["pooling"]
        states, row_text, row_pos = _assemble(list(shards), len(ts), pooling)
        row_token = None
        if row_text is not None:
            row_token = np.array([self.enc.ids[t][p] for t, p in zip(row_text, row_pos)],
                                 dtype=np.int64)
        return Activations(
            states=states, layers=self.points, model=self.model_name,
            model_identity=self.model_identity, texts_hash=ts.hash, text_ids=ts.ids,
            labels=ts.labels, settings=self.settings, n_tokens=self.enc.lengths,
            n_truncated=self.enc.n_truncated, row_text=row_text, row_pos=row_pos, key=self.key,
            timings=dict(timings or {}), row_token=row_token,
        )


def plan_extraction(model, ts, *, layers="all", pooling: str = "last", max_length: int = 128,
                    batch_size: int = 32, n_tokens: int = 2048, seed: int = 0,
                    padding_side: str = "right") -> ExtractionPlan:
    """Validate the settings, tokenize ``ts`` and fix the batches and the cache key."""
    if len(ts) == 0:
        raise TextsError("the corpus is empty: nothing to extract")
    if pooling not in POOLINGS:
        raise ConfigError(f"unknown pooling {pooling!r} (use one of {', '.join(POOLINGS)})")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if padding_side not in PADDING_SIDES:
        raise ConfigError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    points = model.resolve_points(layers)
    enc = encode_texts(model, ts.texts, max_length)
    dtype = dtype_name(model)
    settings = {
        "version": EXTRACT_VERSION,
        "pooling": pooling,
        "max_length": enc.max_length,
        "batch_size": batch_size,
        "dtype": dtype,
        "layers": list(points),
    }
    if pooling == "tokens":
        settings.update({"n_tokens": n_tokens, "seed": seed})
    if padding_side != "right":  # right padding keeps the keys it always had
        settings["padding_side"] = padding_side
    key = stable_hash({"model": model_identity(model), "texts": ts.hash, **settings})[:32]
    sample_pos: dict[int, np.ndarray] = {}
    if pooling == "tokens":
        sample_pos = _sample_positions(enc.lengths, n_tokens, seed)
    return ExtractionPlan(points=tuple(points), enc=enc, dtype=dtype, settings=settings, key=key,
                          sample_pos=sample_pos, bos=model.bos_prepended,
                          batches=enc.batches(batch_size), model_name=model.name,
                          model_identity=dict(model.identity), texts_source=ts.source,
                          padding_side=padding_side)


def _sample_positions(lengths: np.ndarray, n_tokens: int, seed: int) -> dict[int, np.ndarray]:
    """Seeded uniform sample of (text, position >= 1) pairs over the corpus."""
    avail = np.maximum(lengths - 1, 0)
    total = int(avail.sum())
    if total == 0:
        raise TextsError("every text is a single token: no positions to sample for tokens pooling")
    if n_tokens < 1:
        raise ConfigError(f"n_tokens must be >= 1, got {n_tokens}")
    rng = np.random.default_rng(seed)
    flat = np.sort(rng.choice(total, size=min(n_tokens, total), replace=False))
    starts = np.concatenate([[0], np.cumsum(avail)[:-1]])
    text = np.searchsorted(np.cumsum(avail), flat, side="right")
    pos = flat - starts[text] + 1
    out: dict[int, np.ndarray] = {}
    for t in np.unique(text):
        out[int(t)] = pos[text == t]
    return out


def _sampled(batch, sample_pos) -> tuple[list[int], list[int], list[int]]:
    """(batch row, text position, text index) of every sampled token of ``batch``."""
    rows, cols, owners = [], [], []
    for j, t in enumerate(batch.index):
        for p in sample_pos.get(int(t), ()):
            rows.append(j)
            cols.append(int(p))
            owners.append(int(t))
    return rows, cols, owners


def _pool(h, batch, pooling: str, bos: bool, sample_pos) -> np.ndarray:
    """Pool one point's ``(B, T, d)`` states of ``batch``: ``(B, d)`` (``last``/``mean``) or
    ``(n_sampled, d)`` (``tokens``), float32 numpy. Derived per-batch tensors are memoised in
    ``batch.scratch``."""
    import torch

    sc = batch.scratch
    if pooling == "last":
        if "last" not in sc:
            sc["last"] = (torch.arange(h.shape[0], device=h.device), batch.last)
        v = h[sc["last"]]
    elif pooling == "mean":
        if "w" not in sc:
            lengths = batch.lengths
            w = batch.attention_mask.clone()
            if bos:  # leave out the BOS (unless it is the only token)
                r = torch.arange(w.shape[0], device=w.device)
                first = batch.first
                w[r, first] = torch.where(lengths > 1, 0, w[r, first])
            w = w.to(torch.float32)
            sc["w"], sc["denom"] = w, w.sum(1, keepdim=True)
        x = h.to(torch.float32)
        if batch.padding_side == "left":  # a pad row that attends to nothing may be NaN
            x = x.masked_fill(~batch.valid[..., None], 0.0)
        v = (x * sc["w"][..., None]).sum(1) / sc["denom"]
    else:
        if "rc" not in sc:
            rows, cols, _ = _sampled(batch, sample_pos)
            dev = batch.input_ids.device
            rows_t = torch.tensor(rows, dtype=torch.long, device=dev)
            cols_t = torch.tensor(cols, dtype=torch.long, device=dev)
            sc["rc"] = (rows_t, batch.first[rows_t] + cols_t)
        v = h[sc["rc"]]
    return v.to(torch.float32).cpu().numpy()


def _assemble(shards, n_texts: int, pooling: str):
    if pooling == "tokens":
        row_text = np.concatenate([s["row_text"] for s in shards])
        row_pos = np.concatenate([s["row_pos"] for s in shards])
        states = np.concatenate([s["states"] for s in shards], axis=1)
        order = np.lexsort((row_pos, row_text))
        return np.ascontiguousarray(states[:, order]), row_text[order], row_pos[order]
    first = shards[0]["states"]
    states = np.empty((first.shape[0], n_texts, first.shape[2]), dtype=np.float32)
    for s in shards:
        states[:, s["index"]] = s["states"]
    return states, None, None


