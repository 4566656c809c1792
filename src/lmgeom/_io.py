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
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._paths import cache_root, free_bytes, human_bytes
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
def atomic_path(target: str | os.PathLike[str], *, need: int | None = None,
                replace_foreign: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it over ``target``.

    Whatever goes wrong (an exception, Ctrl-C) the temporary is removed, so ``target`` is
    either the complete new file or what it was before. A full disk (``ENOSPC``, also when a
    library wraps it) and a read-only / forbidden folder become a :class:`CacheError` naming
    the path, the free space and what the file needed (``need``: its size, when the caller
    knows it).

    ``target`` may replace an existing file only when lmgeom wrote that file and nobody changed
    it since (:func:`written_by_lmgeom`; files in the cache are always lmgeom's): a foreign file
    raises :class:`CacheError` before anything is written (``replace_foreign`` lifts this for
    callers that checked ownership another way). Every file written outside the cache is
    recorded (:func:`record_written`)."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        check_replaceable(target, replace_foreign=replace_foreign)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{TMP_TAG}", suffix=".tmp",
                                   dir=target.parent)
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
        record_written(target)
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


# --------------------------------------------------------------------------- ownership
#
# lmgeom never deletes or replaces a file it did not write. Every file it writes outside its
# cache is recorded in a ledger (:func:`ledger_root`: ``~/.local/state/lmgeom/written/``, one
# small JSON per path) with the file's identity right after the write: device, inode, size,
# mtime and ctime (ctime cannot be set by a user). A file "is lmgeom's" when its identity still
# matches the record: a file a user wrote, edited, touched or copied over lmgeom's does not
# match. Without a record a file counts as foreign: lmgeom then refuses instead.

#: marker inside the names of atomic writes' temporaries (``.NAME.lmgeom-XXXX.tmp``): only such
#: leftovers of a killed writer are ever cleaned up
TMP_TAG = "lmgeom-"


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def ledger_root() -> Path:
    """Where the record of written files lives: ``$LMGEOM_STATE`` if set, else
    ``$XDG_STATE_HOME/lmgeom`` (default ``~/.local/state/lmgeom``), then ``written/``. Apart
    from the cache, so changing ``LMGEOM_CACHE`` or deleting the cache forgets nothing."""
    state = os.environ.get("LMGEOM_STATE")
    if not state:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        state = str(Path(xdg) / "lmgeom")
    return Path(state).expanduser() / "written"


def _ledger_entry(path: Path) -> Path | None:
    try:
        key = sha256_bytes(str(Path(os.path.abspath(path))).encode("utf-8", "surrogateescape"))
        root = ledger_root()
    except (OSError, ValueError, RuntimeError):  # pragma: no cover - unrepresentable path
        return None
    return root / key[:2] / f"{key[2:34]}.json"


def in_cache(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies inside lmgeom's cache folder (``$LMGEOM_CACHE``)."""
    try:
        p = Path(os.path.realpath(path))
        root = Path(os.path.realpath(cache_root()))
    except (OSError, ValueError):  # pragma: no cover
        return False
    return p == root or root in p.parents


def record_written(path: str | os.PathLike[str]) -> None:
    """Record that lmgeom has just written the file ``path`` (best effort: without a usable
    cache nothing is recorded, and lmgeom will later refuse to replace the file)."""
    path = Path(path)
    if in_cache(path):
        return
    try:
        st = path.stat()
        entry = _ledger_entry(path)
        if entry is None or not path.is_file():
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"path": str(Path(os.path.abspath(path))), "id": _identity(st)})
        fd, tmp = tempfile.mkstemp(prefix=".entry.", suffix=".tmp", dir=entry.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        os.replace(tmp, entry)
    except (OSError, ValueError) as exc:
        _say_ledger_unwritable(exc)


_ledger_warned: list[bool] = []


def _say_ledger_unwritable(exc: BaseException) -> None:
    """Once per process: the state folder cannot record what lmgeom writes."""
    if _ledger_warned:
        return
    _ledger_warned.append(True)
    logging.getLogger(__name__).warning(
        "cannot record the files lmgeom writes in its state folder %s (%s); a run folder's own "
        "marker still proves them lmgeom's, but other outputs (--out files, datasets) will be "
        "refused as foreign on a rerun: set LMGEOM_STATE to a writable folder", ledger_root(),
        getattr(exc, "strerror", None) or exc)


def fs_clock_ns(folder: str | os.PathLike[str]) -> int:
    """The clock of the filesystem that holds ``folder`` (its nearest existing ancestor), in
    ns: the change time of a probe file written there now. Take a ``since_ns`` for
    :func:`record_tree` from here, not from ``time.time_ns()``: filesystems stamp files with a
    coarse clock that lags the fine one by up to a tick, so a file written just after a
    ``time.time_ns()`` can carry an older stamp and be missed."""
    p = Path(folder)
    while not p.is_dir() and p != p.parent:
        p = p.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".lmgeom-clock-", dir=p)
    except OSError:  # read-only place: the run will fail to write there anyway
        return time.time_ns()
    try:
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


