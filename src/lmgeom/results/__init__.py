"""The results layer, below experiments and report: the tidy table schema
(:mod:`~lmgeom.results.table`), run manifests (:mod:`~lmgeom.results.manifest`) and the run
folder every command and the Python API write (:class:`~lmgeom.results.folder.RunFolder`)."""

from .folder import (
    RunFolder,
    RunResult,
    check_output_path,
    claim_output,
    is_run_folder,
    prepare_out_dir,
    run_signature,
)
from .manifest import base_manifest, now, versions
from .table import COLUMNS, frame, read_table, row, write_table

__all__ = ["COLUMNS", "RunFolder", "RunResult", "base_manifest", "check_output_path",
           "claim_output", "frame", "is_run_folder", "now",
           "prepare_out_dir", "read_table", "row", "run_signature", "versions", "write_table"]
