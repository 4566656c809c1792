"""Output folders of runs (:class:`RunFolder`): refuse to mix two different runs in one folder.

A run folder holds ``.lmgeom-run`` (written first) with the run's ``signature``: a hash of every
setting that changes the results; when the run ends (also on Ctrl-C) the marker gains the list
of files the run wrote, with their sizes and sha256, so the folder proves its own ownership
after a move, a copy or a change of ``LMGEOM_STATE``. Reusing a folder for the same signature is allowed (a rerun / resume);
a different signature is refused unless ``overwrite=True``, and then only the files lmgeom wrote
there are removed. A non-empty folder without lmgeom's marker is never used.

Single-file and dataset outputs (``extract --out``, ``ppl --out``, ``pga --csv`` ...) go through
:func:`claim_output`: checked before any work, locked against a second run while it writes.
Which files "lmgeom wrote" is decided by ``lmgeom._io.written_by_lmgeom``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from filelock import FileLock, Timeout

from .._io import (
    FOLDER_MARKER,
    ledger_root,
    sha256_bytes,
    atomic_path,
    check_replaceable,
    fs_clock_ns,
    marker_payload,
    read_marker,
    record_in_marker,
    remove_tmp_leftovers,
    remove_written,
    stable_hash,
    write_json,
    written_by_lmgeom,
)
from .._paths import check_output_location
from ..errors import CacheError
from .manifest import base_manifest, now
from .table import flag_summary, write_table

log = logging.getLogger(__name__)


def run_signature(settings: dict[str, Any]) -> str:
    return stable_hash(settings)[:16]


#: the run folder's marker (written first, by lmgeom: ``lmgeom._io.read_marker``)
MARKER = FOLDER_MARKER


def _marker_signature(marker: Path) -> str | None:
    """The signature in ``marker`` when lmgeom wrote it (and nobody changed it), else ``None``."""
    data = read_marker(marker)
    return data["signature"] if data is not None else None


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` is an lmgeom run folder: its marker and its ``manifest.json`` were
    both written by lmgeom and not changed since."""
    path = Path(path)
    return (path.is_dir() and _marker_signature(path / MARKER) is not None
            and written_by_lmgeom(path / "manifest.json"))


def prepare_out_dir(out: str | Path, signature: str, *, overwrite: bool = False,
                    option: str = "--out") -> Path:
    """Create ``out`` or check that it holds the same run (a rerun resumes there).

    * a new or empty folder is used as it is;
    * a folder holding the same run (its marker, written by lmgeom, has ``signature``) is reused;
    * a folder holding a different lmgeom run is refused unless ``overwrite``: then only the
      files lmgeom wrote there are removed (``lmgeom._io.remove_written``), never another;
    * any other non-empty folder is refused, whatever ``overwrite`` says;
    * the cache, the current folder, its parents and the home folder are refused
      (``lmgeom._paths.check_output_location``).
    """
    out = check_output_location(out, option=option)
    if out.exists() and not out.is_dir():
        raise CacheError(f"{option} {out} exists and is not a folder; choose another path")
    marker = out / MARKER
    if out.is_dir() and any(out.iterdir()):
        old = _marker_signature(marker)
        if old is None:
            raise CacheError(
                f"{option} {out} is not empty and holds no lmgeom run (no {MARKER} marker "
                "written by lmgeom there); lmgeom only writes into a new or empty folder or one "
                "of its own run folders: choose a new folder for " + option)
        if old != signature:
            if not overwrite:
                raise CacheError(
                    f"output folder {out} already holds a different run (an lmgeom run with "
                    "other settings); pass --overwrite to replace that run's files (files lmgeom did "
                    "not write are never touched) or choose another " + option)
            removed, kept = remove_written(out)
            log.warning("--overwrite: removed the %d files of the previous run in %s", removed, out)
            if kept:
                shown = ", ".join(str(p.relative_to(out)) for p in kept[:5])
                log.warning("kept %d files in %s that lmgeom did not write: %s%s", len(kept),
                            out, shown, " ..." if len(kept) > 5 else "")
    out.mkdir(parents=True, exist_ok=True)
    remove_tmp_leftovers(out)  # left by a killed writer of this run; never read
    if _marker_signature(marker) != signature:
        write_json(marker, marker_payload(signature))
    return out


# --------------------------------------------------------------------------- output locks

_held: dict[str, tuple[Any, int]] = {}
_held_guard = threading.Lock()


