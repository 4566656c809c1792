"""The results layer, below experiments and report: the tidy table schema
(:mod:`~lmgeom.results.table`), run manifests (:mod:`~lmgeom.results.manifest`) and the run
folder every command and the Python API write (:class:`~lmgeom.results.folder.RunFolder`).

Names are loaded on first use, so ``lmgeom.results.console`` (``lmgeom models``) does not import
pandas."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "RunFolder": "folder", "RunResult": "folder", "check_output_path": "folder",
    "claim_output": "folder", "is_run_folder": "folder", "prepare_out_dir": "folder",
    "run_signature": "folder",
    "base_manifest": "manifest", "now": "manifest", "versions": "manifest",
    "COLUMNS": "table", "frame": "table", "read_table": "table", "row": "table",
    "write_table": "table",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
