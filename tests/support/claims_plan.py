"""Helpers and fixtures shared by tests/unit/test_claims_plan.py and tests/e2e/test_claims_plan_e2e.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).parents[2]


def quick_looks() -> list[list[str]]:
    """The quick-look commands the README (a ``lmgeom claims`` line marked "a quick look")
    and the Makefile's comments show."""
    readme = (ROOT / "README.md").read_text()
    cmds = [ln.split("#")[0] for ln in readme.splitlines()
            if ln.startswith("lmgeom claims") and "quick look" in ln]
    make = (ROOT / "Makefile").read_text()
    cmds += re.findall(r"`(lmgeom claims [^`]*)` is the quick look", make)
    return [shlex.split(c)[1:] for c in cmds]