def lock_path_of(path: str | Path) -> Path:
    """The lock file guarding the output ``path``: in lmgeom's state folder
    (``$LMGEOM_STATE/locks/<hash of the absolute path>.lock``), so a clean run leaves no lock
    file beside its outputs; beside the output (``.<name>.lmgeom-lock``) only when the state
    folder cannot be written."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    locks = ledger_root().parent / "locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        if os.access(locks, os.W_OK | os.X_OK):
            return locks / f"{sha256_bytes(str(path).encode('utf-8', 'surrogateescape'))[:32]}.lock"
    except OSError:
        pass
    return path.parent / f".{path.name}.lmgeom-lock"


def acquire_output_lock(path: str | Path, *, option: str = "--out") -> str:
    """Lock the output ``path`` against a second lmgeom process (re-entrant in one process);
    raises :class:`CacheError` when another run holds it. Returns the key for
    :func:`release_output_lock`."""
    lock_path = lock_path_of(path)
    key = str(lock_path)
    with _held_guard:
        if key in _held:
            lock, n = _held[key]
            _held[key] = (lock, n + 1)
            return key
        out_parent = Path(os.path.abspath(Path(path).expanduser())).parent
        try:
            out_parent.mkdir(parents=True, exist_ok=True)
            lock_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the folder of {option} {path} ({out_parent}): "
                             f"{exc.strerror or exc}; choose another {option}") from exc
        try:  # an unwritable folder must not read as "another run holds the lock"
            os.close(os.open(key, os.O_RDWR | os.O_CREAT, 0o666))
        except OSError as exc:
            raise CacheError(f"cannot write in the folder of {option} {path} "
                             f"({lock_path.parent}: {exc.strerror or exc}); choose a writable "
                             f"{option}") from exc
        lock = FileLock(key)
        try:
            lock.acquire(timeout=0)
        except Timeout as exc:
            raise CacheError(f"another lmgeom run is writing to {path} right now; wait for it to "
                             f"finish or choose another {option}") from exc
        except OSError as exc:
            raise CacheError(f"cannot lock {option} {path} ({exc.strerror or exc}); choose a "
                             f"writable {option}") from exc
        _held[key] = (lock, 1)
    return key


def release_output_lock(key: str) -> None:
    with _held_guard:
        if key not in _held:
            return
        lock, n = _held[key]
        if n > 1:
            _held[key] = (lock, n - 1)
            return
        del _held[key]
        lock.release()


@contextlib.contextmanager
def claim_output(path: str | Path | None, *, option: str = "--out", kind: str = "file",
                 suffixes: tuple[str, ...] | None = None) -> Iterator[Path | None]:
    """Check an output path before any work and hold its lock until the block ends.

    ``kind="file"``: the path must not be a folder, its parent not a file, its suffix one of
    ``suffixes`` (when given), and an existing file there must be one lmgeom wrote.
    ``kind="folder"`` (a dataset folder lmgeom writes whole): an existing folder must hold only
    files lmgeom wrote. Both: not in the cache, not the current folder or its parents, not the
    home folder (``lmgeom._paths.check_output_location``). ``None`` passes through."""
    if path is None or path == "":
        yield None
        return
    p = check_output_path(path, option=option, kind=kind, suffixes=suffixes)
    key = acquire_output_lock(p, option=option)
    try:
        yield p
    finally:
        release_output_lock(key)


def check_output_path(path: str | Path, *, option: str = "--out", kind: str = "file",
                      suffixes: tuple[str, ...] | None = None) -> Path:
    """The checks of :func:`claim_output`, without the lock."""
    p = check_output_location(path, option=option)
    for parent in p.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise CacheError(f"{option} {path}: {parent} is a file, not a folder; choose "
                                 f"another {option}")
            break
    if kind == "file":
        if p.is_dir():
            raise CacheError(f"{option} {path} is a folder; {option} takes a file path "
                             f"(e.g. {p / 'results'}{(suffixes or ('',))[0]})")
        if suffixes is not None and p.suffix.lower() not in suffixes:
            raise CacheError(f"{option} {path}: unsupported file type {p.suffix or '(none)'!r}; "
                             f"use one of {', '.join(suffixes)}")
        check_replaceable(p, what=option)
    else:
        if p.exists() and not p.is_dir():
            raise CacheError(f"{option} {path} exists and is not a folder; choose another "
                             f"{option}")
        if p.is_dir():
            foreign = [q for q in p.rglob("*") if not q.is_dir() and not written_by_lmgeom(q)]
            if foreign:
                raise CacheError(f"{option} {path} already holds files lmgeom did not write "
                                 f"(e.g. {foreign[0].relative_to(p)}); lmgeom only replaces its "
                                 f"own output: choose a new path for {option}")
        if p.is_dir() and any(p.iterdir()) and not (p / "dataset_info.json").is_file():
            raise CacheError(f"{option} {path} is a folder that does not hold a saved dataset "
                             "(no dataset_info.json); lmgeom replaces only a dataset it wrote "
                             f"there: choose a new path for {option}")
    return p


class RunResult(Protocol):
    """What :meth:`RunFolder.save` writes: any experiment result with these three methods."""

    def rows(self) -> pd.DataFrame:
        """The tidy results table (:mod:`lmgeom.results.table` columns)."""
        ...

    def manifest(self) -> dict[str, Any]:
        """Entries this result adds to the run's ``manifest.json`` (seeds, timings, models...)."""
        ...

    def figures(self, folder: RunFolder, manifest: dict[str, Any]) -> Path | None:
        """Write the plots and ``report.html`` into ``folder`` (``None``: no report)."""
        ...


