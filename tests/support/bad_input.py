"""Helpers and fixtures shared by tests/unit/test_bad_input.py and tests/e2e/test_bad_input_e2e.py."""

from __future__ import annotations

import pytest

from conftest import CORPUS
from lmgeom.cli import main


def cli_error(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def tiny_path(tiny_dir):
    return str(tiny_dir("llama"))


@pytest.fixture()
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(t.replace("\n", " ") for t in CORPUS[:12]) + "\n")
    return str(p)

