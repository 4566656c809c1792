"""Local-file loaders: ``.txt``, ``.jsonl``, ``.csv``/``.tsv`` and ``.parquet``.

Every loader returns a :class:`~lmgeom.texts.TextSet`; ids are the record's 0-based position in
the file (before empty texts are dropped) unless the file has an ``id`` column. Reading and
decoding the bytes (UTF-8, UTF-16/32 by byte-order mark or NUL pattern) is
:mod:`lmgeom.texts.reading`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from pathlib import Path
from typing import Any

from ..errors import TextsError
from .reading import (
    SUPPORTED_EXTENSIONS,
    check_file,
    normalise_newlines,
    read_file_bytes,
    read_text_file,
)
from .textset import TextSet, make_textset

__all__ = ["load_file"]

log = logging.getLogger(__name__)

TXT_SPLITS = ("lines", "paragraphs")


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _is_blank_label(v: Any) -> bool:
    """Missing, empty, or the NaN a spreadsheet or pandas wrote as text."""
    return _is_missing(v) or (isinstance(v, str) and (not v.strip() or v.strip().lower() == "nan"))


def _scalar_str(v: Any) -> str:
    """A label or id as a string; integral floats (from NaN-holed int columns) without ``.0``."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _pick_columns(
    columns: list[str],
    string_columns: list[str],
    path: Any,
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
        log.warning(
            "%s: no 'text' column; reading the texts from column %r, the only string column "
            "besides 'id' and the labels (pass --text-column / text_column= to choose another)",
            path,
            tcol,
        )
    if label_column is not None:
        if label_column not in columns:
            raise TextsError(
                f"{path}: no label column {label_column!r}; available columns: {listing}"
            )
        lcol: str | None = label_column
    else:
        lcol = "label" if "label" in columns and tcol != "label" else None
    return tcol, lcol


def _more(n: int, what: str) -> str:
    return f" and {n} more {what}" if n > 0 else ""


