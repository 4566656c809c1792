"""Output folders of experiment runs: refuse to mix two different runs in one folder.

A run folder holds ``.lmgeom-run`` (written first) with the run's ``signature``: a hash of every
setting that changes the results. Reusing a folder for the same signature is allowed (a rerun / resume);
a different signature is refused unless ``overwrite=True``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ._io import stable_hash, write_json
from .errors import CacheError


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