def record_tree(folder: str | os.PathLike[str], *, since_ns: int | None = None) -> None:
    """:func:`record_written` for every file under ``folder`` that lmgeom just wrote there:
    with ``since_ns`` (a :func:`fs_clock_ns` taken when the writing began) only files changed
    since then, so a file a user left in the folder beforehand never becomes lmgeom's."""
    for p in Path(folder).rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        if since_ns is not None:
            st = p.stat()
            if max(st.st_mtime_ns, st.st_ctime_ns) < since_ns:
                continue
        record_written(p)


def _in_ledger(path: Path) -> bool:
    """Whether the state folder records ``path`` as written by lmgeom, unchanged since."""
    entry = _ledger_entry(path)
    try:
        rec = json.loads(entry.read_text()) if entry is not None else None
        return rec is not None and rec.get("id") == _identity(path.stat())
    except (OSError, ValueError):
        return False


def written_by_lmgeom(path: str | os.PathLike[str]) -> bool:
    """Whether lmgeom wrote the file ``path`` and nobody changed it since (always true inside
    the cache; false for a missing path, a folder or a symlink). Two proofs count: the record
    in the state folder (:func:`ledger_root`), and, inside a run folder, the folder's own
    marker, which lists each file lmgeom wrote there with its size and sha256 (so a run folder
    that was moved, copied, or used with another ``LMGEOM_STATE`` stays its owner's)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    if in_cache(path):
        return True
    if _in_ledger(path):
        return True
    if path.name == FOLDER_MARKER:  # a marker proves itself (its check field)
        return read_marker(path) is not None
    return vouched_by_marker(path)


# ------------------------------------------------------------------ the run folder's marker
#: the marker a run folder carries (written first, by lmgeom): the run's signature and the
#: files lmgeom wrote in the folder (relative path -> [size, sha256])
FOLDER_MARKER = ".lmgeom-run"
#: how many folders up from a file its run folder's marker is looked for (``.work/a/b``)
_MARKER_DEPTH = 4


def marker_payload(signature: str, files: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """The content of a run folder's marker. ``check`` hashes the rest, so an edited marker
    (or a file that only looks like one) proves nothing."""
    body = {"lmgeom": "run folder", "signature": signature, "files": dict(files or {})}
    return {**body, "check": stable_hash(body)}


def read_marker(marker: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A run folder marker's content when it is one lmgeom wrote and nobody changed (its
    ``check`` matches, or the state folder records it), else ``None``."""
    marker = Path(marker)
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        if marker.stat().st_size > 64 << 20:
            return None
        data = json.loads(marker.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("signature"), str):
        return None
    body = {k: data.get(k) for k in ("lmgeom", "signature", "files")}
    if data.get("lmgeom") == "run folder" and data.get("check") == stable_hash(body):
        return data
    # an older marker: only the state folder's record proves it
    return data if _in_ledger(marker) else None


