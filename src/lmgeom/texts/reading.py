"""Reading a local text file: the path checked, the bytes read and decoded.

Text files are read as UTF-8 (a byte-order mark is stripped). UTF-16 and UTF-32 (either byte
order) are decoded when the file starts with their byte-order mark, or, without one, when the
NUL-byte pattern of mostly-ASCII UTF-16/32 text makes the encoding unambiguous. Anything else
that is not UTF-8, holds NUL bytes (a binary file), or does not parse ends in a one-line
:class:`~lmgeom.errors.TextsError` naming the file and what to do.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import TextsError

log = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "check_file",
    "decode_text",
    "normalise_newlines",
    "read_file_bytes",
    "read_text_file",
    "read_utf8",
]

#: File name endings :func:`load_file` understands.
SUPPORTED_EXTENSIONS: tuple[str, ...] = (".txt", ".jsonl", ".ndjson", ".csv", ".tsv", ".parquet")

# Longest first: the UTF-32-LE mark starts with the UTF-16-LE one.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xfe\xff", "utf-16-be"),
    (b"\xff\xfe", "utf-16-le"),
)
_SNIFF_BYTES = 1 << 16
_RESAVE = "re-save the file as UTF-8"


def _zero_fraction(sample: bytes, start: int, step: int) -> float:
    part = sample[start::step]
    return part.count(0) / len(part) if part else 0.0


def _sniff_wide(data: bytes) -> str | None:
    """UTF-16/32 without a byte-order mark, when the NUL-byte pattern is unambiguous.

    Mostly-ASCII UTF-32 text has three NUL bytes per character (the top one always NUL), and
    mostly-ASCII UTF-16 text has NUL bytes in one byte position only; UTF-8 text has none. The
    caller still decodes strictly, so a wrong guess ends in an error, not in garbage.
    """
    if len(data) >= 4 and len(data) % 4 == 0:
        sample = data[: _SNIFF_BYTES - _SNIFF_BYTES % 4]
        z = [_zero_fraction(sample, k, 4) for k in range(4)]
        if z[3] == 1.0 and z[2] >= 0.9 and z[0] < 0.1:
            return "utf-32-le"
        if z[0] == 1.0 and z[1] >= 0.9 and z[3] < 0.1:
            return "utf-32-be"
    if len(data) >= 2 and len(data) % 2 == 0:
        sample = data[:_SNIFF_BYTES]
        even, odd = _zero_fraction(sample, 0, 2), _zero_fraction(sample, 1, 2)
        if odd >= 0.3 and even < 0.05:
            return "utf-16-le"
        if even >= 0.3 and odd < 0.05:
            return "utf-16-be"
    return None


def _nul_error(name: Any, data: bytes, text: str | None = None, encoding: str = "") -> TextsError:
    if text is not None:  # decoded fine, but holds NUL characters
        first = text.index("\x00")
        return TextsError(
            f"{name} ({encoding}) contains NUL characters (first at character {first}); it is "
            "not plain text: remove them or give a text file"
        )
    n = data.count(0)
    kind = "looks like a binary file, not text" if n * 2 >= len(data) else "is not plain text"
    return TextsError(
        f"{name} contains NUL bytes ({n:,} of {len(data):,} bytes, first at byte offset "
        f"{data.index(0)}); it {kind}: give a UTF-8 text file "
        "(UTF-16/32 text: re-save it as UTF-8 or with a byte-order mark)"
    )


def decode_text(data: bytes, name: Any) -> str:
    """Decode the bytes of a text file (see the module docstring for the encodings).

    Args:
        data: the file's bytes.
        name: the file (or other input) named in error messages.

    Returns:
        The text, without a byte-order mark; ``""`` for an empty file or a lone mark.

    Raises:
        TextsError: not valid UTF-8 (names the byte and its offset), not valid in the encoding
            its byte-order mark or NUL pattern announces, or holds NUL bytes.
    """
    encoding, skip, how = "utf-8", 0, ""
    for bom, enc in _BOMS:
        if data.startswith(bom):
            encoding, skip, how = enc, len(bom), "byte-order mark"
            break
    else:
        if b"\x00" in data:
            sniffed = _sniff_wide(data)
            if sniffed is None:
                raise _nul_error(name, data)
            encoding, how = sniffed, "NUL-byte pattern, no byte-order mark"
    label = encoding.upper()
    try:
        text = data[skip:].decode(encoding)
    except UnicodeDecodeError as exc:
        offset = skip + exc.start
        if encoding == "utf-8":
            raise TextsError(
                f"{name} is not valid UTF-8: byte 0x{data[offset]:02x} at byte offset {offset} "
                f"({exc.reason}); {_RESAVE}"
            ) from None
        raise TextsError(
            f"{name} looks like {label} text ({how}) but is not valid {label} at byte offset "
            f"{offset} ({exc.reason}); {_RESAVE}"
        ) from None
    if "\x00" in text:
        if encoding == "utf-8":
            raise _nul_error(name, data)
        raise _nul_error(name, data, text, label)
    if how:
        log.info("%s: decoded as %s (%s)", name, label, how)
    return text


def check_file(p: Path) -> None:
    """The path names a readable regular file; else a one-line TextsError saying why not."""
    exts = "/".join(SUPPORTED_EXTENSIONS)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise TextsError(
                f"{p} is a symbolic link to {os.readlink(p)!r}, which does not exist; fix the "
                "link or give the file itself"
            ) from None
        raise TextsError(
            f"no such file: {p}; give a path to an existing {exts} file, builtin:NAME, or hf:NAME"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TextsError(
                f"{p} is a symbolic link that loops back on itself; give the file itself"
            ) from None
        raise TextsError(
            f"cannot access {p}: {exc.strerror or exc}; check the path and its folders' permissions"
        ) from None
    except ValueError:  # an embedded NUL character
        raise TextsError(
            f"{str(p)!r} is not a usable path (it contains a NUL character); give a file path"
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise TextsError(f"{p} is a directory; give a file ({exts})")
    if not stat.S_ISREG(st.st_mode):
        raise TextsError(
            f"{p} is not a regular file (a device, pipe or socket); save the texts to a "
            f"{exts} file and give that"
        )


def read_file_bytes(p: Path) -> bytes:
    """The file's bytes; a one-line TextsError when it cannot be read."""
    try:
        return p.read_bytes()
    except OSError as exc:
        raise TextsError(
            f"{p} cannot be read: {exc.strerror or exc}; check its permissions or give a "
            "readable copy"
        ) from None


def read_text_file(path: Path, *, allow_empty: bool = True) -> str:
    """Read and decode a text file (:func:`decode_text`); line endings are left as they are.

    Args:
        path: the file.
        allow_empty: ``False``: an empty file (or one holding only a byte-order mark) is an
            error.

    Raises:
        TextsError: the file cannot be read or decoded (or is empty, see ``allow_empty``).
    """
    data = read_file_bytes(path)
    text = decode_text(data, path)
    if not text and not allow_empty:
        raise TextsError(
            f"{path} is empty ({'only a byte-order mark' if data else '0 bytes'}); give a file "
            "with at least one text"
        )
    return text


#: Old name of :func:`read_text_file` (it now also reads UTF-16/32).
read_utf8 = read_text_file


def normalise_newlines(text: str) -> str:
    """``\\r\\n`` and lone ``\\r`` → ``\\n`` (Windows and old Mac line endings, also mixed)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")
