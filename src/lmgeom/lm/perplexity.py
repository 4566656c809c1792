"""Perplexity without the ``B×T×V`` logits, and the one forward pass that serves both
perplexity and hidden-state reductions.

Definitions (METHODS.md, "Perplexity"):

* a text's perplexity is ``exp(mean NLL of tokens 2..T)`` of its model input (the tokenizer's
  special tokens included: when it prepends a BOS, BOS is token 1 and every real token is
  scored; the first token has no context and is never scored);
* the corpus figure is ``exp(Σ NLL / Σ n_predicted)`` over every scored token of every text
  (token-weighted), next to the plain mean and median of the per-text values;
* sliding-window mode (``stride``) for texts longer than ``max_length``: windows of at most
  ``max_length`` tokens start every ``stride`` tokens; each window scores only the tokens the
  previous window did not reach, so every token 2..T is scored exactly once, with the most
  context the window allows (the Hugging Face "perplexity of fixed-length models" recipe).

Memory: the readout is never applied to all positions at once. :func:`forward_chunks` captures
the post-norm ``final`` states with :meth:`LanguageModel.capture`, gathers the states of the
scored positions and applies :meth:`LanguageModel.readout` to ``position_chunk`` of them at a
time, keeping only ``logsumexp(logits) - logits[target]`` (float64 accumulation). Peak extra
memory is ``position_chunk × V`` floats instead of ``B × T × V``.

The forward is :func:`lmgeom.activations.forward.run_batches` (right-padded batches, position
ids from the attention mask); under the causal mask pad tokens never influence a real token, and
pad positions are neither scored nor reduced, so a text's value does not depend on what it is
batched with. :func:`scored_positions` and :func:`target_log_probs` are the scoring both
this module and :mod:`lmgeom.lm.knnlm` use.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import sha256_bytes, stable_hash
from ..errors import ConfigError, DataError, TextsError

log = logging.getLogger(__name__)

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
    cfg = model.hf_model.config
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


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
    import contextlib

    from .._paths import cache_dir
    from ..activations.core import ShardCache
    from ..activations.forward import dtype_name, length_batches, model_identity, run_batches
    from ..models import load_model

    model = load_model(model)
    rows = _as_rows(token_chunks)
    n = len(rows)
    reducers = dict(reducers or {})
    points = tuple(points)
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
    score = _per_row(score_from, n, "score_from", 1)
    red_from = _per_row(reduce_from, n, "reduce_from", 0)
    pc = default_position_chunk(model.vocab_size) if position_chunk is None else int(position_chunk)
    if pc < 1:
        raise ConfigError(f"position_chunk must be >= 1, got {position_chunk}")
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
    dtype = dtype_name(model)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)

    key = ""
    store = None
    if cache:
        tok_hash = sha256_bytes(np.concatenate(rows).tobytes() + lengths.tobytes())
        settings = {
            "version": FORWARD_VERSION, "points": list(points), "reducers": sorted(reducers),
            "nll": nll, "score_from": sha256_bytes(score.tobytes()),
            "reduce_from": sha256_bytes(red_from.tobytes()), "batch_size": batch_size,
            "dtype": dtype, "tokens": tok_hash,
        }
        if padding_side != "right":  # right padding keeps the keys it always had
            settings["padding_side"] = padding_side
        if token_sink is not None:
            settings["per_token"] = True
        key = "fwd-" + stable_hash({"model": model_identity(model), **settings})[:28]
        root = Path(cache_root) if cache_root else cache_dir("forward")
        store = ShardCache(key, {**settings, "model": model.name}, True, root)

    batches = length_batches(lengths, batch_size)
    capture, finish = _batch_functions(model, points, reducers, nll, score, red_from, pc, dtype,
                                       per_token=token_sink is not None)
    nll_sum = np.zeros(n, dtype=np.float64)
    n_pred = np.zeros(n, dtype=np.int64)
    reduced: dict[str, dict[str, np.ndarray]] = {name: {} for name in reducers}
    computed = 0
    with (store.lock() if store is not None else contextlib.nullcontext()):
        for out in run_batches(model, rows, tuple(dict.fromkeys((*points, *(("final",) if nll
                                                                          else ())))),
                               capture, finish, batches=batches, stop_early=not nll,
                               padding_side=padding_side,
                               store=store, progress=progress, desc=desc):
            got = out.tensors
            computed += out.computed
            ix = got["index"]
            nll_sum[ix] = got["nll_sum"]
            n_pred[ix] = got["n_predicted"]
            if token_sink is not None:
                token_sink(got["tok_row"], got["tok_position"], got["tok_id"], got["tok_nll"])
            for name in reducers:
                for p in points:
                    arr = got[f"r:{name}:{p}"]
                    if p not in reduced[name]:
                        reduced[name][p] = np.full((n, *arr.shape[1:]), np.nan, dtype=np.float32)
                    reduced[name][p][ix] = arr
    return ForwardResult(nll_sum=nll_sum, n_predicted=n_pred, reduced=reduced,
                         n_tokens=lengths, key=key, batches_computed=computed,
                         batches_cached=len(batches) - computed)


def _batch_functions(model, points, reducers, nll, score, red_from, pc, dtype,
                     per_token: bool = False):
    """The capture and finish (:func:`lmgeom.activations.forward.run_batches`) of
    :func:`forward_chunks`: reducers applied in the hooks, NLL scored from ``final``."""
    import torch

    from ..activations.forward import check_finite

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


# ---------------------------------------------------------------------- perplexity
@dataclass(frozen=True)
class TextPerplexity:
    """Perplexity of one text.

    Attributes:
        id: the text's id in its :class:`~lmgeom.texts.TextSet`.
        n_tokens: tokens of the model input (special tokens included; after truncation when
            no stride is given).
        nll_sum: summed NLL of the scored tokens, nats.
        n_predicted: scored tokens (``n_tokens - 1``).
        perplexity: ``exp(nll_sum / n_predicted)``; NaN for a one-token text.
    """

    id: str
    n_tokens: int
    nll_sum: float
    n_predicted: int
    perplexity: float


@dataclass(frozen=True)
class PerplexityResult:
    """Per-text perplexities and the corpus figure.

    Attributes:
        texts: one :class:`TextPerplexity` per text, in corpus order.
        corpus_perplexity: ``exp(Σ nll_sum / Σ n_predicted)`` over all texts (token-weighted).
        n_truncated: texts cut to ``max_length`` (always 0 with a stride).
        n_windows: model rows run (texts, or windows in sliding-window mode).
        settings: max_length, stride, batch_size, position_chunk, dtype, model.
    """

    texts: tuple[TextPerplexity, ...]
    corpus_perplexity: float
    n_truncated: int
    n_windows: int
    settings: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self):
        return iter(self.texts)

    @property
    def perplexities(self) -> np.ndarray:
        """``(N,)`` per-text perplexities."""
        return np.array([t.perplexity for t in self.texts], dtype=np.float64)

    @property
    def mean_perplexity(self) -> float:
        """Plain mean of the per-text perplexities (texts with a value)."""
        p = self.perplexities
        return float(np.nanmean(p)) if np.isfinite(p).any() else math.nan

    @property
    def median_perplexity(self) -> float:
        p = self.perplexities
        return float(np.nanmedian(p)) if np.isfinite(p).any() else math.nan

    def to_frame(self):
        """A ``pandas.DataFrame`` with columns id, n_tokens, nll_sum, n_predicted, perplexity."""
        import pandas as pd

        return pd.DataFrame(
            [t.__dict__ for t in self.texts],
            columns=["id", "n_tokens", "nll_sum", "n_predicted", "perplexity"],
        )

    def summary(self, show: int = 10) -> str:
        """What ``lmgeom ppl`` prints: the corpus figures and the ``show`` texts with the
        highest and the lowest perplexity."""
        from ..results.console import format_table

        df = self.to_frame()
        st = self.settings
        mode = (f"sliding window {st.get('max_length')}/{st.get('stride')}" if st.get("stride")
                else f"max {st.get('max_length')} tokens, {self.n_truncated} truncated")
        head = (f"{st.get('model')} on {st.get('texts')}: {len(self)} texts, "
                f"{int(df.n_predicted.sum())} scored tokens ({mode}, {self.n_windows} model "
                "inputs)")
        corpus = (f"corpus perplexity {self.corpus_perplexity:.4g}   mean per text "
                  f"{self.mean_perplexity:.4g}   median {self.median_perplexity:.4g}")
        lines = [head, corpus]
        k = max(0, int(show))
        if k:
            cols = ["id", "n_tokens", "perplexity"]
            srt = df.sort_values("perplexity", kind="stable")
            top = srt.tail(k).iloc[::-1] if len(srt) > k else srt.iloc[::-1]
            lines += [f"\nhighest perplexity ({min(k, len(df))}):",
                      format_table(top[cols].to_dict("records"))]
            if len(df) > k:
                lines += [f"\nlowest perplexity ({k}):",
                          format_table(srt.head(k)[cols].to_dict("records"))]
        return "\n".join(lines)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the per-text table (:meth:`to_frame`) as ``.csv``, ``.parquet`` or ``.jsonl``
        (by the file name), atomically."""
        from .._io import atomic_path

        out = Path(path)
        suffix = out.suffix.lower()
        if suffix not in (".csv", ".parquet", ".jsonl"):
            raise ConfigError(f"--out {out}: use a .csv, .parquet or .jsonl file name")
        df = self.to_frame()
        with atomic_path(out) as tmp:
            if suffix == ".csv":
                df.to_csv(tmp, index=False)
            elif suffix == ".parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_json(tmp, orient="records", lines=True)
        return out