def vouched_by_marker(path: str | os.PathLike[str]) -> bool:
    """Whether a run folder above ``path`` lists it, unchanged, in its marker."""
    path = Path(os.path.abspath(path))
    for folder in list(path.parents)[:_MARKER_DEPTH]:
        data = read_marker(folder / FOLDER_MARKER)
        if data is None:
            continue
        files = data.get("files") or {}
        entry = files.get(path.relative_to(folder).as_posix()) if isinstance(files, dict) else None
        try:
            return (isinstance(entry, list) and len(entry) == 2
                    and entry[0] == path.stat().st_size and entry[1] == sha256_file(path))
        except OSError:
            return False
    return False


def record_in_marker(folder: str | os.PathLike[str], *, since_ns: int | None = None) -> None:
    """Add to the run folder's marker every file under ``folder`` written since ``since_ns``
    (a :func:`fs_clock_ns`; ``None``: every file the state folder records as lmgeom's), with
    its size and sha256. Called when a run ends (also on Ctrl-C), with its lock held."""
    folder = Path(folder)
    marker = folder / FOLDER_MARKER
    data = read_marker(marker)
    if data is None:
        return
    files = dict(data.get("files") or {})
    for p in folder.rglob("*"):
        if p == marker or p.is_symlink() or not p.is_file() or p.name.endswith(".tmp"):
            continue
        rel = p.relative_to(folder).as_posix()
        try:
            st = p.stat()
            if since_ns is not None:
                if max(st.st_mtime_ns, st.st_ctime_ns) < since_ns and rel not in files:
                    continue
            elif not written_by_lmgeom(p):
                continue
            files[rel] = [st.st_size, sha256_file(p)]
        except OSError:
            continue
    files = {rel: v for rel, v in files.items() if (folder / rel).is_file()}
    if files != data.get("files"):
        write_json(marker, marker_payload(data["signature"], files))


def check_replaceable(target: str | os.PathLike[str], *, replace_foreign: bool = False,
                      what: str = "") -> None:
    """Raise :class:`CacheError` when ``target`` exists and lmgeom may not replace it: a folder
    in the way, or a file lmgeom did not write (or that was changed since it did)."""
    target = Path(target)
    if not (target.exists() or target.is_symlink()):
        return
    label = f"{what} {target}" if what else str(target)
    if target.is_dir() and not target.is_symlink():
        raise CacheError(f"{label} is a folder; give a file path (e.g. {target / 'out'}"
                         f"{target.suffix or ''} or another name)")
    if replace_foreign or written_by_lmgeom(target):
        return
    raise CacheError(f"{label} already exists and lmgeom did not write it (or it was changed "
                     "since); lmgeom never replaces a file it did not write: move it away or "
                     "choose another path")


def remove_written(folder: str | os.PathLike[str]) -> tuple[int, list[Path]]:
    """Delete every file under ``folder`` that lmgeom wrote (:func:`written_by_lmgeom`) and the
    folders left empty by that; keep everything else. Returns (files removed, files kept)."""
    folder = Path(folder)
    removed, kept = 0, []
    for dirpath, dirnames, filenames in os.walk(folder, topdown=False):
        d = Path(dirpath)
        for name in filenames:
            p = d / name
            if written_by_lmgeom(p) or _is_tmp_leftover(p):
                p.unlink(missing_ok=True)
                removed += 1
            else:
                kept.append(p)
        if d != folder:
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty
    return removed, sorted(kept)


def _is_tmp_leftover(p: Path) -> bool:
    return p.name.startswith(".") and f".{TMP_TAG}" in p.name and p.name.endswith(".tmp")


def remove_tmp_leftovers(folder: str | os.PathLike[str]) -> None:
    """Delete what killed atomic writes left under ``folder`` (``.NAME.lmgeom-XXXX.tmp``)."""
    for p in Path(folder).rglob(f".*.{TMP_TAG}*.tmp"):
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)


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
