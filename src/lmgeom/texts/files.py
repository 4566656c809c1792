"""Local-file loaders: ``.txt``, ``.jsonl``, ``.csv``/``.tsv`` and ``.parquet``.

Every loader returns a :class:`~lmgeom.texts.TextSet`; ids are the record's 0-based position in
the file (before empty texts are dropped) unless the file has an ``id`` column.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

from ..errors import TextsError
from .textset import TextSet, make_textset

__all__ = ["SUPPORTED_EXTENSIONS", "load_file", "read_utf8"]

#: File name endings :func:`load_file` understands.
SUPPORTED_EXTENSIONS: tuple[str, ...] = (".txt", ".jsonl", ".ndjson", ".csv", ".tsv", ".parquet")
TXT_SPLITS = ("lines", "paragraphs")


def read_utf8(path: Path) -> str:
    """Read ``path`` as UTF-8 (a BOM is accepted).

    Raises:
        TextsError: the bytes are not valid UTF-8 (names the file and the byte offset).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        offset = exc.start
        raise TextsError(
            f"{path} is not valid UTF-8: byte 0x{data[offset]:02x} at byte offset {offset} "
            f"({exc.reason}); re-save the file as UTF-8"
        ) from None


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _pick_columns(
    columns: list[str],
    string_columns: list[str],
    path: Path,
    text_column: str | None,
    label_column: str | None,
) -> tuple[str, str | None]:
    """Choose the text and label columns (see :func:`load_file`)."""
    listing = ", ".join(repr(c) for c in columns) or "none"
    if text_column is not None:
        if text_column not in columns:
            raise TextsError(
                f"{path}: no text column {text_column!r}; available columns: {listing}"
            )
        tcol = text_column
    elif "text" in columns:
        tcol = "text"
    else:
        candidates = [c for c in string_columns if c not in ("id", "label", label_column)]
        if len(candidates) != 1:
            raise TextsError(
                f"{path}: no 'text' column and {len(candidates) or 'no'} other string columns to "
                f"choose from; pass text_column= (--text-column); available columns: {listing}"
            )
        tcol = candidates[0]
    if label_column is not None:
        if label_column not in columns:
            raise TextsError(
                f"{path}: no label column {label_column!r}; available columns: {listing}"
            )
        lcol: str | None = label_column
    else:
        lcol = "label" if "label" in columns and tcol != "label" else None
    return tcol, lcol


def _from_records(
    path: Path,
    columns: list[str],
    string_columns: list[str],
    get: Any,
    n: int,
    text_column: str | None,
    label_column: str | None,
    source: str,
    row_name: Any,
) -> TextSet:
    """Shared column logic for table-like files. ``get(col)`` returns the column's values."""
    tcol, lcol = _pick_columns(columns, string_columns, path, text_column, label_column)
    texts = list(get(tcol))
    ids: list[str]
    if "id" in columns and tcol != "id":
        ids = [str(v) for v in get("id")]
    else:
        ids = [str(i) for i in range(n)]
    labels = None
    if lcol is not None:
        raw = list(get(lcol))
        missing = [
            i for i, v in enumerate(raw) if _is_missing(v) or (isinstance(v, str) and not v.strip())
        ]
        # rows whose text is empty are dropped anyway; only complain about kept rows
        missing = [i for i in missing if isinstance(texts[i], str) and texts[i].strip()]
        if missing:
            raise TextsError(
                f"{path}: label column {lcol!r} is empty in {row_name(missing[0])}"
                f"{f' and {len(missing) - 1} more rows' if len(missing) > 1 else ''}; "
                "fill it in or load without labels (label_column=None and no 'label' column)"
            )
        labels = [str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in raw]
    what = f"{path} (column {tcol!r})"
    for i, t in enumerate(texts):
        if not _is_missing(t) and not isinstance(t, str):
            raise TextsError(
                f"{path}: column {tcol!r} holds a {type(t).__name__} in {row_name(i)}, not text; "
                f"pass text_column= naming a column of strings; available columns: "
                + ", ".join(repr(c) for c in columns)
            )
    return make_textset(ids, texts, labels, source, what=what)


def _load_txt(path: Path, split: str | None, source: str) -> TextSet:
    split = split or "lines"
    if split not in TXT_SPLITS:
        raise TextsError(
            f"split={split!r} is not a way to split a .txt file; use one of {', '.join(TXT_SPLITS)}"
        )
    content = read_utf8(path).replace("\r\n", "\n").replace("\r", "\n")
    if split == "lines":
        items = content.split("\n")
        if items and items[-1] == "":
            items.pop()
        texts = [line.strip() for line in items]
    else:
        texts = []
        cur: list[str] = []
        for line in content.split("\n"):
            if line.strip():
                cur.append(line.rstrip())
            elif cur:
                texts.append("\n".join(cur).strip())
                cur = []
        if cur:
            texts.append("\n".join(cur).strip())
    ids = [str(i) for i in range(len(texts))]
    return make_textset(ids, texts, None, f"{source} ({split})", what=str(path))