class RunFolder:
    """One run's output folder, the same for the CLI and the Python API.

    Holds ``.lmgeom-run`` (the run's signature, written first), ``<table>.parquet`` / ``.csv``,
    ``manifest.json`` (written last: every setting, seed, version and timing), ``plots/``,
    ``report.html`` and ``.work/`` (per-step results a killed run resumes from).

    Use it as a context manager: while open, the folder is locked against a second lmgeom run
    (a racing run gets a :class:`~lmgeom.errors.CacheError` instead of mixing its files in)::

        with RunFolder.create("runs/x", "analyze", settings) as folder:
            result = experiment.run(work_dir=folder.work)
            folder.save(result, table="layers")
    """

    def __init__(self, path: Path, command: str, settings: dict[str, Any], signature: str) -> None:
        self.path = Path(path)
        self.command = command
        self.settings = settings
        self.signature = signature
        self.manifest: dict[str, Any] = base_manifest(command, settings, signature)
        self._lock: Any = None
        self._since_ns: int | None = None
        self._t0 = time.perf_counter()

    @classmethod
    def create(cls, out: str | Path, command: str, settings: dict[str, Any], *,
               overwrite: bool = False, table: str | None = None) -> RunFolder:
        """Lock ``out``, then create it or check that it holds the same run (``overwrite``
        replaces a different one). Raises :class:`CacheError` when another run holds it, and
        before any work when a file the run will write (``<table>.parquet/.csv``,
        ``manifest.json``, ``report.html``) is there but not lmgeom's (e.g. edited by hand)."""
        out = check_output_location(out)
        if out.exists() and not out.is_dir():
            raise CacheError(f"--out {out} exists and is not a folder; choose another path")
        signature = run_signature(settings)
        folder = cls(out, command, settings, signature)
        folder._acquire()
        try:
            prepare_out_dir(out, signature, overwrite=overwrite)
            folder._since_ns = fs_clock_ns(out)
            names = ["manifest.json", "report.html"]
            if table:
                names += [f"{table}.parquet", f"{table}.csv"]
            for name in names:
                check_replaceable(out / name, what="--out")
        except BaseException:
            folder.close()
            raise
        return folder

    def _acquire(self) -> None:
        self._lock = acquire_output_lock(self.path)

    def close(self) -> None:
        """List what this run wrote in the folder's marker, then release the folder."""
        if self._lock is not None:
            if self._since_ns is not None:
                try:
                    record_in_marker(self.path, since_ns=self._since_ns)
                except OSError as exc:  # the outputs stand; only the move-proof record is lost
                    log.warning("could not list this run's files in %s (%s)",
                                self.path / MARKER, exc.strerror or exc)
            release_output_lock(self._lock)
            self._lock = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def work(self) -> Path:
        """``.work/``: intermediate results of this run (resume state)."""
        return self.path / ".work"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    def write_table(self, df: pd.DataFrame, stem: str) -> list[Path]:
        """Atomically write ``stem.parquet`` and ``stem.csv``."""
        return write_table(df, self.path, stem)

    def write_parquet(self, df: pd.DataFrame, stem: str) -> Path:
        """Atomically write ``stem.parquet`` (per-item tables: no CSV copy)."""
        path = self.path / f"{stem}.parquet"
        with atomic_path(path) as tmp:
            df.to_parquet(tmp, index=False)
        return path

    def write_manifest(self, **entries: Any) -> Path:
        """Add ``entries`` (and ``finished``) to the manifest and write ``manifest.json``."""
        self.manifest.update(entries)
        self.manifest["finished"] = now()
        path = self.path / "manifest.json"
        write_json(path, self.manifest)
        return path

    def save(self, result: RunResult, *, table: str, report: bool = True) -> Path | None:
        """Write ``result``: its table as ``<table>.parquet/.csv``, its plots and report, then
        the manifest (with ``timings.report_s`` and ``timings.total_s``). Returns the report
        path (``None`` without a report)."""
        df = result.rows()
        self.write_table(df, table)
        extra = getattr(result, "extra_tables", None)
        for stem, frame in (extra() if extra is not None else {}).items():
            self.write_parquet(frame, stem)
        self.manifest.update(result.manifest())
        if "flag" in df.columns:  # every flagged number is named in the JSON too
            self.manifest["flags"] = flag_summary(df)
        timings = self.manifest.setdefault("timings", {})
        t = time.perf_counter()
        page = result.figures(self, self.manifest) if report else None
        timings["report_s"] = time.perf_counter() - t
        timings["total_s"] = time.perf_counter() - self._t0
        self.write_manifest()
        return page
