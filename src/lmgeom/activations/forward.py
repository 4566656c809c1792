"""The forward primitive: the one public way lmgeom runs a model over encoded texts.

Every measurement that needs a forward pass (pooled extraction, token-level extraction,
perplexity and its reductions, the kNN-LM datastores) calls :func:`run_batches` (or, for one
batch, :func:`forward_batch`), in the spirit of TransformerLens' ``run_with_cache``: the caller
says which measurement points to capture and what to keep of each captured ``(B, T, d)``
tensor; this module does the rest:

* **padding** (:func:`pad_batch`): rows are padded to the batch's longest row on the right
  (default) or on the left; the attention mask marks the real tokens;
* **position ids from the mask** (:func:`position_ids_from_mask`): ``cumsum(mask) - 1``,
  clipped at 0, are passed to the model, so a left-padded row gets positions ``0..n-1`` on its
  real tokens exactly as when it runs alone (with ``0..T-1`` a left-padded row would be shifted
  by its padding: the silent error nnsight PR #673 describes). With right padding they equal
  ``0..n-1`` on the real tokens too, so nothing changes there;
* **capture at measurement points** (:meth:`LanguageModel.capture`): ``capture(label, h,
  batch)`` is called inside the hook, so nothing per layer is kept at full size unless the
  caller keeps it; with ``stop_early`` the forward stops after the last block a point needs;
* **progress** (:func:`progress_bar`), ``torch.no_grad``, a check that every hook fired, and
  optional **resumable shards** (``store``: a :class:`~lmgeom.activations.cache.ShardCache`):
  a batch whose shard exists is not run again.

Pads never enter a result: under the causal mask a real token never attends to a pad (right
padding: pads come after it; left padding: the mask hides them), and every pooling, reduction
and scoring uses :attr:`Batch.valid`.
"""

from __future__ import annotations

import functools
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .._io import stable_hash
from ..errors import ConfigError, DataError

PADDING_SIDES = ("right", "left")

Capture = Callable[[str, Any, "Batch"], Any]
"""``capture(label, h, batch) -> value``: ``h`` is point ``label``'s ``(B, T, d)`` tensor (model
dtype) of the forward of ``batch``; the value (anything) is what the batch keeps of it."""

Finish = Callable[["Batch", dict], dict]
"""``finish(batch, captured) -> {name: array}``: turns a batch's captured values (``label ->
value``) into its output arrays (the shard written to ``store``); runs under ``no_grad``."""


# ---------------------------------------------------------------------- small public helpers
def progress_bar(total: int, desc: str, progress: bool | None):
    """A tqdm bar of ``total`` batches; ``progress=None``: shown when stderr is a terminal and
    ``LMGEOM_QUIET`` is not set."""
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("LMGEOM_QUIET")
    return tqdm(total=total, desc=desc, unit="batch", disable=not progress, leave=False)


def check_finite(label: str, arr: np.ndarray, dtype: str) -> None:
    """Raise :class:`DataError` when ``arr`` (states of point ``label``) has NaN or inf."""
    bad = ~np.isfinite(arr)
    if bad.any():
        hint = (" (fp16 overflow is a common cause: use --dtype float32 or bfloat16)"
                if "16" in dtype else "")
        raise DataError(f"layer {label}: {int(bad.sum())} non-finite values in the hidden "
                        f"states{hint}")


#: config fields that name where or with what a model was saved, not what it computes
_CONFIG_VOLATILE = frozenset({"_name_or_path", "_commit_hash", "transformers_version",
                              "name_or_path"})


def config_fingerprint(model) -> str:
    """Hash of the model's config as loaded (layers, widths, norms, rope, special token ids,
    ...): two folders with the same weights and different ``config.json`` compute different
    states, so they must never share a cache entry. Paths and the saving library's version are
    left out."""
    config = getattr(getattr(model, "hf_model", None), "config", None)
    if config is None:
        return ""
    d = {k: v for k, v in config.to_dict().items() if k not in _CONFIG_VOLATILE}
    return stable_hash(d)[:16]


