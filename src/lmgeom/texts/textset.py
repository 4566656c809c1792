"""The :class:`TextSet` container and the seeded, label-balanced subsampling behind ``limit=``."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..errors import ConfigError, TextsError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["TextSet", "make_textset", "nested_sample_indices", "sample_indices"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=True, repr=False)
class TextSet:
    """An ordered, immutable collection of texts with ids and optional labels.

    Attributes:
        ids: ``(N,)`` unique identifiers (e.g. ``"Anarchism#3"``, a line number).
        texts: ``(N,)`` the texts, none empty.
        labels: ``(N,)`` class labels as strings, or ``None`` for an unlabeled set.
        source: human description of where the texts came from.
        n_dropped: number of empty/whitespace-only texts dropped when the set was loaded.

    Indexing with an int returns the text; with a slice, an index sequence/array or a boolean
    mask it returns a new :class:`TextSet` (see :meth:`subset`).
    """

    ids: tuple[str, ...]
    texts: tuple[str, ...]
    labels: tuple[str, ...] | None = None
    source: str = ""
    n_dropped: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        ids = tuple(self.ids)
        texts = tuple(self.texts)
        labels = None if self.labels is None else tuple(self.labels)
        if len(ids) != len(texts):
            raise TextsError(
                f"TextSet needs one id per text (got {len(ids)} ids, {len(texts)} texts)"
            )
        if labels is not None and len(labels) != len(texts):
            raise TextsError(
                f"TextSet needs one label per text (got {len(labels)} labels, {len(texts)} texts)"
            )
        for name, values in (("ids", ids), ("texts", texts), ("labels", labels or ())):
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise TextsError(
                    f"TextSet {name} must be strings; item {bad} is {type(values[bad]).__name__}"
                )
        if len(set(ids)) != len(ids):
            dups = [(k, c) for k, c in Counter(ids).items() if c > 1]
            shown = ", ".join(f"{k!r} ({c} times)" for k, c in dups[:5])
            more = f" and {len(dups) - 5} more" if len(dups) > 5 else ""
            raise TextsError(
                f"TextSet ids must be unique ({self.source or 'no source'}): {shown}{more} "
                "repeat; give one distinct id per text (or drop the duplicate texts)"
            )
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "texts", texts)
        object.__setattr__(self, "labels", labels)

    # -- container protocol ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts)

    @overload
    def __getitem__(self, key: int) -> str: ...
    @overload
    def __getitem__(self, key: slice | Sequence[int] | np.ndarray) -> TextSet: ...

    def __getitem__(self, key: Any) -> str | TextSet:
        if isinstance(key, (int, np.integer)):
            return self.texts[int(key)]
        if isinstance(key, slice):
            return self.subset(range(len(self))[key])
        return self.subset(key)

    def __repr__(self) -> str:
        lab = f", labels={len(self.label_names or ())}" if self.labels is not None else ""
        return f"TextSet(n={len(self)}{lab}, source={self.source!r})"

    # -- derived -----------------------------------------------------------------------------
    @functools.cached_property
    def hash(self) -> str:
        """sha256 (hex) over ids, texts and labels: equal content ⇔ equal hash."""
        h = hashlib.sha256()
        h.update(b"lmgeom.TextSet/v1\n")
        for part in (self.ids, self.texts, self.labels):
            h.update(json.dumps(part, ensure_ascii=False).encode("utf-8"))
            h.update(b"\n")
        return h.hexdigest()

    @property
    def label_names(self) -> tuple[str, ...] | None:
        """Sorted unique labels, or ``None`` for an unlabeled set."""
        return None if self.labels is None else tuple(sorted(set(self.labels)))

    def label_counts(self) -> dict[str, int] | None:
        """``{label: count}`` in :attr:`label_names` order, or ``None``."""
        if self.labels is None:
            return None
        c = Counter(self.labels)
        return {k: c[k] for k in sorted(c)}

    @property
    def n_words(self) -> int:
        """Total whitespace-separated words over all texts."""
        return sum(len(t.split()) for t in self.texts)

    def subset(self, indices: Iterable[int] | np.ndarray) -> TextSet:
        """A new TextSet with the texts at ``indices`` (in the given order).

        Args:
            indices: integer positions (negative ones count from the end) or a boolean mask of
                length ``N``.

        Raises:
            TextsError: an index is out of range, repeated, or not an integer.
        """
        idx = np.asarray(list(indices) if not isinstance(indices, np.ndarray) else indices)
        n = len(self)
        if idx.dtype == bool:
            if idx.shape != (n,):
                raise TextsError(f"boolean mask has shape {idx.shape}, expected ({n},)")
            idx = np.flatnonzero(idx)
        elif idx.size == 0:
            idx = idx.astype(np.int64)
        elif not np.issubdtype(idx.dtype, np.integer):
            raise TextsError(f"subset indices must be integers, got dtype {idx.dtype}")
        idx = idx.reshape(-1)
        if idx.size and (idx.max() >= n or idx.min() < -n):
            raise TextsError(f"subset index out of range for a TextSet of {n} texts")
        idx = np.where(idx < 0, idx + n, idx)
        if len(np.unique(idx)) != idx.size:
            raise TextsError("subset indices must not repeat (ids would no longer be unique)")
        pick = idx.tolist()
        return TextSet(
            ids=tuple(self.ids[i] for i in pick),
            texts=tuple(self.texts[i] for i in pick),
            labels=None if self.labels is None else tuple(self.labels[i] for i in pick),
            source=self.source,
            n_dropped=self.n_dropped,
        )

    def split(self, fraction: float, seed: int = 0, *,
              stream: int | None = None) -> tuple[TextSet, TextSet]:
        """Seeded train / held-out split by text: ``(train, heldout)``, the one splitter of
        lmgeom (fine-tuning's held-out texts, the width suite's validation documents, kNN-LM's
        held-out part).

        ``k = round(fraction · N)`` texts, at least 1 and at most ``N − 1``, are held out: the
        first ``k`` of ``numpy.random.default_rng(seed).permutation(N)`` (with ``stream``:
        ``default_rng([seed, stream])``, so two splits of one run can draw from independent
        streams). The rest trains. Both parts keep the set's order; together they hold every
        text exactly once.

        Args:
            fraction: share of the texts held out, in (0, 1).
            seed: the split's seed (a non-negative integer).
            stream: an optional second seed word (a non-negative integer).

        Raises:
            ConfigError: ``fraction`` is not in (0, 1), or ``seed`` / ``stream`` is not a
                non-negative integer.
            TextsError: fewer than 2 texts (nothing could be both trained on and held out).
        """
        f = float(fraction)
        if not (0.0 < f < 1.0):
            raise ConfigError(f"the held-out fraction must be in (0, 1), got {fraction!r}")
        for name, v in (("seed", seed), ("stream", stream)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                                  or v < 0):
                raise ConfigError(f"split {name} must be a non-negative integer, got {v!r}")
        n = len(self)
        if n < 2:
            raise TextsError(f"{self.source or 'the text set'} has {n} text(s): a train / "
                             "held-out split needs at least 2 (one to train on, one to hold out); "
                             "add texts")
        k = int(min(n - 1, max(1, round(f * n))))
        rng = np.random.default_rng(int(seed) if stream is None else [int(seed), int(stream)])
        perm = rng.permutation(n)
        return self.subset(np.sort(perm[k:])), self.subset(np.sort(perm[:k]))

    def to_frame(self) -> pd.DataFrame:
        """A ``pandas.DataFrame`` with columns ``id``, ``text``, ``label`` (if labeled) and
        ``n_words``, one row per text."""
        import pandas as pd

        data: dict[str, Any] = {"id": list(self.ids), "text": list(self.texts)}
        if self.labels is not None:
            data["label"] = list(self.labels)
        data["n_words"] = [len(t.split()) for t in self.texts]
        return pd.DataFrame(data)


def make_textset(
    ids: Sequence[str],
    texts: Sequence[Any],
    labels: Sequence[str] | None,
    source: str,
    *,
    what: str | None = None,
) -> TextSet:
    """Build a TextSet from loader output, dropping empty/whitespace-only texts.

    ``None`` and NaN texts count as empty. Dropped texts are counted in ``n_dropped`` and logged.

    Raises:
        TextsError: nothing is left after dropping, or a text is not a string.
    """
    keep: list[int] = []
    for i, t in enumerate(texts):
        if t is None or (isinstance(t, float) and math.isnan(t)):
            continue
        if not isinstance(t, str):
            raise TextsError(
                f"{what or source}: text {ids[i]!r} is a {type(t).__name__}, not a string; "
                "pick a text column that holds strings (text_column=...)"
            )
        if t.strip():
            keep.append(i)
    n_dropped = len(texts) - len(keep)
    if not keep:
        raise TextsError(
            f"{what or source} has no texts"
            + (f" ({n_dropped} empty or whitespace-only entries were dropped)" if n_dropped else "")
            + "; give a corpus with at least one non-empty text"
        )
    if n_dropped:
        log.warning("%s: dropped %d empty or whitespace-only texts", what or source, n_dropped)
    return TextSet(
        ids=tuple(str(ids[i]) for i in keep),
        texts=tuple(texts[i] for i in keep),
        labels=None if labels is None else tuple(str(labels[i]) for i in keep),
        source=source,
        n_dropped=n_dropped,
    )


def _quotas(counts: dict[str, int], limit: int, rng: np.random.Generator) -> dict[str, int]:
    """Split ``limit`` across labels as evenly as their counts allow (water-filling); the
    remainder of an uneven split goes to randomly chosen labels that still have room."""
    names = sorted(counts, key=lambda k: (counts[k], k))
    quota: dict[str, int] = {}
    remaining = limit
    for i, name in enumerate(names):
        q = min(counts[name], remaining // (len(names) - i))
        quota[name] = q
        remaining -= q
    if remaining:
        room = [k for k in sorted(counts) if counts[k] > quota[k]]
        for k in rng.permutation(room)[:remaining]:
            quota[str(k)] += 1
    return quota


def sample_indices(
    n: int, limit: int, *, labels: Sequence[str] | None = None, seed: int = 0
) -> np.ndarray:
    """Seeded sample of ``limit`` of ``n`` positions without replacement, in increasing order.

    With ``labels`` the sample is balanced across labels as far as their counts allow (each
    label gets ``limit // n_labels`` unless it has fewer texts, whose shortfall is spread over
    the others).

    Args:
        n: number of items.
        limit: sample size; ``limit >= n`` returns ``arange(n)``.
        labels: ``(n,)`` optional labels to balance over.
        seed: seed for ``numpy.random.default_rng``.

    Returns:
        ``(min(limit, n),)`` sorted int64 positions.
    """
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise TextsError(f"limit must be a positive integer, got {limit!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer (the sample of texts is drawn "
                          f"with numpy.random.default_rng(seed)), got {seed!r}")
    if limit >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    if labels is None:
        return np.sort(rng.choice(n, size=int(limit), replace=False)).astype(np.int64)
    lab = np.asarray(labels, dtype=object)
    groups = {k: np.flatnonzero(lab == k) for k in sorted(set(labels))}
    quota = _quotas({k: len(v) for k, v in groups.items()}, int(limit), rng)
    picked = [rng.choice(groups[k], size=quota[k], replace=False) for k in sorted(groups)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def nested_sample_indices(
    n: int, sizes: Sequence[int], *, labels: Sequence[str] | None = None, seed: int = 0
) -> dict[int, np.ndarray]:
    """Seeded samples of each size in ``sizes`` from ``n`` positions, each one inside the next
    larger (an n-ladder: the texts of ``n = 64`` are among those of ``n = 128``).

    One seeded permutation per label (or of all positions without ``labels``); a sample of
    size m takes the head of each label's permutation, as many as that label's balanced quota
    (:func:`sample_indices`' rule) for m. Quotas grow with m, so the samples are nested.

    Returns:
        ``{m: sorted int64 positions}`` for every m in ``sizes`` (``m >= n``: all positions).
    """
    bad = [m for m in sizes if isinstance(m, bool) or not isinstance(m, (int, np.integer))
           or m < 1]
    if bad or not len(sizes):
        raise TextsError(f"ladder sizes must be positive integers, got {list(sizes)!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    lab = np.asarray(labels if labels is not None else ["_"] * n, dtype=object)
    names = sorted(set(lab.tolist()))
    rng = np.random.default_rng(seed)
    orders = {k: rng.permutation(np.flatnonzero(lab == k)) for k in names}
    counts = {k: len(v) for k, v in orders.items()}
    out: dict[int, np.ndarray] = {}
    previous: dict[str, int] = dict.fromkeys(names, 0)
    for m in sorted(set(int(x) for x in sizes)):
        if m >= n:
            out[m] = np.arange(n, dtype=np.int64)
            continue
        quota = _quotas(counts, m, np.random.default_rng([seed, m]))
        # a remainder drawn at random may go to another label than at the smaller size: move
        # the difference so that no label loses a text it had (keeps the samples nested)
        for k in names:  # (m >= the previous size, so some label has a surplus to give)
            while quota[k] < previous[k]:
                j = max((x for x in names if quota[x] > previous[x]),
                        key=lambda x: (quota[x] - previous[x], x))
                quota[j] -= 1
                quota[k] += 1
        picked = [orders[k][: quota[k]] for k in names]
        out[m] = np.sort(np.concatenate(picked)).astype(np.int64)
        previous = quota
    return out