def _ids_from_column(path: Any, raw: list[Any], kept: list[int], row_name: Any) -> list[str]:
    """The ``id`` column as strings; every kept row needs one, and no two the same."""
    fix = "rename the 'id' column (e.g. to 'doc_id') to number the texts by position instead"
    blank = [i for i in kept if _is_missing(raw[i]) or not str(raw[i]).strip()]
    if blank:
        raise TextsError(
            f"{path}: column 'id' is empty in {row_name(blank[0])}"
            f"{_more(len(blank) - 1, 'rows')}; fill in the ids or {fix}"
        )
    bad = next((i for i in kept if isinstance(raw[i], (list, dict, tuple))), None)
    if bad is not None:
        raise TextsError(
            f"{path}: column 'id' holds {_a(_json_type(raw[bad]))} in {row_name(bad)}; ids must "
            f"be strings or numbers: fix them or {fix}"
        )
    ids = [_scalar_str(v) for v in raw]
    where: dict[str, list[int]] = {}
    for i in kept:
        where.setdefault(ids[i], []).append(i)
    dups = [(k, rows) for k, rows in where.items() if len(rows) > 1]
    if dups:
        shown = "; ".join(
            f"{k!r} in {', '.join(row_name(i) for i in rows[:3])}{_more(len(rows) - 3, 'rows')}"
            for k, rows in dups[:3]
        )
        raise TextsError(
            f"{path}: column 'id' has duplicate ids: {shown}{_more(len(dups) - 3, 'repeated ids')}"
            f"; ids must be unique: drop the duplicate rows, or {fix}"
        )
    return ids


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _json_type(v: Any) -> str:
    """The JSON name of a decoded value's type (``null``, ``number``, ``array``, ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _from_records(
    path: Any,
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
    listing = ", ".join(repr(c) for c in columns)
    for i, t in enumerate(texts):
        if not _is_missing(t) and not isinstance(t, str):
            raise TextsError(
                f"{path}: column {tcol!r} holds {_a(_json_type(t))} in {row_name(i)}, not text; "
                f"pass text_column= (--text-column) naming a column of strings; available "
                f"columns: {listing}"
            )
    # rows whose text is empty are dropped anyway; only complain about ids/labels of kept rows
    kept = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
    ids: list[str]
    if "id" in columns and tcol != "id":
        ids = _ids_from_column(path, list(get("id")), kept, row_name)
    else:
        ids = [str(i) for i in range(n)]
    labels = None
    if lcol is not None:
        raw = list(get(lcol))
        missing = [i for i in kept if _is_blank_label(raw[i])]
        if missing:
            raise TextsError(
                f"{path}: label column {lcol!r} is empty in {row_name(missing[0])}"
                f"{_more(len(missing) - 1, 'rows')}; fill it in or load without labels "
                "(label_column=None and no 'label' column)"
            )
        bad = next((i for i in kept if isinstance(raw[i], (list, dict, tuple))), None)
        if bad is not None:
            raise TextsError(
                f"{path}: label column {lcol!r} holds {_a(_json_type(raw[bad]))} in "
                f"{row_name(bad)}; labels must be strings or numbers: fix the column or pass "
                f"label_column= (--label-column) naming another; available columns: {listing}"
            )
        labels = [_scalar_str(v) for v in raw]
    what = f"{path} (column {tcol!r})"
    return make_textset(ids, texts, labels, source, what=what)


def _load_txt(path: Path, split: str | None, source: str) -> TextSet:
    split = split or "lines"
    if split not in TXT_SPLITS:
        raise TextsError(
            f"split={split!r} is not a way to split a .txt file; use one of {', '.join(TXT_SPLITS)}"
        )
    content = normalise_newlines(read_text_file(path, allow_empty=False))
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
    # split on line breaks only: str.splitlines() would also split inside JSON strings that
    # hold U+2028, U+0085, form feeds, ... (valid unescaped in JSON)
    content = normalise_newlines(read_text_file(path, allow_empty=False))
    records: list[dict[str, Any]] = []
    line_of: list[int] = []
    for lineno, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TextsError(
                f"{path}: line {lineno} is not valid JSON ({exc.msg} at column {exc.colno}); "
                "each line of a .jsonl file must be one JSON object"
            ) from None
        except RecursionError:
            raise TextsError(
                f"{path}: line {lineno} nests JSON too deeply to read; each line of a .jsonl "
                'file must be one flat JSON object, e.g. {"text": "...", "label": "..."}'
            ) from None
        if isinstance(obj, str):
            obj = {"text": obj}
        if not isinstance(obj, dict):
            raise TextsError(
                f"{path}: line {lineno} is {_a('JSON ' + _json_type(obj))}, not an object; "
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


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _load_delimited(
    path: Path, sep: str, text_column: str | None, label_column: str | None, source: str
) -> TextSet:
    """A ``.csv``/``.tsv`` file: a header row, then rows of exactly as many fields.

    Read with :mod:`csv` (RFC 4180 quoting, strict), never with an implicit index column: a row
    with more or fewer fields than the header is refused with its line number instead of
    shifting its fields into an index. A blank line is an empty text (dropped and counted).
    """
    kind = "TSV" if sep == "\t" else "CSV"
    sep_name = "a tab" if sep == "\t" else "','"
    content = normalise_newlines(read_text_file(path, allow_empty=False))
    old_limit = csv.field_size_limit()
    csv.field_size_limit(max(old_limit, len(content) + 1))  # a very long field is still one
    header: list[str] | None = None
    rows: list[list[str]] = []
    line_of: list[int] = []
    reader = csv.reader(io.StringIO(content, newline=""), delimiter=sep, strict=True)
    start = 1
    try:
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            if header is None:
                if not "".join(row).strip():
                    raise TextsError(
                        f"{path}: line {start} is blank; a {kind} file starts with a header "
                        f"row naming its columns (e.g. text{sep}label)"
                    )
                other = next((s for s in (",", "\t", ";") if s != sep and s in row[0]), None)
                if len(row) == 1 and other is not None:
                    suggest = {",": "name it .csv", "\t": "name it .tsv"}.get(
                        other, f"save it with {sep_name} between fields"
                    )
                    raise TextsError(
                        f"{path}: the header (line {start}) is one column named {row[0]!r}; "
                        f"the file seems to separate fields with {other!r}, not {sep_name}: "
                        f"{suggest}"
                    )
                header = [c if c else f"Unnamed: {k}" for k, c in enumerate(row)]
                dup = next((c for k, c in enumerate(header) if c in header[:k]), None)
                if dup is not None:
                    raise TextsError(
                        f"{path}: the header (line {start}) names column {dup!r} twice; give "
                        "every column a distinct name"
                    )
                continue
            if len(row) != len(header):
                if len(row) <= 1 and not "".join(row).strip():
                    row = [""] * len(header)  # a blank line: an empty text
                else:
                    raise TextsError(
                        f"{path}: line {start} has {len(row)} fields but the header has "
                        f"{len(header)} ({', '.join(repr(c) for c in header)}); quote fields "
                        f'that contain {sep_name}, a quote or a line break ("like, this"), '
                        "or fix the header"
                    )
            rows.append(row)
            line_of.append(start)
    except csv.Error as exc:
        raise TextsError(
            f"{path}: line {start} is not valid {kind} ({exc}); a field holding a quote, "
            f"{sep_name} or a line break must be wrapped in double quotes, with inner quotes "
            'doubled ("say ""hi""")'
        ) from None
    finally:
        csv.field_size_limit(old_limit)
    if header is None:
        raise TextsError(
            f"{path} is empty; give a {kind} file with a header row (e.g. text{sep}label) and "
            "one row per text"
        )
    columns = header
    string_columns = [
        c for k, c in enumerate(columns) if any(r[k].strip() and not _is_number(r[k]) for r in rows)
    ]

    def get(col: str) -> list[Any]:
        k = columns.index(col)
        return [r[k] for r in rows]

    if not rows:
        raise TextsError(
            f"{path} has only a header row ({', '.join(repr(c) for c in columns)}) and no "
            "texts; give a corpus with at least one row"
        )
    return _from_records(
        path,
        columns,
        string_columns,
        get,
        len(rows),
        text_column,
        label_column,
        source,
        lambda i: f"line {line_of[i]}",
    )


