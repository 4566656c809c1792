"""Hostile inputs, part 1: output paths, stale results and concurrent writers (issue 26).

Every case asserts either exit 2 with one line naming the input (and nothing deleted or
replaced), or a correct result. The other parts are ``test_hostile_texts.py`` (files and
encodings), ``test_hostile_cli.py`` (options, devices, environment, models) and
``test_hostile_stats.py`` (statistically empty numbers).

End-to-end half (the unit half is tests/unit/test_hostile_inputs.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
from support.hostile_inputs import (
    ANALYZE,
    corpus,  # noqa: F401 (a fixture)
    error_line,
    make_extract,
    no_model,
    tiny_path,  # noqa: F401 (a fixture)
)

from conftest import CORPUS, build_tiny
from lmgeom.cli import main


def test_overwrite_removes_only_the_runs_own_files(tiny_path, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    base = [*ANALYZE, "--model", tiny_path, "--texts", corpus, "--out", str(out)]
    assert main(base) == 0
    (out / "my-notes.md").write_text("keep me")
    (out / "plots").mkdir(exist_ok=True)
    (out / "plots" / "my-figure.png").write_bytes(b"\x89PNG user")
    capsys.readouterr()
    assert main([*base, "--seed", "1"]) == 2
    line = error_line(capsys)
    assert "different run" in line and "--overwrite" in line
    assert main([*base, "--seed", "1", "--overwrite"]) == 0
    assert (out / "my-notes.md").read_text() == "keep me"
    assert (out / "plots" / "my-figure.png").read_bytes() == b"\x89PNG user"
    man = json.loads((out / "manifest.json").read_text())
    assert man["settings"]["layers"]["seed"] == 1 if "layers" in man.get("settings", {}) else True


# ------------------------------------------------------------------ stale results
def test_edited_corpus_recomputes(tiny_path, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*ANALYZE, "--model", tiny_path, "--texts", corpus, "--out", str(out)]
    assert main(argv) == 0
    z_old = pd.read_parquet(out / "layers.parquet")
    Path(corpus).write_text("\n".join(f"A different corpus line {i}: {CORPUS[(3 * i) % 5]}"
                                      .replace("\n", " ") for i in range(24)) + "\n")
    assert main(argv) == 0
    z_new = pd.read_parquet(out / "layers.parquet")
    fresh = tmp_path / "fresh"
    assert main([*argv[:-1], str(fresh)]) == 0
    z_fresh = pd.read_parquet(fresh / "layers.parquet")
    cols = ["layer", "metric", "setting", "value"]
    assert not z_new[cols].equals(z_old[cols])
    pd.testing.assert_frame_equal(z_new[cols], z_fresh[cols])


def test_weights_replaced_in_place_recompute(tmp_path, corpus, capsys):
    model = build_tiny(tmp_path / "model", "llama", seed=0)
    other = build_tiny(tmp_path / "other", "llama", seed=5)
    out = tmp_path / "run"
    argv = [*ANALYZE, "--model", str(model), "--texts", corpus, "--out", str(out)]
    assert main(argv) == 0
    z_old = pd.read_parquet(out / "layers.parquet")
    st = (model / "model.safetensors").stat()
    shutil.copyfile(other / "model.safetensors", model / "model.safetensors")
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    assert main(argv) == 0
    z_new = pd.read_parquet(out / "layers.parquet")
    man = json.loads((out / "manifest.json").read_text())
    cols = ["layer", "metric", "setting", "value"]
    assert not z_new[cols].equals(z_old[cols])
    from lmgeom.models.load import weights_hash

    assert weights_hash(model) == weights_hash(other)
    assert weights_hash(other) in json.dumps(man)


def test_two_extract_processes_on_one_out(tiny_path, corpus, tmp_path):
    """Two real processes on one --out: while the first is inside its extraction (held at a
    pause point, so the overlap is certain), the second is refused and writes nothing; the
    first then finishes and its result is the one on disk."""
    from conftest import paused_at, release, wait_paused

    env = {**os.environ, "LMGEOM_QUIET": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "acts"
    cmds = [[sys.executable, "-m", "lmgeom.cli", *make_extract(tiny_path, corpus, out, "--seed",
                                                          str(s), "--n", str(6 + s))]
            for s in (0, 1)]
    hook = tmp_path / "pause"
    first = subprocess.Popen(cmds[0], env={**env, **paused_at(hook, "extract-lock")},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_paused(first, hook, "extract-lock")  # reached even when every batch is cached
    second = subprocess.run(cmds[1], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2 and "another lmgeom run is writing" in second.stderr, second
    assert first.poll() is None  # still held: the refusal happened during its run
    release(hook, "extract-lock")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    from lmgeom.activations import load_activations

    assert load_activations(out).states.shape[1] == 6  # the first run's 6 texts, not 7


def test_rerun_refuses_before_work_when_the_table_was_edited_by_hand(tiny_path, corpus,
                                                                      tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "run"
    argv = [*ANALYZE, "--model", tiny_path, "--texts", corpus, "--out", str(out)]
    assert main(argv) == 0
    (out / "layers.csv").write_text("my edited table\n")  # another size: a changed identity
    no_model(monkeypatch)
    for extra in ([], ["--seed", "3", "--overwrite"]):
        assert main([*argv, *extra]) == 2
        assert "layers.csv already exists and lmgeom did not write it" in error_line(capsys)
    assert (out / "layers.csv").read_text() == "my edited table\n"

