"""Output folders of runs (:class:`RunFolder`): refuse to mix two different runs in one folder.

A run folder holds ``.lmgeom-run`` (written first) with the run's ``signature``: a hash of every
setting that changes the results. Reusing a folder for the same signature is allowed (a rerun / resume);
a different signature is refused unless ``overwrite=True``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from .._io import stable_hash, write_json
from ..errors import CacheError
from .manifest import base_manifest, now


def run_signature(settings: dict[str, Any]) -> str:
    return stable_hash(settings)[:16]


def prepare_out_dir(out: str | Path, signature: str, *, overwrite: bool = False) -> Path:
    """Create ``out`` or check it holds the same run; ``overwrite`` clears a different one."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CacheError(f"--out {out} exists and is not a folder; choose another path")
    marker = out / ".lmgeom-run"
    if out.is_dir() and any(out.iterdir()):
        old = None
        if marker.is_file():
            try:
                old = json.loads(marker.read_text()).get("signature")
            except (OSError, ValueError):
                old = None
        if old != signature:
            if not overwrite:
                raise CacheError(
                    f"output folder {out} already holds a different run; pass --overwrite to "
                    "replace it or choose another --out"
                )
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.rglob(".*.tmp"):  # left by a killed writer; never read, safe to drop
        stale.unlink(missing_ok=True)
    if not marker.is_file():
        write_json(marker, {"signature": signature})
    return out


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
        self._t0 = time.perf_counter()

    @classmethod
    def create(cls, out: str | Path, command: str, settings: dict[str, Any], *,
               overwrite: bool = False) -> RunFolder:
        """Lock ``out``, then create it or check that it holds the same run (``overwrite``
        replaces a different one). Raises :class:`CacheError` when another run holds it."""
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise CacheError(f"--out {out} exists and is not a folder; choose another path")
        signature = run_signature(settings)
        folder = cls(out, command, settings, signature)
        folder._acquire()
        try:
            prepare_out_dir(out, signature, overwrite=overwrite)
        except BaseException:
            folder.close()
            raise
        return folder

    def _acquire(self) -> None:
        from filelock import FileLock, Timeout

        lock_path = self.path.parent / f".{self.path.name}.lmgeom-lock"
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the output folder's parent {lock_path.parent}: "
                             f"{exc}; choose another --out") from exc
        lock = FileLock(str(lock_path))
        try:
            lock.acquire(timeout=0)
        except Timeout as exc:
            raise CacheError(f"another lmgeom run is writing to {self.path} right now; wait for "
                             "it to finish or choose another --out") from exc
        self._lock = lock

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
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
        from .table import write_table

        return write_table(df, self.path, stem)

    def write_parquet(self, df: pd.DataFrame, stem: str) -> Path:
        """Atomically write ``stem.parquet`` (per-item tables: no CSV copy)."""
        from .._io import atomic_path

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
        timings = self.manifest.setdefault("timings", {})
        t = time.perf_counter()
        page = result.figures(self, self.manifest) if report else None
        timings["report_s"] = time.perf_counter() - t
        timings["total_s"] = time.perf_counter() - self._t0
        self.write_manifest()
        return page
