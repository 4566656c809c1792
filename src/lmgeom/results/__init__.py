"""The results layer, below experiments and report: the tidy table schema
(:mod:`~lmgeom.results.table`), run manifests (:mod:`~lmgeom.results.manifest`) and the run
folder every command and the Python API write (:class:`~lmgeom.results.folder.RunFolder`)."""

from .folder import RunFolder, RunResult, prepare_out_dir, run_signature
from .manifest import base_manifest, now, versions
from .table import COLUMNS, frame, read_table, row, write_table

__all__ = ["COLUMNS", "RunFolder", "RunResult", "base_manifest", "frame", "now",
           "prepare_out_dir", "read_table", "row", "run_signature", "versions", "write_table"]
