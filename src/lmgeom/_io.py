"""Atomic, verified file writes shared by the cache, the result tables and the report.

A file is written to a temporary name in the same folder, flushed, fsync'ed and renamed
over the target, so a reader never sees a half-written file even if the writer is
SIGKILLed. ``ENOSPC`` becomes a :class:`~lmgeom.errors.CacheError` and the temporary is removed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import CacheError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


#: what this process has finished through :func:`atomic_path` (for "what was kept"):
#: activation shards per cache folder, per-layer / per-job results per run ``.work`` folder
_shards: dict[Path, int] = {}
_steps: dict[Path, int] = {}


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or quota) is full — an ``OSError`` with ``ENOSPC`` /
    ``EDQUOT``, or a library error wrapping one (safetensors: ``... (os error 28)``)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return ("No space left on device" in text or "os error 28" in text
            or "Disk quota exceeded" in text)


def disk_full_error(target: Path, *, need: int | None = None, written: int = 0) -> CacheError:
    """The :class:`CacheError` of a write to ``target`` that ran out of disk: the path, the
    free space left there and what the file needed (``need``, else more than ``written``)."""
    from ._paths import free_bytes, human_bytes

    free = free_bytes(target.parent)
    free_s = "unknown" if free is None else human_bytes(free)
    if need:
        needs = f"the file needs {human_bytes(need)}: free at least that much there"
    elif written:
        needs = (f"the file needs more than the {human_bytes(written)} written when the disk "
                 "filled: free more than that there")
    else:
        needs = "the file did not fit: free space there"
    return CacheError(f"out of disk space while writing {target} ({free_s} free on that disk; "
                      f"{needs}, or point LMGEOM_CACHE / --out at a larger disk), then rerun: "
                      "finished work is kept and no partial file was left")


def _unwritable_error(target: Path, exc: OSError) -> CacheError:
    return CacheError(f"cannot write {target}: {exc.strerror or exc}; choose a writable "
                      "--out / LMGEOM_CACHE")


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, need: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it over ``target``.

    Whatever goes wrong (an exception, Ctrl-C) the temporary is removed, so ``target`` is
    either the complete new file or what it was before. A full disk (``ENOSPC``, also when a
    library wraps it) and a read-only / forbidden folder become a :class:`CacheError` naming
    the path, the free space and what the file needed (``need``: its size, when the caller
    knows it)."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(target, need=need) from exc
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST):
            raise _unwritable_error(target, exc) from exc
        raise
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException as exc:
        try:
            written = tmp_path.stat().st_size
        except OSError:
            written = 0
        tmp_path.unlink(missing_ok=True)
        if isinstance(exc, Exception) and is_disk_full(exc):
            raise disk_full_error(target, need=need, written=written) from exc
        if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise _unwritable_error(target, exc) from exc
        raise
    _note_written(target)


def _note_written(target: Path) -> None:
    if target.name.startswith("shard-"):
        _shards[target.parent] = _shards.get(target.parent, 0) + 1
        return
    work = next((p for p in target.parents if p.name == ".work"), None)
    if work is not None and target.suffix in (".json", ".parquet"):
        _steps[work] = _steps.get(work, 0) + 1


def written_summary() -> str:
    """What this process has finished writing, for the line of an interrupted run:
    ``"3 activation shards in DIR, 2 finished steps in OUT/.work"`` (``""``: nothing)."""
    parts = [f"{n} activation shard{'s' * (n != 1)} in {d}" for d, n in _shards.items()]
    parts += [f"{n} result file{'s' * (n != 1)} of finished layers / jobs in {d}"
              for d, n in _steps.items()]
    return ", ".join(parts)


def write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    """Atomically write ``data`` to ``target``."""
    with atomic_path(target, need=len(data)) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def write_text(target: str | os.PathLike[str], text: str) -> None:
    """Atomically write UTF-8 ``text`` to ``target``."""
    write_bytes(target, text.encode("utf-8"))


def write_json(target: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    write_text(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def stable_hash(obj: Any) -> str:
    """sha256 of a canonical JSON rendering of ``obj`` (dict order does not matter)."""
    return sha256_bytes(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"))