def _load_jsonl(
    path: Path, text_column: str | None, label_column: str | None, source: str
) -> TextSet:
    content = read_utf8(path)
    records: list[dict[str, Any]] = []
    line_of: list[int] = []
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TextsError(
                f"{path}: line {lineno} is not valid JSON ({exc.msg} at column {exc.colno}); "
                "each line of a .jsonl file must be one JSON object"
            ) from None
        if isinstance(obj, str):
            obj = {"text": obj}
        if not isinstance(obj, dict):
            raise TextsError(
                f"{path}: line {lineno} is a JSON {type(obj).__name__}, not an object; "
                'write one object per line, e.g. {"text": "...", "label": "..."}'
            )
        records.append(obj)
        line_of.append(lineno)
    columns: list[str] = []
    seen: set[str] = set()
    for r in records:
        for k in r:
            if k not in seen:
                seen.add(k)
                columns.append(k)
    string_columns = [
        c
        for c in columns
        if all(isinstance(r.get(c), str) or r.get(c) is None for r in records)
        and any(isinstance(r.get(c), str) for r in records)
    ]
    if not records:
        raise TextsError(f"{path} has no texts (no JSON lines); give a non-empty corpus")

    def get(col: str) -> list[Any]:
        return [r.get(col) for r in records]

    return _from_records(
        path,
        columns,
        string_columns,
        get,
        len(records),
        text_column,
        label_column,
        source,
        lambda i: f"line {line_of[i]}",
    )


def frame_to_textset(
    path: Path,
    frame: Any,
    text_column: str | None,
    label_column: str | None,
    source: str,
    row_name: Any,
) -> TextSet:
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    string_columns = []
    for c in columns:
        vals = [v for v in frame[c].tolist() if not _is_missing(v)]
        if vals and all(isinstance(v, str) for v in vals):
            string_columns.append(c)

    def get(col: str) -> list[Any]:
        return frame[col].tolist()

    return _from_records(
        path,
        columns,
        string_columns,
        get,
        len(frame),
        text_column,
        label_column,
        source,
        row_name,
    )


def load_file(
    path: str | Path,
    *,
    split: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
) -> TextSet:
    """Load texts from a local file.

    * ``.txt``: one text per non-empty line (``split="lines"``, the default) or per block of
      lines separated by blank lines (``split="paragraphs"``).
    * ``.jsonl`` / ``.ndjson``: one JSON object per line.
    * ``.csv`` / ``.tsv`` (UTF-8, header row) and ``.parquet``.

    For table-like files the text column is ``text_column``, else ``text``, else the only
    string column; the label column is ``label_column``, else ``label`` if present. An ``id``
    column, if present, supplies the ids.

    Raises:
        TextsError: missing file, unsupported extension, invalid UTF-8 or JSON, missing
            column, or no non-empty texts.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise TextsError(
            f"no such file: {p}; give a path to an existing "
            f"{'/'.join(SUPPORTED_EXTENSIONS)} file, builtin:NAME, or hf:NAME"
        )
    if p.is_dir():
        raise TextsError(f"{p} is a directory; give a file ({'/'.join(SUPPORTED_EXTENSIONS)})")
    ext = p.suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise TextsError(
            f"{p}: unsupported file type {ext or '(no extension)'!r}; supported: "
            f"{', '.join(SUPPORTED_EXTENSIONS)} (or builtin:NAME / hf:NAME)"
        )
    source = f"file:{p}"
    if split is not None and ext != ".txt":
        raise TextsError(
            f"split={split!r} only applies to .txt files (lines|paragraphs) and hf: datasets"
        )
    if ext == ".txt":
        if text_column is not None or label_column is not None:
            raise TextsError(f"{p}: a .txt file has no columns; drop text_column/label_column")
        return _load_txt(p, split, source)
    if ext in (".jsonl", ".ndjson"):
        return _load_jsonl(p, text_column, label_column, source)
    import pandas as pd

    if ext in (".csv", ".tsv"):
        content = read_utf8(p)
        try:
            frame = pd.read_csv(
                io.StringIO(content),
                sep="\t" if ext == ".tsv" else ",",
                keep_default_na=False,
                na_values=[],
                skip_blank_lines=False,  # a blank line is an empty text: dropped and counted
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise TextsError(f"{p} could not be parsed as {ext[1:].upper()}: {exc}") from None
        return frame_to_textset(
            p, frame, text_column, label_column, source, lambda i: f"data row {i + 1}"
        )
    try:
        frame = pd.read_parquet(p)
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError, ArrowIOError an OSError
        raise TextsError(f"{p} could not be read as Parquet: {exc}") from None
    return frame_to_textset(p, frame, text_column, label_column, source, lambda i: f"row {i}")
