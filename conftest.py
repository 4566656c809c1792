"""The documentation's code blocks are tests: every ```bash and ```python block of README.md and
docs/*.md runs, in order, per page (collected by Sybil when pytest is given those files, as
``make test`` does). A block that cannot run here says why, in the comment above it:
``<!-- skip: next "reason" -->`` (a cluster, a hub download, a 20-minute run, a fragment of the
reader's own training loop); ``pytest README.md docs -rs`` lists them with their reasons.

Each page runs in a fresh temporary folder (its ``runs/...`` outputs land there; ``.venv`` is
linked in so ``. .venv/bin/activate`` works), with this interpreter's ``bin/`` first on PATH,
against the user's own activation cache, as a reader following the page would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent
BLOCK_TIMEOUT_S = 1200


def _setup(namespace: dict) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lmgeom-docs-"))
    if (ROOT / ".venv").exists():
        (folder / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)
    namespace["_cwd_before"] = os.getcwd()
    namespace["_folder"] = folder
    os.chdir(folder)  # python blocks write runs/... here too


def _teardown(namespace: dict) -> None:
    os.chdir(namespace["_cwd_before"])


def _run_bash(example) -> str | None:
    """One ```bash block as one ``bash -e`` script; a non-zero exit fails the block with the
    script's output."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("LMGEOM_QUIET", None)
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", example.parsed], check=False,
                          cwd=example.namespace["_folder"], env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)
    if proc.returncode != 0:
        return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                f"--- stderr\n{proc.stderr[-3000:]}")
    return None


pytest_collect_file = Sybil(
    parsers=[SkipParser(), PythonCodeBlockParser(),
             CodeBlockParser(language="bash", evaluator=_run_bash)],
    patterns=["README.md", "*.md"],
    excludes=["CONTRIBUTING-helpers.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
