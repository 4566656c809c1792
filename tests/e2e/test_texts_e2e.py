"""Texts layer: TextSet, file loaders, seeded limits, errors, wiki cleaning, built-in corpora, CLI.

End-to-end half (the unit half is tests/unit/test_texts.py).
"""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys

import pytest
from support.texts import (
    builtins,  # noqa: F401 (a fixture)
    gensim_wheel,  # noqa: F401 (a fixture)
    one_line,
    private_cache,  # noqa: F401 (a fixture)
)

from lmgeom.errors import TextsError
from lmgeom.texts import builtin as B
from lmgeom.texts import (
    fetch_builtin,
    load_texts,
)


def test_builtin_code_parses(builtins):
    code = builtins["code"]
    ok = 0
    for t in code.texts:
        try:
            tree = ast.parse(t)
        except SyntaxError:
            continue
        ok += isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    assert ok >= 0.99 * len(code)
    assert not any("/test/" in i or i.startswith(("test/", "site-packages")) for i in code.ids)


def test_autofetch_on_load_and_repair(private_cache, gensim_wheel, monkeypatch, caplog):
    monkeypatch.setenv(B.WHEELS_ENV, str(gensim_wheel))
    with caplog.at_level(logging.WARNING, logger="lmgeom.texts"):
        ts = load_texts("builtin:news")
    assert any("not fetched yet" in r.getMessage() for r in caplog.records)
    assert len(ts) >= 300 and (private_cache / "news.jsonl").is_file()
    man = json.loads((private_cache / "news.json").read_text())
    assert man["n_texts"] == len(ts) and man["source"]["member"].endswith("lee_background.cor")
    # corrupt one byte (same size): the sha256 check notices and the corpus is rebuilt
    data = bytearray((private_cache / "news.jsonl").read_bytes())
    k = data.index(b"Hundreds")
    data[k] = ord("X")
    (private_cache / "news.jsonl").write_bytes(bytes(data))
    B._MEMO.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lmgeom.texts"):
        again = load_texts("builtin:news")
    assert again == ts and any("rebuilding" in r.getMessage() for r in caplog.records)


def test_fetch_download_failure(private_cache, monkeypatch):
    w = B.WHEELS["aclsum"]
    monkeypatch.setitem(
        B.WHEELS, "aclsum", B.Wheel(w.project, "0.0.0.999", w.filename, w.sha256, w.licence)
    )
    monkeypatch.delenv(B.WHEELS_ENV, raising=False)
    with pytest.raises(TextsError, match="could not download aclsum==0.0.0.999") as e:
        fetch_builtin(["science"])
    assert B.WHEELS_ENV in one_line(e)


@pytest.mark.slow
def test_concurrent_fetch(private_cache, gensim_wheel):
    """Two processes fetching at once both succeed and leave one consistent corpus."""
    code = (
        "from lmgeom.texts import fetch_builtin, load_texts;"
        "fetch_builtin(['news', 'sentiment']);"
        "print(load_texts('builtin:news').hash)"
    )
    env = {
        **__import__("os").environ,
        B.WHEELS_ENV: str(gensim_wheel),
        "LMGEOM_CACHE": str(private_cache.parent),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    hashes = {o[0].strip() for o in outs}
    assert len(hashes) == 1
    assert sorted(x.name for x in private_cache.iterdir() if not x.name.startswith(".")) == [
        "news.json",
        "news.jsonl",
        "sentiment.json",
        "sentiment.jsonl",
    ]

