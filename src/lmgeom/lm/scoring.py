"""One forward pass per batch of token rows that serves both perplexity and hidden-state
reductions, with the readout applied to chunks of positions (never the ``B×T×V`` logits).

Memory: :func:`forward_chunks` captures the post-norm ``final`` states with
:meth:`LanguageModel.capture`, gathers the states of the scored positions and applies
:meth:`LanguageModel.readout` to ``position_chunk`` of them at a time, keeping only
``logsumexp(logits) - logits[target]`` (float64 accumulation). Peak extra memory is
``position_chunk × V`` floats instead of ``B × T × V``.

The forward is :func:`lmgeom.activations.forward.run_batches` (right-padded batches, position
ids from the attention mask); under the causal mask pad tokens never influence a real token, and
pad positions are neither scored nor reduced, so a text's value does not depend on what it is
batched with. :func:`scored_positions` and :func:`target_log_probs` are the scoring that
:mod:`lmgeom.lm.perplexity` and :mod:`lmgeom.lm.knnlm` use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import sha256_bytes, stable_hash
from .._paths import cache_dir
from ..activations.cache import ShardCache
from ..activations.forward import (
    check_finite,
    dtype_name,
    length_batches,
    model_identity,
    run_batches,
)
from ..errors import ConfigError, DataError, TextsError

#: Bump when a change here changes the numbers produced (part of cache keys).
FORWARD_VERSION = "1"
#: Default budget for one readout chunk: this many float32 logits (64 MiB).
LOGIT_BUDGET = 1 << 24

Reducer = Callable[[Any, Any], Any]
"""``reducer(h, mask) -> (B, ...)``: ``h`` is one point's ``(B, T, d)`` states (model dtype),
``mask`` a ``(B, T)`` bool tensor of the positions to reduce over (non-pad positions at or
after ``reduce_from``). Returns a torch tensor or numpy array with one entry per row."""


def model_context(model) -> int | None:
    """The model's maximum sequence length from its config (None when it does not say)."""
    return model.context_length


