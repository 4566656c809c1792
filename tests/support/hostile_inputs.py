"""Helpers and fixtures shared by tests/unit/test_hostile_inputs.py and tests/e2e/test_hostile_inputs_e2e.py."""

from __future__ import annotations

import pytest

from conftest import CORPUS

ANALYZE = ["analyze", "--k", "4", "--n-null", "20", "--ccr", "0,1", "--layers", "1,2",
           "--quiet"]


@pytest.fixture()
def tiny_path(tiny_dir):
    return str(tiny_dir("llama"))


@pytest.fixture()
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(f"{CORPUS[i % len(CORPUS)].replace(chr(10), ' ')} item {i}"
                           for i in range(24)) + "\n")
    return str(p)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    return lines[0]


def no_model(monkeypatch):
    """Make any model load fail loudly: a check that must come before the work."""
    from lmgeom.models import load

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the output path was checked")

    monkeypatch.setattr(load, "load_model", boom)
    monkeypatch.setattr("lmgeom.models.load_model", boom, raising=False)


# ------------------------------------------------------------------ single-file writers
def make_extract(tiny_path, corpus, out, *extra):
    return ["extract", "--model", tiny_path, "--texts", corpus, "--layers", "1,final",
            "--max-length", "16", "--quiet", "--out", str(out), *extra]

