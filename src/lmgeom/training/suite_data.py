"""The data of a width suite: the train / validation split of the corpora
(:meth:`~lmgeom.texts.TextSet.split`), the shared byte-level BPE tokenizer and the tokenised
streams, built once into ``DIR/data`` and ``DIR/tokenizer`` and checked on every reuse."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import sha256_bytes, stable_hash, write_json
from ..errors import CacheError, DataError
from ..texts import load_texts
from ..texts.textset import TextSet
from .suite_config import SuiteConfig
from .tokenizer import tokenizer_sha256, train_tokenizer

log = logging.getLogger("lmgeom.training.suite")


@dataclass
class SuiteData:
    """The tokenised streams and the tokenizer of a suite."""

    train: np.ndarray  # (n_train_tokens,) token ids, documents separated by EOS
    val: np.ndarray  # (n_val_tokens,)
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)

    def n_chunks(self, seq_len: int) -> int:
        return len(self.train) // seq_len

    def val_chunks(self, seq_len: int, val_tokens: int) -> np.ndarray:
        """``(m, seq_len)`` held-out chunks, the first ``val_tokens // seq_len`` of the stream."""
        m = min(len(self.val) // seq_len, max(1, val_tokens // seq_len))
        if m < 1:
            raise DataError(
                f"the held-out split has {len(self.val)} tokens, fewer than one sequence of "
                f"{seq_len}; raise val_fraction or add texts"
            )
        return self.val[: m * seq_len].reshape(m, seq_len).astype(np.int64)

    def chunks(self, idx: np.ndarray, seq_len: int) -> np.ndarray:
        """``(len(idx), seq_len)`` int64: training chunks ``idx`` (chunk i = tokens
        ``i · seq_len ... (i + 1) · seq_len − 1`` of the stream)."""
        T = int(seq_len)
        return np.stack([self.train[i * T : (i + 1) * T] for i in idx]).astype(np.int64)


def _load_docs(config: SuiteConfig) -> tuple[TextSet, dict[str, Any]]:
    """Every training text of the corpora (those of ``exclude_texts`` removed), in order."""
    excluded: set[str] = set()
    sources: dict[str, Any] = {}
    for spec in config.exclude_texts:
        ts = load_texts(spec)
        excluded.update(ts.texts)
        sources[f"exclude:{spec}"] = {"n": len(ts), "hash": ts.hash}
    docs: list[str] = []
    for spec in config.texts:
        ts = load_texts(spec)
        kept = [t for t in ts.texts if t not in excluded]
        docs.extend(kept)
        sources[spec] = {"n": len(ts), "kept": len(kept), "hash": ts.hash,
                         "chars": int(sum(len(t) for t in kept))}
    if len(docs) < 2:
        raise DataError(f"the training corpora hold {len(docs)} usable texts; need at least 2")
    return TextSet(ids=tuple(map(str, range(len(docs)))), texts=tuple(docs),
                   source="+".join(config.texts)), sources


def prepare_data(root: str | os.PathLike[str], config: SuiteConfig, *, progress: bool | None = None) -> SuiteData:
    """Split, tokenizer and tokenised streams of a suite: built once into ``root/data`` and
    ``root/tokenizer``, reused afterwards (checked against ``data.json``)."""
    from transformers import AutoTokenizer


    root = Path(root)
    data_dir, tok_dir = root / "data", root / "tokenizer"
    info_path = data_dir / "data.json"
    want = config.data_settings()
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("settings") != want:
            raise CacheError(f"{data_dir} was built with other settings; use a new --out")
        train = np.load(data_dir / "train.npy", allow_pickle=False)
        val = np.load(data_dir / "val.npy", allow_pickle=False)
        tok = AutoTokenizer.from_pretrained(tok_dir)
        if _stream_hash(train, val, tokenizer_sha256(tok)) != info.get("data_hash"):
            raise CacheError(f"{data_dir} does not match its recorded hash (corrupt?); delete "
                             "the suite folder's data/ and tokenizer/ to rebuild them")
        return SuiteData(train, val, tok, info)

    t0 = time.perf_counter()
    docs, sources = _load_docs(config)
    train_set, val_set = docs.split(config.val_fraction, config.seed, stream=0)
    train_docs, val_docs = list(train_set.texts), list(val_set.texts)
    order = np.random.default_rng([config.seed, 1]).permutation(len(train_docs))
    t1 = time.perf_counter()
    tok = train_tokenizer((train_docs[i] for i in order), config.vocab_size,
                          max_chars=config.tokenizer_chars,
                          model_max_length=config.max_position_embeddings)
    t2 = time.perf_counter()
    train = _encode(tok, train_docs)
    val = _encode(tok, val_docs)
    t3 = time.perf_counter()
    tok_sha = tokenizer_sha256(tok)
    info = {
        "settings": want,
        "sources": sources,
        "n_docs": {"train": len(train_docs), "val": len(val_docs)},
        "n_tokens": {"train": len(train), "val": len(val)},
        "vocab_size": len(tok),
        "tokenizer_sha256": tok_sha,
        "data_hash": _stream_hash(train, val, tok_sha),
        "dtype": str(train.dtype),
        "timings": {"load_texts_s": t1 - t0, "tokenizer_s": t2 - t1, "encode_s": t3 - t2},
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp_tok = root / "tokenizer.tmp"
    shutil.rmtree(tmp_tok, ignore_errors=True)
    tok.save_pretrained(tmp_tok)
    shutil.rmtree(tok_dir, ignore_errors=True)
    os.replace(tmp_tok, tok_dir)
    for name, arr in (("train", train), ("val", val)):
        tmp = data_dir / f".{name}.tmp.npy"
        np.save(tmp, arr, allow_pickle=False)
        os.replace(tmp, data_dir / f"{name}.npy")
    write_json(info_path, info)  # last: its presence means the data are complete
    log.info("suite data: %d train / %d val tokens from %d documents (tokenizer %d tokens)",
             len(train), len(val), len(docs), len(tok))
    return SuiteData(train, val, tok, info)


def _encode(tok, docs: Sequence[str]) -> np.ndarray:
    eos = tok.eos_token_id
    dtype = np.uint16 if len(tok) <= np.iinfo(np.uint16).max else np.uint32
    parts = []
    for i in range(0, len(docs), 1024):
        for enc in tok.backend_tokenizer.encode_batch(list(docs[i : i + 1024]), add_special_tokens=False):
            parts.append(np.asarray(enc.ids + [eos], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _stream_hash(train: np.ndarray, val: np.ndarray, tok_sha: str) -> str:
    return stable_hash([sha256_bytes(np.ascontiguousarray(train).tobytes()), str(train.dtype),
                        sha256_bytes(np.ascontiguousarray(val).tobytes()), tok_sha])


__all__ = ["SuiteData", "prepare_data"]