@functools.lru_cache(maxsize=1)
def code_versions() -> dict[str, str]:
    """The versions of the code that computes a cached result: lmgeom, transformers, torch. An
    upgrade of any of them recomputes instead of reusing numbers an older code produced."""
    out = {}
    for pkg in ("lmgeom", "transformers", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
            out[pkg] = "unknown"
    return out


def model_identity(model) -> dict[str, Any]:
    """What identifies a model's computation in a cache key: its identity without name/path
    (weights hash, resolved revision, tokenizer), the content of its config, and the versions
    of the code that runs it."""
    ident = {k: v for k, v in model.identity.items() if k not in ("name", "path")}
    ident["model_type"] = model.model_type
    ident["config_sha256"] = config_fingerprint(model)
    ident["code"] = code_versions()
    return ident


def dtype_name(model) -> str:
    """``float32``, ``bfloat16``, ... of the model's parameters."""
    return str(model.dtype).replace("torch.", "")


def position_ids_from_mask(attention_mask):
    """Position ids of a padded batch: ``cumsum(mask) - 1`` clipped at 0.

    Args:
        attention_mask: ``(B, T)`` int tensor, 1 on real tokens.

    Returns:
        ``(B, T)`` int64 tensor: ``0..n_b-1`` on the real tokens of row ``b`` whatever the
        padding side; pads get 0 (left) or ``n_b - 1`` (right), never read.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# ---------------------------------------------------------------------- batches
@dataclass
class Batch:
    """One padded batch of token rows, as fed to the model.

    Attributes:
        index: ``(B,)`` int64, which input rows are in the batch (in batch order).
        input_ids: ``(B, T)`` int64 tensor on the model's device (pads: the pad id).
        attention_mask: ``(B, T)`` int64 tensor, 1 on real tokens.
        position_ids: ``(B, T)`` int64 tensor (:func:`position_ids_from_mask`).
        padding_side: ``"right"`` or ``"left"``.
        scratch: per-batch values a capture derives once and reuses for every point.
    """

    index: np.ndarray
    input_ids: Any
    attention_mask: Any
    position_ids: Any
    padding_side: str = "right"
    scratch: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def valid(self):
        """``(B, T)`` bool tensor of the real tokens."""
        return self.attention_mask.bool()

    @property
    def lengths(self):
        """``(B,)`` int64 tensor, real tokens per row."""
        return self.attention_mask.sum(1)

    @property
    def first(self):
        """``(B,)`` column of each row's first real token (0 with right padding)."""
        T = self.input_ids.shape[1]
        return (T - self.lengths) if self.padding_side == "left" else self.lengths * 0

    @property
    def last(self):
        """``(B,)`` column of each row's last real token."""
        if self.padding_side == "left":
            return self.lengths * 0 + (self.input_ids.shape[1] - 1)
        return self.lengths - 1

    def column(self, rows, positions):
        """Columns of ``positions`` (within the unpadded rows ``rows``): ``first + position``."""
        return self.first[rows] + positions


def _as_rows(rows) -> Sequence[np.ndarray]:
    ids = getattr(rows, "ids", None)  # an Encoded corpus
    return ids if ids is not None else rows


def pad_batch(model, rows, idx, *, padding_side: str = "right") -> Batch:
    """Pad the token rows ``rows[i] for i in idx`` into one :class:`Batch`.

    Args:
        model: the :class:`~lmgeom.models.LanguageModel` (its pad id and device).
        rows: a sequence of 1-D int arrays (or an :class:`~lmgeom.activations.core.Encoded`).
        idx: ``(B,)`` which rows, in batch order.
        padding_side: ``"right"`` (default) or ``"left"``.
    """
    import torch

    if padding_side not in PADDING_SIDES:
        raise ConfigError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    rows = _as_rows(rows)
    idx = np.asarray(idx, dtype=np.int64)
    picked = [rows[i] for i in idx]
    T = max(len(r) for r in picked)
    pad = model.tokenizer.pad_token_id or 0
    input_ids = np.full((len(picked), T), pad, dtype=np.int64)
    mask = np.zeros((len(picked), T), dtype=np.int64)
    for j, r in enumerate(picked):
        if padding_side == "right":
            input_ids[j, : len(r)] = r
            mask[j, : len(r)] = 1
        else:
            input_ids[j, T - len(r):] = r
            mask[j, T - len(r):] = 1
    dev = model.device
    ids_t = torch.from_numpy(input_ids).to(dev)
    mask_t = torch.from_numpy(mask).to(dev)
    return Batch(index=idx, input_ids=ids_t, attention_mask=mask_t,
                 position_ids=position_ids_from_mask(mask_t), padding_side=padding_side)


def length_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Batches of row indices, longest rows first (stable), so a batch pads little."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def ordered_batches(n: int, batch_size: int) -> list[np.ndarray]:
    """Batches of row indices in the order given: ``[0..b-1], [b..2b-1], ...``."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    return [np.arange(b0, min(b0 + batch_size, n)) for b0 in range(0, n, batch_size)]


# ---------------------------------------------------------------------- forward
def forward_batch(model, batch: Batch, points: Sequence[str], capture: Capture, *,
                  stop_early: bool = True) -> dict[str, Any]:
    """One forward of ``batch`` through the base model (no logits, no KV cache, no grad).

    Args:
        model: the :class:`~lmgeom.models.LanguageModel`.
        batch: from :func:`pad_batch`.
        points: canonical point labels (``model.resolve_points``) to capture.
        capture: ``capture(label, h, batch)`` (:data:`Capture`), called once per point inside
            its hook; its return value is kept.
        stop_early: stop after the last block a point needs (``False`` when the caller needs
            ``final`` or the whole model anyway).

    Returns:
        ``label -> capture's value`` for every point.
    """
    import torch

    from ..models.adapter import StopForward

    got: dict[str, Any] = {}

    def sink(label, h):
        if label not in got:
            got[label] = capture(label, h, batch)

    with torch.no_grad(), model.capture(tuple(points), sink, stop_early=stop_early):
        try:
            model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                             position_ids=batch.position_ids, use_cache=False)
        except StopForward:
            pass
    missing = [p for p in points if p not in got]
    if missing:  # pragma: no cover - would be an adapter bug
        raise RuntimeError(f"hooks did not fire for {missing}")
    return got


@dataclass
class BatchOutput:
    """What :func:`run_batches` yields per batch.

    Attributes:
        number: the batch's number (its shard number in ``store``).
        index: ``(B,)`` input rows of the batch.
        tensors: ``finish``'s arrays (or the cached shard's).
        computed: ``False`` when the shard came from ``store``.
        batch: the padded :class:`Batch` (``None`` for a cached shard).
    """

    number: int
    index: np.ndarray
    tensors: dict[str, Any]
    computed: bool
    batch: Batch | None = None


def run_batches(
    model,
    rows,
    points: Sequence[str],
    capture: Capture,
    finish: Finish | None = None,
    *,
    batches: Sequence[np.ndarray] | None = None,
    batch_size: int = 8,
    padding_side: str = "right",
    stop_early: bool = True,
    store=None,
    progress: bool | None = None,
    desc: str = "forward",
) -> Iterator[BatchOutput]:
    """Run ``model`` over token ``rows`` batch by batch, capturing ``points``.

    Per batch: pad (:func:`pad_batch`), one forward (:func:`forward_batch`) with ``capture``
    applied at every point, then ``finish(batch, captured)`` (default: the captured values
    as they are), written to ``store`` when one is given. Batches whose shard ``store`` holds
    are yielded from it without running the model, so a killed run resumes.

    Args:
        model: a :class:`~lmgeom.models.LanguageModel`.
        rows: sequence of 1-D int64 token arrays (or an ``Encoded``); fed as given (add a BOS
            yourself).
        points: point labels to capture (at least one).
        capture: see :data:`Capture`.
        finish: see :data:`Finish`.
        batches: row indices per batch (default: longest first, :func:`length_batches`).
        batch_size: rows per batch when ``batches`` is not given.
        padding_side: ``"right"`` (default) or ``"left"``.
        stop_early: see :func:`forward_batch`.
        store: a :class:`~lmgeom.activations.cache.ShardCache` (``get(i)`` / ``put(i, arrays)``)
            or ``None``.
        progress: progress bar (default: when stderr is a terminal).
        desc: its label.

    Yields:
        :class:`BatchOutput`, one per batch, in batch order.
    """
    rows = _as_rows(rows)
    if not points:
        raise ConfigError("run_batches needs at least one measurement point to capture")
    if batches is None:
        batches = length_batches(np.array([len(r) for r in rows], dtype=np.int64), batch_size)
    bar = progress_bar(len(batches), desc, progress)
    try:
        for bi, idx in enumerate(batches):
            got = store.get(bi) if store is not None else None
            if got is not None:
                yield BatchOutput(bi, np.asarray(idx, dtype=np.int64), got, False)
                bar.update(1)
                continue
            batch = pad_batch(model, rows, idx, padding_side=padding_side)
            captured = forward_batch(model, batch, points, capture, stop_early=stop_early)
            if finish is None:
                tensors = captured
            else:
                import torch

                with torch.no_grad():
                    tensors = finish(batch, captured)
            if store is not None:
                store.put(bi, tensors)
            yield BatchOutput(bi, batch.index, tensors, True, batch)
            bar.update(1)
    finally:
        bar.close()


__all__ = ["PADDING_SIDES", "Batch", "BatchOutput", "Capture", "Finish", "check_finite",
           "dtype_name", "forward_batch", "length_batches", "model_identity", "ordered_batches",
           "pad_batch", "position_ids_from_mask", "progress_bar", "run_batches"]
