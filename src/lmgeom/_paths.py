"""Where lmgeom keeps its cache: ``$LMGEOM_CACHE``, default ``~/.cache/lmgeom``.

:func:`cache_dir` checks the cache root once per process before anything is written there
(:func:`check_cache_writable`): a file in the way, a read-only folder or a full disk is a
:class:`~lmgeom.errors.CacheError` naming the path — raised when a command first touches the
cache, i.e. before any forward pass — instead of an ``OSError`` halfway through a run.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from .errors import CacheError

#: bytes the writability probe writes (and removes): a full disk fails it
PROBE_BYTES = 64 * 1024
_checked: set[Path] = set()


def cache_root() -> Path:
    """``$LMGEOM_CACHE`` (``~`` expanded), default ``~/.cache/lmgeom``; not created."""
    return Path(os.environ.get("LMGEOM_CACHE") or Path.home() / ".cache" / "lmgeom").expanduser()


def cache_dir(*parts: str, create: bool = True) -> Path:
    """Return ``$LMGEOM_CACHE/<parts...>``; with ``create`` (the default) the root is checked
    (:func:`check_cache_writable`) and the folder created."""
    root = cache_root()
    path = root.joinpath(*parts)
    if create:
        check_cache_writable(root)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"{_where(root)}: cannot create {path} ({exc.strerror or exc}); "
                             f"{_fix()}") from exc
    return path


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the disk holding ``path`` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _where(root: Path) -> str:
    if os.environ.get("LMGEOM_CACHE"):
        return f"LMGEOM_CACHE={os.environ['LMGEOM_CACHE']}"
    return f"the cache folder {root}"


def _fix() -> str:
    return "point LMGEOM_CACHE at a writable folder with free space (or pass --no-cache)"


def check_cache_writable(root: str | os.PathLike[str] | None = None) -> Path:
    """Check that the cache root (default ``$LMGEOM_CACHE``) is a folder lmgeom can write to,
    with room: raises :class:`CacheError` for a file in the way, a read-only folder or a full
    disk (a small probe file is written, fsync'ed and removed). Checked once per process and
    root; returns the root."""
    root = Path(root) if root is not None else cache_root()
    if root in _checked:
        return root
    where = _where(root)
    for p in (root, *root.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                what = "is" if p == root else f"lies under {p}, which is"
                raise CacheError(f"{where}: {'it' if p == root else root} {what} a file, not a "
                                 f"folder; {_fix()}")
            break
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".lmgeom-probe-", dir=root)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(b"\0" * PROBE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            Path(probe).unlink(missing_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = free_bytes(root)
            raise CacheError(f"{where}: the disk is full ({human_bytes(free or 0)} free; the "
                             f"activation cache needs room for its shards); free space there or "
                             f"{_fix()}") from exc
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise CacheError(f"{where} is not writable ({exc.strerror}); {_fix()}") from exc
        raise CacheError(f"{where}: cannot write there ({exc.strerror or exc}); {_fix()}") from exc
    _checked.add(root)
    return root


#: the longest file name (one path component) most file systems allow, in bytes
_NAME_MAX = 255


def check_output_location(path: str | os.PathLike[str], *, option: str = "--out") -> Path:
    """Refuse an output path that would put results where they could clobber something else:
    lmgeom's cache (the path is the cache, lies inside it, or contains it), the current
    folder, one of its parents, the home folder, or the file-system root. A new subfolder
    (``runs/x``) is fine. Returns the path (unchanged)."""
    p = Path(path).expanduser()
    try:
        real = Path(os.path.realpath(p))
        cache = Path(os.path.realpath(cache_root()))
        cwd = Path(os.path.realpath(os.getcwd()))
        home = Path(os.path.realpath(Path.home()))
    except (OSError, ValueError, RuntimeError) as exc:
        raise CacheError(f"{option} {path}: cannot resolve this path ({exc}); choose another") \
            from exc
    fix = f"choose a new folder for {option}, e.g. runs/NAME"
    if real == cwd or real in cwd.parents:
        what = "is the current folder" if real == cwd else "is a parent of the current folder"
        raise CacheError(f"{option} {path} {what}; {fix}")
    if real == home:
        raise CacheError(f"{option} {path} is your home folder; {fix}")
    if real == Path(real.anchor):
        raise CacheError(f"{option} {path} is the root of the file system; {fix}")
    if real == cache or cache in real.parents:
        raise CacheError(f"{option} {path} lies in lmgeom's cache ({cache}); results there could "
                         f"be mixed with cached activations; {fix}")
    if real in cache.parents:
        raise CacheError(f"{option} {path} contains lmgeom's cache ({cache}); {fix}")
    check_writable_path(p, option=option)
    return p


def check_writable_path(path: str | os.PathLike[str], *, option: str = "--out") -> Path:
    """Refuse, before any work, a path lmgeom could not create or write, with the true reason:
    a symlink loop on the way, a name longer than the file system allows, a regular file where
    a folder must be, or a folder lmgeom may not write in. Returns the path."""
    p = Path(path).expanduser()
    for part in p.parts:
        if len(os.fsencode(part)) > _NAME_MAX:
            raise CacheError(f"{option}: the name {part[:40]}... is {len(os.fsencode(part))} "
                             f"bytes, more than the {_NAME_MAX} a file name may have; choose "
                             f"a shorter name for {option}")
    try:
        os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheError(f"{option} {path}: a symbolic link on this path points back at "
                             f"itself (a loop); remove the link or choose another {option}") \
                from None
        if exc.errno == errno.ENAMETOOLONG:
            raise CacheError(f"{option} {path}: the path is longer than the file system "
                             f"allows; choose a shorter {option}") from None
    existing = p
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing != p and not existing.is_dir():
        raise CacheError(f"{option} {path}: {existing} is a file, not a folder, so nothing can "
                         f"be created below it; choose another {option}")
    folder = existing if existing.is_dir() else existing.parent
    try:  # a real probe: permissions, read-only mounts and pseudo file systems (/proc) alike
        fd, probe = tempfile.mkstemp(prefix=".lmgeom-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CacheError(f"{option} {path}: lmgeom may not write in {folder} "
                         f"({exc.strerror or exc}); choose a writable {option}") from None
    return p
