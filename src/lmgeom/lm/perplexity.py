"""Perplexity of texts without the ``B×T×V`` logits (the forward pass and the chunked readout
are :func:`lmgeom.lm.scoring.forward_chunks`).

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
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import TMP_TAG, atomic_path, check_replaceable, record_written
from ..activations.core import encode_texts
from ..errors import ConfigError, TextsError
from ..results.console import format_table
from ..texts import as_textset
from .scoring import (
    default_position_chunk,
    forward_chunks,
    model_context,
)

__all__ = [
    "PerplexityResult",
    "TextPerplexity",
    "TokenNLLWriter",
    "perplexity",
    "sliding_windows",
]

log = logging.getLogger(__name__)


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
    from ..models import load_model

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
        enc = encode_texts(model, ts.texts, 1 << 62, cap_to_context=False)
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

            os.replace(self._tmp, self.path)  # whole file or nothing
            record_written(self.path)
        else:
            self._tmp.unlink(missing_ok=True)
