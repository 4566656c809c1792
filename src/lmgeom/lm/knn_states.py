"""Per-position states of a forward over token rows, for kNN-LM keys and queries: the state
at position ``t`` of a row with the token ``t + 1`` it predicts (and optionally
``log p_LM`` of that token, scored as :func:`lmgeom.lm.scoring.forward_chunks` scores it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..activations.forward import (
    check_finite,
    dtype_name,
    ordered_batches,
    run_batches,
)
from ..errors import ConfigError, DataError, TextsError
from .scoring import default_position_chunk, scored_positions, target_log_probs


@dataclass
class PositionStates:
    """Per-position states of one forward over token rows.

    Position ``t`` of row ``r`` appears when ``t + 1`` is a real token: its state predicts
    ``targets`` = token ``t + 1``.

    Attributes:
        states: ``point -> (n, d)`` float32.
        targets: ``(n,)`` int64 next tokens (the datastore values).
        lm_log_prob: ``(n,)`` float64 ``log p_LM(target)``, or None when not computed.
        row, pos: ``(n,)`` row index and position of each entry.
    """

    states: dict[str, np.ndarray]
    targets: np.ndarray
    lm_log_prob: np.ndarray | None
    row: np.ndarray
    pos: np.ndarray

    def __len__(self) -> int:
        return int(self.targets.shape[0])


def as_token_rows(token_rows) -> list[np.ndarray]:
    """Token rows as 1-D int64 arrays of at least 2 tokens (one context, one target)."""
    if isinstance(token_rows, np.ndarray) and token_rows.ndim == 2:
        rows = [np.asarray(r, dtype=np.int64) for r in token_rows]
    else:
        rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in token_rows]
    if not rows:
        raise TextsError("no token rows: the corpus is empty or shorter than one chunk")
    if any(len(r) < 2 for r in rows):
        raise TextsError("every token row needs at least 2 tokens (one context, one target)")
    return rows


def iter_position_states(
    model,
    token_rows,
    points: Sequence[str],
    *,
    lm_log_prob: bool = False,
    batch_size: int = 8,
    position_chunk: int | None = None,
    progress: bool | None = None,
    desc: str = "knnlm",
) -> Iterator[tuple[np.ndarray, PositionStates]]:
    """One forward per batch of rows, yielding ``(row indices, PositionStates)`` per batch.

    Rows are run in the order given through :func:`lmgeom.activations.forward.run_batches`
    (rows of one batch are right-padded; pads are never keys, queries or targets). With
    ``lm_log_prob`` the post-norm ``final`` states are scored against the next token in chunks
    of ``position_chunk`` positions, the way :func:`lmgeom.lm.scoring.forward_chunks` scores them (same state selection, same
    chunking, so the values agree bit for bit with it for the same batches).
    """
    import torch

    rows = as_token_rows(token_rows)
    points = tuple(points)
    if not points and not lm_log_prob:
        raise ConfigError("nothing to compute: no points and lm_log_prob=False")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    V = model.vocab_size
    for r in rows:
        if r.min() < 0 or r.max() >= V:
            raise DataError(f"token id out of range for {model.name} (vocabulary {V})")
    pc = default_position_chunk(V) if position_chunk is None else int(position_chunk)
    if pc < 1:
        raise ConfigError(f"position_chunk must be >= 1, got {position_chunk}")
    dtype = dtype_name(model)
    capture_points = tuple(dict.fromkeys((*points, *(("final",) if lm_log_prob else ()))))

    def capture(label, h, batch):
        if "bt" not in batch.scratch:  # state at t predicts token t + 1
            batch.scratch["bt"] = scored_positions(batch, 1)
        b, t = batch.scratch["bt"]
        kept = {}
        if label in points:
            kept["states"] = h[b, t].to(torch.float32).cpu().numpy()
        if label == "final" and lm_log_prob:
            kept["final"] = h[b, t]
        return kept

    def finish(batch, got):
        b_idx, t_idx = batch.scratch["bt"]
        targets_t = batch.input_ids[b_idx, t_idx + 1]
        logp = None
        if lm_log_prob:
            logp = -target_log_probs(model, got["final"]["final"], targets_t, pc).cpu().numpy()
            if not np.isfinite(logp).all():
                raise DataError(f"non-finite log-probabilities from {model.name}"
                                + (" (use float32 or bfloat16)" if "16" in dtype else ""))
        for p in points:
            check_finite(p, got[p]["states"], dtype)
        b_np = b_idx.cpu().numpy()
        return {"ps": PositionStates(
            states={p: got[p]["states"] for p in points},
            targets=targets_t.cpu().numpy().astype(np.int64),
            lm_log_prob=logp,
            row=batch.index[b_np].astype(np.int64),
            pos=batch.position_ids[b_idx, t_idx].cpu().numpy().astype(np.int64),
        )}

    for out in run_batches(model, rows, capture_points, capture, finish,
                           batches=ordered_batches(len(rows), batch_size),
                           stop_early=not lm_log_prob, progress=progress, desc=desc):
        yield out.index, out.tensors["ps"]


def position_states(model, token_rows, points: Sequence[str], **kwargs) -> PositionStates:
    """All of :func:`iter_position_states` concatenated (for held-out queries: a few thousand
    positions; use :func:`build_datastores` for large training corpora)."""
    parts = [ps for _, ps in iter_position_states(model, token_rows, points, **kwargs)]
    lp = None if parts[0].lm_log_prob is None else np.concatenate([p.lm_log_prob for p in parts])
    return PositionStates(
        states={p: np.concatenate([x.states[p] for x in parts]) for p in parts[0].states},
        targets=np.concatenate([x.targets for x in parts]),
        lm_log_prob=lp,
        row=np.concatenate([x.row for x in parts]),
        pos=np.concatenate([x.pos for x in parts]),
    )