def default_position_chunk(vocab_size: int) -> int:
    """Positions per readout chunk so one chunk's float32 logits stay within 64 MiB
    (64 positions for a 262k vocabulary, 341 for 49k), capped at 1024."""
    return int(max(1, min(1024, LOGIT_BUDGET // max(1, int(vocab_size)))))


# ---------------------------------------------------------------------- forward_chunks
@dataclass
class ForwardResult:
    """What one pass of :func:`forward_chunks` produced, in the order of the input rows.

    Attributes:
        nll_sum: ``(N,)`` float64, summed NLL (nats) of the scored tokens of each row
            (zeros when ``nll=False``).
        n_predicted: ``(N,)`` int64, tokens scored per row.
        reduced: ``reduced[name][point]`` is the ``(N, ...)`` float32 output of reducer
            ``name`` at ``point``.
        n_tokens: ``(N,)`` row lengths (tokens fed to the model).
        key: the cache key ("" without cache).
        batches_computed / batches_cached: how much work the cache saved.
    """

    nll_sum: np.ndarray
    n_predicted: np.ndarray
    reduced: dict[str, dict[str, np.ndarray]]
    n_tokens: np.ndarray
    key: str = ""
    batches_computed: int = 0
    batches_cached: int = 0

    @property
    def mean_nll(self) -> np.ndarray:
        """``(N,)`` mean NLL per scored token (NaN where nothing was scored)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n_predicted > 0, self.nll_sum / np.maximum(self.n_predicted, 1),
                            np.nan)

    @property
    def perplexity(self) -> np.ndarray:
        """``(N,)`` ``exp(mean NLL)`` per row."""
        return np.exp(self.mean_nll)


def _as_rows(token_chunks) -> list[np.ndarray]:
    if isinstance(token_chunks, np.ndarray) and token_chunks.ndim == 2:
        rows = [np.asarray(r, dtype=np.int64) for r in token_chunks]
    else:
        try:
            rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in token_chunks]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"token_chunks must be an (N, T) int array or a list of 1-D int "
                              f"arrays: {exc}") from exc
    if not rows:
        raise TextsError("no token chunks to run: the corpus is empty or shorter than one chunk")
    if any(len(r) == 0 for r in rows):
        raise TextsError("a token chunk is empty; every row needs at least one token")
    return rows


def _per_row(value, n: int, name: str, minimum: int) -> np.ndarray:
    a = np.broadcast_to(np.asarray(value, dtype=np.int64), (n,)).copy()
    if (a < minimum).any():
        raise ConfigError(f"{name} must be >= {minimum}, got {int(a.min())}")
    return a


def forward_chunks(
    model,
    token_chunks,
    points: Sequence[str] = (),
    reducers: Mapping[str, Reducer] | None = None,
    *,
    nll: bool = True,
    score_from: int | Sequence[int] | np.ndarray = 1,
    reduce_from: int | Sequence[int] | np.ndarray = 0,
    batch_size: int = 8,
    position_chunk: int | None = None,
    progress: bool | None = None,
    cache: bool = False,
    cache_root: str | os.PathLike[str] | None = None,
    desc: str = "forward",
    padding_side: str = "right",
    token_sink: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> ForwardResult:
    """One forward pass per batch of token rows serving perplexity and state reductions.

    Per batch: the requested ``points`` are captured with hooks and every reducer is applied to
    each point's ``(B, T, d)`` tensor on the fly (nothing per layer is kept at full size); with
    ``nll`` the ``final`` states are scored against the next tokens in chunks of positions.

    Args:
        model: a :class:`~lmgeom.models.LanguageModel` (or a spec for ``load_model``).
        token_chunks: ``(N, T)`` int array of fixed-length chunks, or a list of 1-D int arrays
            of any lengths (right-padded per batch). Rows are fed as given: add a BOS yourself.
        points: measurement points (canonical labels, see ``model.resolve_points``).
        reducers: ``name -> reducer(h, mask)`` (see :data:`Reducer`). Names enter the cache key,
            so a name must identify what its function computes.
        nll: score the next-token NLL from ``final`` (needs the whole model).
        score_from: first scored target position per row (scalar or ``(N,)``), >= 1: position
            ``t`` is scored from the states at ``t - 1``. Default 1: tokens 2..T.
        reduce_from: positions before this (per row) are left out of the reducers' mask (1 to
            leave out a prepended BOS).
        batch_size: rows per forward pass (and per cache shard).
        position_chunk: positions per readout matmul (default :func:`default_position_chunk`).
        progress: progress bar (default: when stderr is a terminal).
        cache: reuse / write verified shards under ``$LMGEOM_CACHE/forward/<key>`` (resumable
            after a kill).
        cache_root: another cache folder.
        desc: progress-bar label.
        padding_side: ``"right"`` (default) or ``"left"``; the same values either way
            (positions come from the attention mask).
        token_sink: with ``nll``, called once per batch with ``(row, position, token, nll)``
            arrays of every scored token (row index into ``token_chunks``, position of the
            token in its row, its id, its NLL in nats), so token-level NLL streams out with
            bounded memory. Batches come in length order, not row order.

    Returns:
        :class:`ForwardResult`, rows in input order.
    """
    from ..models import load_model  # torch

    model = load_model(model)
    rows = _as_rows(token_chunks)
    n = len(rows)
    reducers = dict(reducers or {})
    points = tuple(points)
    _check_request(points, reducers, nll, token_sink, batch_size)
    score = _per_row(score_from, n, "score_from", 1)
    red_from = _per_row(reduce_from, n, "reduce_from", 0)
    pc = default_position_chunk(model.vocab_size) if position_chunk is None else int(position_chunk)
    if pc < 1:
        raise ConfigError(f"position_chunk must be >= 1, got {position_chunk}")
    _check_rows(model, rows)
    dtype = dtype_name(model)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    key, store = "", None
    if cache:
        key, store = _forward_store(model, rows, lengths, points, reducers, nll, score, red_from,
                                    batch_size, dtype, padding_side, token_sink is not None,
                                    cache_root)

    batches = length_batches(lengths, batch_size)
    capture, finish = _batch_functions(model, points, reducers, nll, score, red_from, pc, dtype,
                                       per_token=token_sink is not None)
    res = ForwardResult(nll_sum=np.zeros(n, dtype=np.float64),
                        n_predicted=np.zeros(n, dtype=np.int64),
                        reduced={name: {} for name in reducers}, n_tokens=lengths, key=key)
    wanted = tuple(dict.fromkeys((*points, *(("final",) if nll else ()))))
    with (store.lock() if store is not None else contextlib.nullcontext()):
        for out in run_batches(model, rows, wanted, capture, finish, batches=batches,
                               stop_early=not nll, padding_side=padding_side, store=store,
                               progress=progress, desc=desc):
            res.batches_computed += out.computed
            _collect(res, out.tensors, points, token_sink)
    res.batches_cached = len(batches) - res.batches_computed
    return res


def _forward_store(model, rows, lengths, points, reducers, nll, score, red_from, batch_size,
                   dtype, padding_side, per_token, cache_root) -> tuple[str, ShardCache]:
    """The cache key of a :func:`forward_chunks` call (every setting that changes its numbers,
    the tokens by content) and its shard store."""
    settings = {
        "version": FORWARD_VERSION, "points": list(points), "reducers": sorted(reducers),
        "nll": nll, "score_from": sha256_bytes(score.tobytes()),
        "reduce_from": sha256_bytes(red_from.tobytes()), "batch_size": batch_size,
        "dtype": dtype,
        "tokens": sha256_bytes(np.concatenate(rows).tobytes() + lengths.tobytes()),
    }
    if padding_side != "right":  # right padding keeps the keys it always had
        settings["padding_side"] = padding_side
    if per_token:
        settings["per_token"] = True
    key = "fwd-" + stable_hash({"model": model_identity(model), **settings})[:28]
    root = Path(cache_root) if cache_root else cache_dir("forward")
    return key, ShardCache(key, {**settings, "model": model.name}, True, root)


def _check_request(points: tuple[str, ...], reducers: dict, nll: bool, token_sink: Any,
                   batch_size: int) -> None:
    if points and not reducers:
        raise ConfigError("points were given but no reducers to apply to them")
    if not points and reducers:
        raise ConfigError("reducers were given but no points to apply them to")
    if not nll and not points:
        raise ConfigError("nothing to compute: nll=False and no points")
    if token_sink is not None and not nll:
        raise ConfigError("token_sink needs nll=True")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")


def _check_rows(model, rows: list[np.ndarray]) -> None:
    """Token ids inside the vocabulary and rows no longer than the model's context."""
    V = model.vocab_size
    for r in rows:
        if r.min() < 0 or r.max() >= V:
            raise DataError(f"token id out of range for {model.name} (vocabulary {V}): "
                            f"{int(r.min())}..{int(r.max())}")
    ctx = model_context(model)
    longest = max(len(r) for r in rows)
    if ctx is not None and longest > ctx:
        raise ConfigError(f"a row has {longest} tokens but {model.name} takes at most {ctx}; "
                          "use shorter chunks (or a stride for perplexity)")


def _collect(res: ForwardResult, got: dict[str, np.ndarray], points: tuple[str, ...],
             token_sink: Any) -> None:
    """One batch's outputs into ``res`` (rows ``got["index"]``); per-token NLL to the sink."""
    ix = got["index"]
    res.nll_sum[ix] = got["nll_sum"]
    res.n_predicted[ix] = got["n_predicted"]
    if token_sink is not None:
        token_sink(got["tok_row"], got["tok_position"], got["tok_id"], got["tok_nll"])
    n = res.nll_sum.size
    for name, per_point in res.reduced.items():
        for p in points:
            arr = got[f"r:{name}:{p}"]
            if p not in per_point:
                per_point[p] = np.full((n, *arr.shape[1:]), np.nan, dtype=np.float32)
            per_point[p][ix] = arr


def _batch_functions(model, points, reducers, nll, score, red_from, pc, dtype,
                     per_token: bool = False):
    """The capture and finish (:func:`lmgeom.activations.forward.run_batches`) of
    :func:`forward_chunks`: reducers applied in the hooks, NLL scored from ``final``."""
    import torch

    def capture(label, h, batch):
        B = h.shape[0]
        kept: dict[str, Any] = {}
        if label == "final" and nll:
            kept["h"] = h
        if label in points:
            if "rmask" not in batch.scratch:  # positions in the text, whatever the padding
                rf = torch.as_tensor(red_from[batch.index], device=h.device)
                batch.scratch["rmask"] = batch.valid & (batch.position_ids >= rf[:, None])
            for name, fn in reducers.items():
                v = fn(h, batch.scratch["rmask"])
                if isinstance(v, torch.Tensor):
                    v = v.detach().to(torch.float32).cpu().numpy()
                v = np.asarray(v, dtype=np.float32)
                if v.shape[:1] != (B,):
                    raise ConfigError(f"reducer {name!r} returned shape {v.shape}; expected "
                                      f"one entry per row ({B}, ...)")
                kept[name] = v
        return kept

    def finish(batch, got) -> dict[str, np.ndarray]:
        B = batch.input_ids.shape[0]
        out: dict[str, np.ndarray] = {"index": np.asarray(batch.index, dtype=np.int64)}
        for p in points:
            for name in reducers:
                arr = got[p][name]
                # NaN is a reducer's "undefined" (e.g. dispersion of one token); inf is overflow
                check_finite(f"{p} ({name})", arr[~np.isnan(arr)], dtype)
                out[f"r:{name}:{p}"] = arr
        if nll:
            toks: dict | None = {} if per_token else None
            s, c = _score_batch(model, got["final"]["h"], batch, score[batch.index], pc, torch,
                                toks)
            if toks is not None:
                out["tok_row"] = np.asarray(batch.index, dtype=np.int64)[toks["row"]]
                out["tok_position"] = toks["position"]
                out["tok_id"] = toks["token"]
                out["tok_nll"] = toks["nll"]
            if not np.isfinite(s).all():
                hint = " (fp16 overflow is a common cause: use float32 or bfloat16)" if "16" in dtype else ""
                raise DataError(f"non-finite NLL from {model.name}{hint}")
            out["nll_sum"], out["n_predicted"] = s, c
        else:
            out["nll_sum"] = np.zeros(B, dtype=np.float64)
            out["n_predicted"] = np.zeros(B, dtype=np.int64)
        return out

    return capture, finish


def scored_positions(batch, score_from=1):
    """``(b_idx, t_idx)``: the states (row, column) of ``batch`` that predict a scored token
    (the real token at column ``t + 1``, at text position >= ``score_from``; per row or one
    number). The state at column ``t`` is a real token's too, whatever the padding side."""
    import torch

    valid = batch.valid
    dev = valid.device
    sf = torch.as_tensor(score_from, device=dev)
    sf = sf[:, None] if sf.ndim else sf
    ok = valid[:, 1:] & valid[:, :-1] & (batch.position_ids[:, 1:] >= sf)
    return ok.nonzero(as_tuple=True)


def target_log_probs(model, states, targets, pc: int):
    """``logsumexp(logits) - logits[target]`` (the NLL, float64 tensor) per row of ``states``
    ``(n, d)`` (post-norm), with the readout applied to ``pc`` positions at a time."""
    import torch

    parts = []
    for s in range(0, len(targets), pc):
        logits = model.readout(states[s : s + pc]).float()
        tgt = logits.gather(1, targets[s : s + pc, None])[:, 0]
        parts.append((torch.logsumexp(logits, -1) - tgt).double())
        del logits
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64,
                                                      device=targets.device)


def _score_batch(model, h, batch, score, pc, torch, tokens: dict | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Summed NLL and scored-token count per row from post-norm states ``h`` ``(B, T, d)``;
    with ``tokens`` (a dict) also every scored token: its batch row, text position, id, NLL."""
    input_ids = batch.input_ids
    B = input_ids.shape[0]
    dev = input_ids.device
    b_idx, t_idx = scored_positions(batch, score)  # state at t_idx predicts token t_idx + 1
    nll = torch.zeros(B, dtype=torch.float64, device=dev)
    per = None
    if len(b_idx):
        per = target_log_probs(model, h[b_idx, t_idx], input_ids[b_idx, t_idx + 1], pc)
        nll.index_add_(0, b_idx, per)
    counts = torch.bincount(b_idx, minlength=B)
    if tokens is not None:
        tokens["row"] = b_idx.cpu().numpy().astype(np.int64)
        tokens["position"] = batch.position_ids[b_idx, t_idx + 1].cpu().numpy().astype(np.int64)
        tokens["token"] = input_ids[b_idx, t_idx + 1].cpu().numpy().astype(np.int64)
        tokens["nll"] = (per.cpu().numpy() if per is not None
                         else np.zeros(0, dtype=np.float64))
    return nll.cpu().numpy(), counts.cpu().numpy().astype(np.int64)