def _load_parquet(
    path: Path, text_column: str | None, label_column: str | None, source: str
) -> TextSet:
    data = read_file_bytes(path)
    if not data:
        raise TextsError(f"{path} is empty (0 bytes), not a Parquet file; give a Parquet file")
    import pandas as pd

    try:
        frame = pd.read_parquet(io.BytesIO(data))
    except ImportError as exc:
        raise TextsError(
            f"reading {path} needs a Parquet engine ({exc}); pip install pyarrow, or save the "
            "texts as .jsonl/.csv"
        ) from None
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, TypeError...
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TextsError(
            f"{path} could not be read as Parquet ({type(exc).__name__}: {first}); give a "
            "Parquet file (or a .txt/.jsonl/.csv file with that extension)"
        ) from None
    if any(name is not None for name in frame.index.names):  # a named index (e.g. "id"): a column
        frame = frame.reset_index()
    return frame_to_textset(path, frame, text_column, label_column, source, lambda i: f"row {i}")


def frame_to_textset(
    path: Any,
    frame: Any,
    text_column: str | None,
    label_column: str | None,
    source: str,
    row_name: Any,
) -> TextSet:
    """A TextSet from a ``pandas.DataFrame`` (Parquet files, Hugging Face datasets)."""
    columns = [str(c) for c in frame.columns]
    dup = next((c for k, c in enumerate(columns) if c in columns[:k]), None)
    if dup is not None:
        raise TextsError(f"{path}: column {dup!r} occurs twice; give every column a distinct name")
    frame = frame.copy()
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
    * ``.csv`` / ``.tsv`` (header row, every row as many fields as the header) and ``.parquet``.

    Text files may be UTF-8 (with or without a BOM), or UTF-16/32 with a BOM or mostly ASCII;
    ``\\r\\n`` and ``\\r`` line endings are read as ``\\n``.

    For table-like files the text column is ``text_column``, else ``text``, else the only
    string column (a warning names it); the label column is ``label_column``, else ``label`` if
    present. An ``id`` column, if present, supplies the ids (they must be unique).

    Raises:
        TextsError: missing or unreadable file, unsupported extension, undecodable text or a
            binary file, invalid JSON/CSV (names the line), missing column, duplicate ids, or no
            non-empty texts.
    """
    try:
        p = Path(path).expanduser()
    except RuntimeError:  # "~user/..." for an unknown user
        p = Path(path)
    ext = p.suffix.lower()
    check_file(p)
    if ext not in SUPPORTED_EXTENSIONS:
        hint = (
            " (a .json file: write one object per line and name it .jsonl)"
            if ext == ".json"
            else ""
        )
        raise TextsError(
            f"{p}: unsupported file type {ext or '(no extension)'!r}{hint}; supported: "
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
    if ext in (".csv", ".tsv"):
        return _load_delimited(p, "\t" if ext == ".tsv" else ",", text_column, label_column, source)
    return _load_parquet(p, text_column, label_column, source)
