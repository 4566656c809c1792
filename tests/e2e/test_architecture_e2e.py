"""The shape of the code: layers import only layers below them (also inside functions and
through ``importlib``), no import cycles between subpackages, no ``_private`` names imported
from another module, thin commands, and ``python -m lmgeom`` = the ``lmgeom`` script.

End-to-end half (the unit half is tests/unit/test_architecture.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_python_m_lmgeom_is_the_script():
    r = subprocess.run([sys.executable, "-m", "lmgeom", "--version"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    from lmgeom import __version__

    assert r.stdout.strip() == f"lmgeom {__version__}"
    r = subprocess.run([sys.executable, "-m", "lmgeom", "texts", "--nope"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr

