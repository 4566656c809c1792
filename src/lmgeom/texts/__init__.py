"""Texts: the :class:`TextSet` container and every way to get one.

Sources (``spec`` strings for :func:`load_texts`)::

    builtin:NAME               built-in offline corpora (wiki, news, science, math, code,
                               domains, sentiment), fetched once into the cache
    path/to/file.txt           one text per line (split="paragraphs": per blank-line block)
    path/to/file.jsonl|.csv|.tsv|.parquet
                               a text column ("text", or the only string column) and an
                               optional label column ("label")
    hf:NAME[:CONFIG][:SPLIT]   a Hugging Face dataset (needs ``datasets`` and a reachable hub)

Text files are UTF-8 (BOM or not), or UTF-16/32 with a BOM or mostly ASCII; CSV/TSV rows must
have as many fields as the header. Anything else is refused with a one-line ``TextsError``.

Example::

    from lmgeom.texts import load_texts
    ts = load_texts("builtin:domains", limit=250, seed=0)   # 50 per domain
    ts.label_counts()   # {'code': 50, 'math': 50, 'news': 50, 'science': 50, 'wiki': 50}
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._io import sha256_file
from ..errors import TextsError
from .builtin import (
    BUILTIN_NAMES,
    CORPORA,
    DOMAINS,
    WHEELS,
    corpora_dir,
    fetch_builtin,
    is_fetched,
    list_builtin,
    load_builtin,
)
from .files import load_file
from .reading import SUPPORTED_EXTENSIONS
from .summary import builtin_table, describe
from .textset import TextSet, make_textset, nested_sample_indices, sample_indices

__all__ = [
    "source_fingerprint",
    "BUILTIN_NAMES",
    "CORPORA",
    "DOMAINS",
    "SUPPORTED_EXTENSIONS",
    "WHEELS",
    "TextSet",
    "as_textset",
    "builtin_table",
    "corpora_dir",
    "describe",
    "fetch_builtin",
    "is_fetched",
    "limit_textset",
    "list_builtin",
    "load_texts",
    "nested_sample_indices",
    "sample_indices",
]


def limit_textset(ts: TextSet, limit: int | None, seed: int = 0) -> TextSet:
    """A seeded sample of ``limit`` texts (original order kept, balanced across labels as far
    as possible); ``limit=None`` or ``limit >= len(ts)`` returns ``ts`` itself."""
    if limit is None:
        return ts
    idx = sample_indices(len(ts), limit, labels=ts.labels, seed=seed)
    if len(idx) == len(ts):
        return ts
    sub = ts.subset(idx)
    return dataclasses.replace(sub, source=f"{ts.source} [limit {limit}, seed {seed}]")


def load_texts(
    spec: str | os.PathLike[str],
    *,
    limit: int | None = None,
    seed: int = 0,
    split: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
) -> TextSet:
    """Load a corpus by spec (see the module docstring).

    Args:
        spec: ``builtin:NAME``, a local file path, or ``hf:NAME[:CONFIG][:SPLIT]``.
        limit: keep a seeded sample of this many texts (``numpy.random.default_rng(seed)``,
            without replacement, original order kept, balanced across labels as far as the
            counts allow); ``None`` or ``limit >= len`` keeps everything.
        seed: seed of that sample.
        split: ``.txt``: ``"lines"`` (default) or ``"paragraphs"``; ``hf:``: the dataset split.
        text_column: table-like files / hf: the column holding the texts.
        label_column: table-like files / hf: the column holding labels (default ``label``
            when present).

    Returns:
        The :class:`TextSet`; empty/whitespace texts are dropped and counted in ``n_dropped``.

    Raises:
        TextsError: with a one-line message saying what is wrong and what to do.
    """
    if isinstance(spec, TextSet) or not isinstance(spec, (str, os.PathLike)):
        raise TextsError(
            f"load_texts takes a spec string or path, got {type(spec).__name__}; "
            "use as_textset() for TextSets and lists of strings"
        )
    s = os.fspath(spec)
    if s.startswith("builtin:"):
        if split is not None or text_column is not None or label_column is not None:
            raise TextsError(
                f"{s} takes no split/text_column/label_column (those are for files and hf:)"
            )
        ts = load_builtin(s[len("builtin:") :].strip())
    elif s.startswith("hf:"):
        from .hf import load_hf

        ts = load_hf(s[3:], split=split, text_column=text_column, label_column=label_column)
    elif not s.strip():
        raise TextsError(
            "empty corpus spec; give builtin:NAME ("
            + ", ".join(BUILTIN_NAMES)
            + "), a file path, or hf:NAME"
        )
    else:
        ts = load_file(s, split=split, text_column=text_column, label_column=label_column)
    return limit_textset(ts, limit, seed)


def source_fingerprint(spec: str | os.PathLike[str]) -> str | None:
    """A content hash of a corpus spec's source, without parsing it: the sha256 of a local
    file's bytes; ``None`` for ``builtin:`` (fixed by the installed packages and lmgeom's
    version) and ``hf:`` specs (versioned by the hub), and for a path that is not a file.
    What a result keyed by a spec string must also be keyed by, so an edited file recomputes."""
    s = os.fspath(spec)
    if s.startswith(("builtin:", "hf:")):
        return None
    p = Path(s).expanduser()
    try:
        if not p.is_file():
            return None

        return sha256_file(p)
    except OSError:
        return None


def as_textset(obj: Any, *, limit: int | None = None, seed: int = 0) -> TextSet:
    """Coerce ``obj`` to a :class:`TextSet`.

    Args:
        obj: a TextSet (returned as is), a list/tuple/array of strings (ids ``"0".."N-1"``,
            source ``"list"``; empty strings dropped), or a spec string/path for
            :func:`load_texts`.
        limit, seed: as for :func:`load_texts`.

    Raises:
        TextsError: ``obj`` is none of these, or holds no non-empty strings.
    """
    if isinstance(obj, TextSet):
        ts = obj
    elif isinstance(obj, (str, os.PathLike)):
        return load_texts(obj, limit=limit, seed=seed)
    elif isinstance(obj, (list, tuple, np.ndarray)) or (
        isinstance(obj, Sequence) and not isinstance(obj, (bytes, bytearray))
    ):
        items = list(obj.tolist() if isinstance(obj, np.ndarray) else obj)
        ts = make_textset(
            [str(i) for i in range(len(items))], items, None, "list", what="list of texts"
        )
    else:
        raise TextsError(
            f"cannot make a TextSet from a {type(obj).__name__}; pass a TextSet, a list of "
            "strings, or a spec (builtin:NAME, a file path, hf:NAME)"
        )
    return limit_textset(ts, limit, seed)
