"""Bad input: every user mistake gives one clear line on the CLI (exit 2, no traceback) and a
typed exception from the library. One test per case from the reliability issue.

End-to-end half (the unit half is tests/unit/test_bad_input.py).
"""

from __future__ import annotations

import errno
import json

import pytest
from support.bad_input import cli_error, corpus, tiny_path  # noqa: F401 (fixtures)

import lmgeom
from conftest import CORPUS
from lmgeom.cli import main
from lmgeom.errors import CacheError, TextsError


# ------------------------------------------------------------------ texts
def test_empty_corpus(tmp_path, tiny_path, capsys):
    p = tmp_path / "empty.txt"
    p.write_text("\n   \n\n")
    line = cli_error(["extract", "--model", tiny_path, "--texts", str(p)], capsys)
    assert "empty" in line
    with pytest.raises(TextsError):
        lmgeom.load_texts(str(p))


def test_truncation_is_reported(tiny_path, corpus, tmp_path, capsys):
    assert main(["extract", "--model", tiny_path, "--texts", corpus, "--max-length", "4",
                 "--out", str(tmp_path / "a"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "12 truncated to 4 tokens" in out


def test_single_class_probe(tiny_path, tmp_path, capsys):
    p = tmp_path / "one_class.jsonl"
    p.write_text("\n".join(json.dumps({"text": t, "label": "a"}) for t in CORPUS[:12]) + "\n")
    line = cli_error(["probe", "--model", tiny_path, "--texts", str(p), "--k", "4", "--layers", "1",
                       "--n-null", "5", "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert "class" in line


# ------------------------------------------------------------------ disk and output folders
def test_out_of_disk_while_writing_the_cache(tiny_dir, tmp_path, monkeypatch):
    import safetensors.numpy as stnp

    model = lmgeom.load_model(str(tiny_dir("llama")))
    real = stnp.save_file
    calls = {"n": 0}

    def full_disk(tensors, path, metadata=None):
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(stnp, "save_file", full_disk)
    with pytest.raises(CacheError, match="out of disk space"):
        lmgeom.extract(model, CORPUS[:12], batch_size=2, cache_root=tmp_path)
    monkeypatch.setattr(stnp, "save_file", real)
    entry = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert not list(entry.glob(".*.tmp"))          # no partial file left behind
    assert len(list(entry.glob("shard-*.safetensors"))) == 2   # finished work kept
    acts = lmgeom.extract(model, CORPUS[:12], batch_size=2, cache_root=tmp_path)
    assert acts.timings["batches_cached"] == 2 and acts.timings["batches_computed"] == 4


def test_output_folder_of_a_different_run(tiny_path, corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    base = ["analyze", "--model", tiny_path, "--texts", corpus, "--k", "4", "--n-null", "5",
            "--ccr", "0,1", "--layers", "1,2", "--quiet", "--out", out]
    assert main(base) == 0
    capsys.readouterr()
    line = cli_error(base[:-2] + ["--seed", "1", "--out", out], capsys)
    assert "different run" in line and "--overwrite" in line
    assert main(base[:-2] + ["--seed", "1", "--out", out, "--overwrite"]) == 0

