"""``hf:NAME[:CONFIG][:SPLIT]`` through the optional ``datasets`` package (imported lazily).

This is the only loader that may touch the network; machines without a model hub get a
:class:`~lmgeom.errors.TextsError` that points at the built-in corpora and local files.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import TextsError
from .files import frame_to_textset
from .textset import TextSet

__all__ = ["load_hf", "parse_hf_spec"]

log = logging.getLogger(__name__)

_OFFLINE_HINT = (
    "use a built-in corpus instead (builtin:domains, builtin:wiki, ...; `lmgeom texts` lists "
    "them) or a local .txt/.jsonl/.csv/.parquet file"
)


def parse_hf_spec(rest: str) -> tuple[str, str | None, str | None]:
    """``"NAME[:CONFIG][:SPLIT]"`` → ``(name, config, split)`` (empty parts → ``None``)."""
    parts = rest.split(":")
    if len(parts) > 3 or not parts[0].strip():
        raise TextsError(
            f"hf:{rest} is not a dataset spec; write hf:NAME, hf:NAME:CONFIG or "
            "hf:NAME:CONFIG:SPLIT (e.g. hf:ag_news::test)"
        )
    name = parts[0].strip()
    config = parts[1].strip() or None if len(parts) > 1 else None
    split = parts[2].strip() or None if len(parts) > 2 else None
    return name, config, split


def load_hf(
    rest: str,
    *,
    split: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
) -> TextSet:
    """Load a Hugging Face dataset split as a TextSet.

    Args:
        rest: the spec after ``hf:`` (``NAME[:CONFIG][:SPLIT]``).
        split: overrides the split in the spec; default ``train`` if the dataset has one, else
            its first split.
        text_column, label_column: as for local files; ``ClassLabel`` columns are turned into
            their label names.

    Raises:
        TextsError: ``datasets`` is not installed, or the dataset cannot be loaded (e.g. the
            hub is unreachable).
    """
    name, config, spec_split = parse_hf_spec(rest)
    split = split or spec_split
    try:
        import datasets
    except ImportError:
        raise TextsError(
            f"hf:{rest} needs the 'datasets' package, which is not installed "
            f"(pip install 'lmgeom[hf]'); or {_OFFLINE_HINT}"
        ) from None
    try:
        ds: Any = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # noqa: BLE001 - the hub client raises many unrelated types
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TextsError(
            f"could not load Hugging Face dataset {name!r}"
            f"{f' (config {config!r})' if config else ''}{f' split {split!r}' if split else ''}: "
            f"{type(exc).__name__}: {first}; the hub may be unreachable from this machine — "
            f"{_OFFLINE_HINT}"
        ) from None
    if hasattr(ds, "keys") and not hasattr(ds, "features"):  # a DatasetDict: pick a split
        splits = list(ds.keys())
        if not splits:
            raise TextsError(f"Hugging Face dataset {name!r} has no splits")
        split = "train" if "train" in splits else splits[0]
        log.info("hf:%s: using split %r (available: %s)", name, split, ", ".join(splits))
        ds = ds[split]
    frame = ds.to_pandas()
    features = getattr(ds, "features", {}) or {}
    for col, feat in dict(features).items():
        names = getattr(feat, "names", None)
        if names and col in frame.columns and type(feat).__name__ == "ClassLabel":
            frame[col] = [
                names[i] if isinstance(i, int) and 0 <= i < len(names) else str(i)
                for i in frame[col].tolist()
            ]
    source = f"hf:{name}{':' + config if config else ''}{':' + split if split else ''}"
    return frame_to_textset(source, frame, text_column, label_column, source, lambda i: f"row {i}")