def sliding_windows(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, score_from)`` windows covering tokens ``0..n_tokens-1``.

    Windows of at most ``max_length`` tokens start every ``stride`` tokens; window ``w`` scores
    positions ``score_from..end-begin-1`` (relative to its start): the tokens the previous
    window did not reach. Every token from the second on is scored exactly once.
    """
    if not 1 <= stride < max_length:
        raise ConfigError(f"stride must be in 1..max_length-1 ({max_length - 1}), got {stride}")
    out = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + max_length, n_tokens)
        out.append((begin, end, max(1, prev_end - begin)))
        prev_end = end
        if end == n_tokens:
            break
    return out


def perplexity(
    model,
    texts,
    *,
    max_length: int = 512,
    stride: int | None = None,
    batch_size: int = 8,
    position_chunk: int | None = None,
    progress: bool | None = None,
    token_nll: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> PerplexityResult:
    """Per-text perplexity ``exp(mean NLL of tokens 2..T)`` and the corpus perplexity.

    Args:
        model: a :class:`~lmgeom.models.LanguageModel` or a spec for ``load_model``.
        texts: a :class:`~lmgeom.texts.TextSet`, a list of strings or a text spec.
        max_length: tokens per model input. Without ``stride`` longer texts are truncated to
            it (counted in ``n_truncated``, logged).
        stride: sliding-window mode: windows of ``max_length`` tokens every ``stride`` tokens
            (``1 <= stride < max_length``); every token is scored once, with the most context
            its window allows. A text that fits in one window gets exactly the plain value.
        batch_size: model inputs (texts or windows) per forward pass.
        position_chunk: positions per readout matmul; bounds the logits at
            ``position_chunk × V`` floats (default: 64 MiB worth).
        progress: progress bar (default: when stderr is a terminal).
        token_nll: called per batch with ``(text, position, token, nll)`` arrays of every scored
            token: the text's index, the token's position in the text (0 = its first token,
            which is never scored), its id and its NLL in nats (see :class:`TokenNLLWriter`).

    Returns:
        :class:`PerplexityResult`.
    """
    from ..activations.core import encode_texts
    from ..models import load_model
    from ..texts import as_textset

    model = load_model(model)
    ts = as_textset(texts)
    if len(ts) == 0:
        raise TextsError("the corpus is empty: nothing to score")
    if max_length < 2:
        raise ConfigError(f"max_length must be at least 2 tokens, got {max_length}")
    ctx = model_context(model)
    if ctx is not None and max_length > ctx:
        log.warning("max_length %d exceeds the context of %s (%d tokens): using %d", max_length,
                    model.name, ctx, ctx)
        max_length = ctx
    if stride is None:
        enc = encode_texts(model, ts.texts, max_length)
        rows = list(enc.ids)
        owner = np.arange(len(rows))
        begin = np.zeros(len(rows), dtype=np.int64)
        score = np.ones(len(rows), dtype=np.int64)
        n_trunc = enc.n_truncated
        n_tok = enc.lengths
    else:
        if not 1 <= int(stride) < max_length:
            raise ConfigError(f"stride must be in 1..max_length-1 ({max_length - 1}), got {stride}")
        enc = encode_texts(model, ts.texts, 1 << 62)
        rows, own, sc, beg = [], [], [], []
        for i, ids in enumerate(enc.ids):
            for b, e, s in sliding_windows(len(ids), max_length, int(stride)):
                rows.append(ids[b:e])
                own.append(i)
                sc.append(s)
                beg.append(b)
        owner = np.asarray(own, dtype=np.int64)
        begin = np.asarray(beg, dtype=np.int64)
        score = np.asarray(sc, dtype=np.int64)
        n_trunc = 0
        n_tok = enc.lengths
    sink = None
    if token_nll is not None:
        def sink(row, pos, tok, nll):  # window rows -> (text, position in the text)
            token_nll(owner[row], begin[row] + pos, tok, nll)

    res = forward_chunks(model, rows, nll=True, score_from=score, batch_size=batch_size,
                         position_chunk=position_chunk, progress=progress,
                         desc=f"ppl {model.name}", token_sink=sink)
    nll_sum = np.zeros(len(ts), dtype=np.float64)
    n_pred = np.zeros(len(ts), dtype=np.int64)
    np.add.at(nll_sum, owner, res.nll_sum)
    np.add.at(n_pred, owner, res.n_predicted)
    out = []
    for i in range(len(ts)):
        p = math.exp(nll_sum[i] / n_pred[i]) if n_pred[i] > 0 else math.nan
        out.append(TextPerplexity(str(ts.ids[i]), int(n_tok[i]), float(nll_sum[i]),
                                  int(n_pred[i]), p))
    n_single = int((n_pred == 0).sum())
    if n_single:
        log.warning("%d text(s) have a single token: no perplexity (NaN), left out of the corpus "
                    "figure", n_single)
    total = int(n_pred.sum())
    corpus = math.exp(float(nll_sum.sum()) / total) if total else math.nan
    settings = {"max_length": max_length, "stride": stride, "batch_size": batch_size,
                "position_chunk": position_chunk or default_position_chunk(model.vocab_size),
                "dtype": str(model.dtype).replace("torch.", ""), "model": model.name,
                "texts": ts.source, "texts_hash": ts.hash}
    return PerplexityResult(tuple(out), corpus, n_trunc, len(rows), settings)


class TokenNLLWriter:
    """Streams token-level NLL to parquet, one row group per batch (bounded memory).

    Columns: ``id`` (the text's id), ``position`` (the token's position in the text; 0 is the
    first token, never scored), ``token_id``, ``token`` (its decoded string), ``nll`` (nats).
    Use as the ``token_nll`` callback of :func:`perplexity`::

        with TokenNLLWriter("tokens.parquet", model.tokenizer, texts.ids) as w:
            perplexity(model, texts, token_nll=w)
    """

    def __init__(self, path: str | os.PathLike[str], tokenizer, ids: Sequence[str]) -> None:
        import pyarrow as pa

        self.path = Path(path)
        self.ids = [str(x) for x in ids]
        self.tokenizer = tokenizer
        self.n_rows = 0
        self.schema = pa.schema([("id", pa.string()), ("position", pa.int64()),
                                 ("token_id", pa.int64()), ("token", pa.string()),
                                 ("nll", pa.float64())])
        self._writer = None
        self._tmp: Path | None = None

    def __enter__(self) -> TokenNLLWriter:
        import pyarrow.parquet as pq

        from .._io import TMP_TAG, check_replaceable

        check_replaceable(self.path, what="--per-token")  # never over a file lmgeom did not write
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.{TMP_TAG}{os.getpid()}.tmp")
        self._writer = pq.ParquetWriter(str(self._tmp), self.schema)
        return self

    def __call__(self, text, position, token, nll) -> None:
        import pyarrow as pa

        if self._writer is None:
            raise RuntimeError("use TokenNLLWriter as a context manager")
        tok = [self.tokenizer.decode([int(t)]) for t in token]
        batch = pa.record_batch([
            pa.array([self.ids[int(i)] for i in text], pa.string()),
            pa.array(np.asarray(position, dtype=np.int64)),
            pa.array(np.asarray(token, dtype=np.int64)),
            pa.array([str(t) for t in tok], pa.string()),
            pa.array(np.asarray(nll, dtype=np.float64)),
        ], schema=self.schema)
        self._writer.write_batch(batch)
        self.n_rows += len(nll)

    def __exit__(self, exc_type, *exc) -> None:
        assert self._writer is not None and self._tmp is not None
        self._writer.close()
        if exc_type is None:
            from .._io import record_written

            os.replace(self._tmp, self.path)  # whole file or nothing
            record_written(self.path)
        else:
            self._tmp.unlink(missing_ok=True)
