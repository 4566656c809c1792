"""Helpers and fixtures shared by tests/unit/test_texts.py and tests/e2e/test_texts_e2e.py."""

from __future__ import annotations

import pytest

from lmgeom.texts import (
    BUILTIN_NAMES,
    fetch_builtin,
    load_texts,
)
from lmgeom.texts import builtin as B


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def builtins():
    fetch_builtin()
    return {n: load_texts(f"builtin:{n}") for n in BUILTIN_NAMES}


@pytest.fixture(scope="module")
def gensim_wheel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    B._download_wheels(["gensim"], folder, None)
    return folder


@pytest.fixture()
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LMGEOM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "corpora"

