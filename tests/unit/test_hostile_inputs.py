"""Hostile inputs, part 1: output paths, stale results and concurrent writers (issue 26).

Every case asserts either exit 2 with one line naming the input (and nothing deleted or
replaced), or a correct result. The other parts are ``test_hostile_texts.py`` (files and
encodings), ``test_hostile_cli.py`` (options, devices, environment, models) and
``test_hostile_stats.py`` (statistically empty numbers).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from support.hostile_inputs import (
    ANALYZE,
    corpus,  # noqa: F401 (a fixture)
    error_line,
    make_extract,
    no_model,
    tiny_path,  # noqa: F401 (a fixture)
)

from conftest import build_tiny
from lmgeom.cli import main
from lmgeom.errors import CacheError

pytestmark = pytest.mark.timeout(600)


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(".lmgeom-lock")}


def _user_folder(path: Path) -> dict[str, str]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "thesis.tex").write_text("\\section{years of work}\n")
    (path / "data").mkdir(exist_ok=True)
    (path / "data" / "results.csv").write_text("a,b\n1,2\n")
    return _tree(path)


# ------------------------------------------------------------------ never delete user files
RUN_COMMANDS = [
    ["analyze"], ["dispersion"], ["hardness"], ["clusters"], ["converge"], ["probe"],
    ["sweep", "--model", "x/y"], ["select", "--model", "x/y", "--model", "x/z"],
]


@pytest.mark.parametrize("cmd", RUN_COMMANDS, ids=lambda c: c[0])
def test_overwrite_never_empties_a_user_folder(cmd, tmp_path, capsys, monkeypatch):
    out = tmp_path / "mine"
    before = _user_folder(out)
    no_model(monkeypatch)
    rc = main([*cmd, "--out", str(out), "--overwrite"])
    line = error_line(capsys)
    assert rc == 2 and str(out) in line and "lmgeom run" in line
    assert "--overwrite" not in line.split("choose")[0] or "never" in line
    assert _tree(out) == before


@pytest.mark.parametrize("where", ["cache", "inside-cache", "contains-cache", "cwd", "parent",
                                   "home"])
def test_out_that_is_cache_cwd_parent_or_home_is_refused(where, tmp_path, capsys, monkeypatch):
    cache = Path(os.environ["LMGEOM_CACHE"])
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("x")
    monkeypatch.chdir(work)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    out = {"cache": cache, "inside-cache": cache / "models", "contains-cache": cache.parent,
           "cwd": Path("."), "parent": Path(".."), "home": home}[where]
    snapshot = sorted(p.name for p in Path(out).iterdir()) if Path(out).is_dir() else None
    no_model(monkeypatch)
    assert main(["analyze", "--out", str(out), "--overwrite"]) == 2
    line = error_line(capsys)
    assert str(out) in line and ("cache" in line or "current folder" in line or "home" in line)
    if snapshot is not None:
        assert sorted(p.name for p in Path(out).iterdir()) == snapshot
    assert (work / "keep.txt").is_file()


def test_a_new_subfolder_of_the_current_folder_is_fine(tmp_path, monkeypatch):
    from lmgeom.results.folder import prepare_out_dir

    monkeypatch.chdir(tmp_path)
    assert prepare_out_dir("runs/x", "sig").is_dir()


def test_fake_marker_does_not_make_a_folder_lmgeoms(tmp_path, capsys, monkeypatch):
    out = tmp_path / "fake"
    before = _user_folder(out)
    (out / ".lmgeom-run").write_text(json.dumps({"signature": "0" * 16}))
    before = _tree(out)
    no_model(monkeypatch)
    assert main(["analyze", "--out", str(out), "--overwrite"]) == 2
    assert "no .lmgeom-run marker written by lmgeom" in error_line(capsys)
    assert _tree(out) == before


def test_output_lmgeom_wrote_then_user_edited_is_not_replaced(tmp_path):
    from lmgeom._io import write_json, written_by_lmgeom

    p = tmp_path / "table.json"
    write_json(p, {"a": 1})
    assert written_by_lmgeom(p)
    write_json(p, {"a": 2})  # lmgeom's own file: replaced
    p.write_text('{"a": "edited by hand"}')
    assert not written_by_lmgeom(p)
    with pytest.raises(CacheError, match="did not write"):
        write_json(p, {"a": 3})
    assert "edited by hand" in p.read_text()


def test_api_run_experiment_refuses_a_user_folder(tmp_path):
    from lmgeom.experiments import AnalyzeConfig, run_experiment

    out = tmp_path / "api"
    before = _user_folder(out)
    with pytest.raises(CacheError, match="holds no lmgeom run"):
        run_experiment(AnalyzeConfig(models=("nope",)), out, overwrite=True)
    assert _tree(out) == before


@pytest.mark.parametrize("fmt, victim", [("safetensors", "acts.safetensors"),
                                         ("safetensors", "acts.json"),
                                         ("parquet", "acts.parquet"),
                                         ("hf", "acts/data-00000-of-00001.arrow")])
def test_extract_never_replaces_a_foreign_file(fmt, victim, tiny_path, corpus, tmp_path, capsys,
                                               monkeypatch):
    v = tmp_path / victim
    v.parent.mkdir(parents=True, exist_ok=True)
    v.write_bytes(b"user data")
    before = _tree(tmp_path)
    no_model(monkeypatch)
    rc = main(make_extract(tiny_path, corpus, tmp_path / "acts", "--format", fmt))
    line = error_line(capsys)
    assert rc == 2 and "lmgeom did not write" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("fmt", ["safetensors", "parquet", "hf"])
def test_extract_rerun_replaces_its_own_output(fmt, tiny_path, corpus, tmp_path, capsys):
    out = tmp_path / "acts"
    assert main(make_extract(tiny_path, corpus, out, "--format", fmt)) == 0
    (tmp_path / "neighbour.txt").write_text("keep")
    assert main(make_extract(tiny_path, corpus, out, "--format", fmt, "--n", "6")) == 0
    from lmgeom.activations import from_disk

    src = out if fmt == "hf" else (tmp_path / "acts.parquet" if fmt == "parquet" else out)
    assert from_disk(src).states.shape[1] == 6
    assert (tmp_path / "neighbour.txt").read_text() == "keep"


def test_extract_hf_never_deletes_an_existing_folder(tiny_path, corpus, tmp_path, capsys,
                                                     monkeypatch):
    out = tmp_path / "dataset"
    before = _user_folder(out)
    no_model(monkeypatch)
    assert main(make_extract(tiny_path, corpus, out, "--format", "hf")) == 2
    assert "lmgeom did not write" in error_line(capsys)
    assert _tree(out) == before


@pytest.mark.parametrize("flag", ["--out", "--per-token", "--log-samples"])
def test_ppl_outputs_never_replace_foreign_files(flag, tiny_path, corpus, tmp_path, capsys,
                                                 monkeypatch):
    victim = tmp_path / ("x.csv" if flag == "--out" else "x.parquet")
    victim.write_text("precious")
    no_model(monkeypatch)
    rc = main(["ppl", "--model", tiny_path, "--texts", corpus, "--quiet", flag, str(victim)])
    line = error_line(capsys)
    assert rc == 2 and flag in line and str(victim) in line
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("argv, needle", [
    (["--out", "x.xlsx"], "unsupported file type '.xlsx'"),
    (["--per-token", "x.csv"], "unsupported file type '.csv'"),
    (["--out", "same.parquet", "--per-token", "same.parquet"], "name the same file"),
    (["--out", "DIR"], "is a folder"),
    (["--per-token", "DIR"], "is a folder"),
    (["--out", "FILE/x.csv"], "is a file, not a folder"),
])
def test_ppl_output_options_are_checked_before_work(argv, needle, tiny_path, corpus, tmp_path,
                                                    capsys, monkeypatch):
    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("x")
    monkeypatch.chdir(tmp_path)
    no_model(monkeypatch)
    assert main(["ppl", "--model", tiny_path, "--texts", corpus, "--quiet", *argv]) == 2
    assert needle in error_line(capsys)


def test_ppl_rerun_replaces_its_own_table(tiny_path, corpus, tmp_path, capsys):
    out = tmp_path / "ppl.csv"
    argv = ["ppl", "--model", tiny_path, "--texts", corpus, "--quiet", "--max-length", "16",
            "--out", str(out)]
    assert main(argv) == 0
    assert main([*argv, "--n", "5"]) == 0
    assert len(pd.read_csv(out)) == 5


@pytest.mark.parametrize("target, needle", [("user.csv", "did not write"),
                                            ("DIR", "is a folder"),
                                            ("t.xlsx", "unsupported file type")])
def test_pga_csv_checked_before_work(target, needle, tiny_path, corpus, tmp_path, capsys,
                                     monkeypatch):
    (tmp_path / "user.csv").write_text("precious")
    (tmp_path / "DIR").mkdir()
    no_model(monkeypatch)
    assert main(["pga", "--model", tiny_path, "--texts", corpus, "--csv",
                 str(tmp_path / target)]) == 2
    assert needle in error_line(capsys)
    assert (tmp_path / "user.csv").read_text() == "precious"


def test_dispersion_attach_refuses_a_folder_that_is_not_a_run(tmp_path, capsys, monkeypatch):
    target = tmp_path / "notes"
    before = _user_folder(target)
    no_model(monkeypatch)
    assert main(["dispersion", "--attach", str(target), "--out", str(tmp_path / "d")]) == 2
    assert "not a finished lmgeom run folder" in error_line(capsys)
    assert _tree(target) == before
    assert not (tmp_path / "d").exists()


def test_suite_refuses_a_user_folder(tmp_path, capsys):
    out = tmp_path / "suite"
    before = _user_folder(out)
    (out / "suite.json").write_text("{}")
    before = _tree(out)
    assert main(["suite", "train", "--out", str(out), "--overwrite", "--micro"]) == 2
    assert "suite folder lmgeom wrote" in error_line(capsys)
    assert _tree(out) == before


def test_train_refuses_a_user_folder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "ft"
    before = _user_folder(out)
    no_model(monkeypatch)
    assert main(["train", "--out", str(out), "--overwrite", "--steps", "2"]) == 2
    assert "holds no lmgeom run" in error_line(capsys)
    assert _tree(out) == before


def test_cached_file_hash_sees_a_file_replaced_with_its_old_mtime(tmp_path):
    from lmgeom.models.load import cached_file_hash

    p = tmp_path / "w.gguf"
    p.write_bytes(b"a" * 100)
    h1 = cached_file_hash(p)
    st = p.stat()
    p.write_bytes(b"b" * 100)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cached_file_hash(p) != h1


def _fake_hub(cache: Path, repo: str, commits: dict[str, str], refs: dict[str, str]) -> None:
    base = cache / f"models--{repo.replace('/', '--')}"
    for commit, payload in commits.items():
        snap = base / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text(payload)
    (base / "refs").mkdir(parents=True, exist_ok=True)
    for ref, commit in refs.items():
        (base / "refs" / ref).write_text(commit)


def test_moved_hub_revision_changes_the_sweep_job_key(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import JobOptions, JobSpec, job_key
    from lmgeom.models.load import model_fingerprint
    from lmgeom.texts import as_textset

    cache = tmp_path / "hub"
    a, b = "a" * 40, "b" * 40
    _fake_hub(cache, "org/m", {a: "{}", b: "{ }"}, {"step1": a})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    job = JobSpec(model="org/m", spec="org/m", revision="step1", hub_revision="step1")
    texts = as_textset(["one text", "two texts"])
    cfg, opt = LayerSweepConfig(), JobOptions()
    k1, f1 = job_key(job, texts, cfg, opt), model_fingerprint("org/m", "step1")
    _fake_hub(cache, "org/m", {}, {"step1": b})  # the branch moved
    k2, f2 = job_key(job, texts, cfg, opt), model_fingerprint("org/m", "step1")
    assert f1["commit"] == a and f2["commit"] == b
    assert k1 != k2


def test_sweep_job_key_follows_weights_replaced_in_place(tmp_path):
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import JobOptions, JobSpec, job_key
    from lmgeom.texts import as_textset

    model = build_tiny(tmp_path / "m", "llama", seed=0)
    other = build_tiny(tmp_path / "o", "llama", seed=1)
    job = JobSpec(model="m", spec=str(model))
    texts = as_textset(["one text", "two texts"])
    k1 = job_key(job, texts, LayerSweepConfig(), JobOptions())
    shutil.copyfile(other / "model.safetensors", model / "model.safetensors")
    assert job_key(job, texts, LayerSweepConfig(), JobOptions()) != k1


def test_finetune_signature_follows_the_corpus_content(tmp_path):
    from lmgeom.texts import source_fingerprint

    p = tmp_path / "c.txt"
    p.write_text("one\n")
    f1 = source_fingerprint(str(p))
    p.write_text("two\n")
    assert source_fingerprint(str(p)) != f1
    assert source_fingerprint("builtin:wiki") is None


# ------------------------------------------------------------------ concurrent writers
_HOLD = """
import sys
from lmgeom.results.folder import acquire_output_lock
acquire_output_lock(sys.argv[1])
print("held", flush=True)
sys.stdin.read()  # holds until the test kills it or ends (its end closes the pipe)
"""


def _hold_lock(path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("kind", ["extract-safetensors", "extract-parquet", "ppl-out", "pga-csv",
                                  "analyze-out"])
def test_a_second_writer_is_refused_while_the_first_writes(kind, tiny_path, corpus, tmp_path,
                                                            capsys, monkeypatch):
    target = {"extract-safetensors": tmp_path / "acts.safetensors",
              "extract-parquet": tmp_path / "acts.parquet",
              "ppl-out": tmp_path / "p.csv", "pga-csv": tmp_path / "z.csv",
              "analyze-out": tmp_path / "run"}[kind]
    argv = {"extract-safetensors": make_extract(tiny_path, corpus, tmp_path / "acts"),
            "extract-parquet": make_extract(tiny_path, corpus, tmp_path / "acts", "--format",
                                        "parquet"),
            "ppl-out": ["ppl", "--model", tiny_path, "--texts", corpus, "--out", str(target)],
            "pga-csv": ["pga", "--model", tiny_path, "--texts", corpus, "--csv", str(target)],
            "analyze-out": [*ANALYZE, "--model", tiny_path, "--texts", corpus, "--out",
                            str(target)]}[kind]
    proc = _hold_lock(target)
    try:
        no_model(monkeypatch)
        assert main(argv) == 2
        assert "another lmgeom run is writing to" in error_line(capsys)
    finally:
        proc.kill()
        proc.wait()
    assert not target.exists() or target.is_dir()


# ------------------------------------------------------------------ more odd output paths
@pytest.mark.parametrize("how", ["symlink-to-cache", "tilde-home", "empty-string",
                                 "under-a-file", "trailing-dotdot"])
def test_odd_out_paths(how, tmp_path, capsys, monkeypatch):
    cache = Path(os.environ["LMGEOM_CACHE"])
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "file.txt").write_text("x")
    if how == "symlink-to-cache":
        (work / "link").symlink_to(cache, target_is_directory=True)
    out = {"symlink-to-cache": "link", "tilde-home": "~", "empty-string": "",
           "under-a-file": "file.txt/run", "trailing-dotdot": "runs/.."}[how]
    no_model(monkeypatch)
    assert main(["analyze", "--out", out]) == 2
    line = error_line(capsys)
    assert {"symlink-to-cache": "cache", "tilde-home": "home folder",
            "empty-string": "got an empty string", "under-a-file": "file.txt",
            "trailing-dotdot": "current folder"}[how] in line
    assert (work / "file.txt").read_text() == "x"


def test_api_export_onto_a_foreign_file(tmp_path):
    import numpy as np

    from lmgeom.activations import Activations
    from lmgeom.activations.export import export_activations

    acts = Activations(states=np.ones((1, 2, 3), np.float32), layers=("1",), model="m",
                       model_identity={}, texts_hash="h", text_ids=("a", "b"), labels=None,
                       settings={"pooling": "last"}, n_tokens=np.array([3, 4]), n_truncated=0)
    (tmp_path / "a.parquet").write_bytes(b"mine")
    with pytest.raises(CacheError, match="did not write"):
        export_activations(acts, tmp_path / "a", format="parquet")
    assert (tmp_path / "a.parquet").read_bytes() == b"mine"
    export_activations(acts, tmp_path / "b", format="parquet")  # a new path is fine
    export_activations(acts, tmp_path / "b", format="parquet")  # and its own file again


def test_ctrl_c_during_extract_releases_the_lock_and_writes_nothing(tiny_path, corpus, tmp_path,
                                                                     capsys, monkeypatch):
    from lmgeom.activations import export

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "export_activations", interrupted)
    out = tmp_path / "acts"
    assert main(make_extract(tiny_path, corpus, out)) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "acts.safetensors").exists()
    proc = _hold_lock(tmp_path / "acts.safetensors")  # another process can take it at once
    proc.kill()
    proc.wait()


def test_attach_refuses_a_run_whose_manifest_was_edited(tmp_path, capsys, monkeypatch):
    from lmgeom._io import write_json
    from lmgeom.results.folder import prepare_out_dir

    run = prepare_out_dir(tmp_path / "run", "sig")
    write_json(run / "manifest.json", {"command": "analyze"})
    (run / "manifest.json").write_text("{}")
    no_model(monkeypatch)
    assert main(["dispersion", "--attach", str(run), "--out", str(tmp_path / "d")]) == 2
    assert "not a finished lmgeom run folder" in error_line(capsys)


def test_leftover_temporaries_of_other_programs_are_kept(tmp_path):
    from lmgeom._io import write_json
    from lmgeom.results.folder import prepare_out_dir

    run = prepare_out_dir(tmp_path / "run", "sig")
    (run / ".notes.tmp").write_text("a user's temporary file")
    (run / ".layers.parquet.lmgeom-abc123.tmp").write_text("left by a killed lmgeom writer")
    write_json(run / "x.json", {})
    prepare_out_dir(run, "sig")  # a rerun cleans only lmgeom's leftovers
    assert (run / ".notes.tmp").is_file()
    assert not (run / ".layers.parquet.lmgeom-abc123.tmp").exists()


def test_readme_checks_table_names_real_tests():
    """Each row of the "What lmgeom checks for you" table (docs/checks.md) names tests that
    exist."""
    import re

    root = Path(__file__).parents[2]
    section = (root / "docs" / "checks.md").read_text()
    files = {"bad": "test_bad_input.py", "hostile": "test_hostile_inputs.py",
             "h-texts": "test_hostile_texts.py", "h-cli": "test_hostile_cli.py",
             "h-stats": "test_hostile_stats.py", "faults": "test_faults.py",
             "rel": "test_reliability.py", "ray": "test_ray_cluster.py", "trust": "test_trust.py"}
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) >= 30
    for row in rows:
        cell = row.rstrip(" |").rsplit("|", 1)[1]
        named, current = 0, None
        for word, name in re.findall(r"(?:^|[\s,;])([a-z][a-z-]*) (?=`)|`(test_\w+)`", cell):
            if word:
                assert word in files, (word, row)
                current = files[word]
                continue
            assert current is not None, row
            stem = current[:-3]  # the module, or its halves: tests/unit/X.py, tests/e2e/X(_e2e).py
            halves = [root / "tests" / kind / f"{stem}{suffix}.py" for kind in ("unit", "e2e")
                      for suffix in ("", "_e2e")]
            src = "".join(h.read_text() for h in halves if h.is_file())
            assert src and f"def {name}(" in src, (name, current)
            named += 1
        assert named, row


def test_changing_the_cache_forgets_nothing(tmp_path, monkeypatch):
    """What lmgeom wrote is recorded apart from the cache: another LMGEOM_CACHE (or a deleted
    cache) still lets a rerun replace its own run folder."""
    from lmgeom._io import write_json, written_by_lmgeom
    from lmgeom.results.folder import prepare_out_dir

    run = prepare_out_dir(tmp_path / "run", "sig")
    write_json(run / "manifest.json", {})
    monkeypatch.setenv("LMGEOM_CACHE", str(tmp_path / "other-cache"))
    assert written_by_lmgeom(run / "manifest.json")
    prepare_out_dir(run, "sig2", overwrite=True)
    assert not (run / "manifest.json").exists()


def test_extract_hf_never_replaces_a_run_folder_of_lmgeoms(tmp_path, tiny_path, corpus, capsys,
                                                            monkeypatch):
    """An lmgeom run folder (all its files lmgeom's) is still not a dataset: `extract --format hf`
    must not replace it."""
    from lmgeom._io import write_json
    from lmgeom.results.folder import prepare_out_dir

    run = prepare_out_dir(tmp_path / "run", "sig")
    write_json(run / "manifest.json", {"command": "analyze"})
    before = _tree(run)
    no_model(monkeypatch)
    assert main(make_extract(tiny_path, corpus, run, "--format", "hf")) == 2
    assert "does not hold a saved dataset" in error_line(capsys)
    assert _tree(run) == before


@pytest.mark.parametrize("out", ["/proc/lmgeom-out", "/sys/lmgeom/x"])
def test_an_unwritable_out_is_named_as_such(out, tiny_path, corpus, capsys, monkeypatch):
    no_model(monkeypatch)
    assert main(make_extract(tiny_path, corpus, out)) == 2
    line = error_line(capsys)
    assert "another lmgeom run" not in line and "--out" in line


def test_record_tree_never_adopts_a_file_left_there_before(tmp_path):
    """The suite / fine-tuning record what they wrote with ``record_tree(since_ns=start)``: a
    user's file already in the folder stays foreign, so a later --overwrite keeps it."""
    from lmgeom._io import fs_clock_ns, record_tree, remove_written, written_by_lmgeom

    (tmp_path / "notes.txt").write_text("mine")
    old = time.time_ns() - 10**9
    os.utime(tmp_path / "notes.txt", ns=(old, old))
    before = (tmp_path / "notes.txt").stat().st_ctime_ns  # utime stamps ctime with "now"
    start = fs_clock_ns(tmp_path)
    while start <= before:  # the filesystem's coarse clock has not ticked since: wait for it
        start = fs_clock_ns(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(b"weights")
    record_tree(tmp_path, since_ns=start)
    assert written_by_lmgeom(tmp_path / "ckpt" / "w.bin")
    assert not written_by_lmgeom(tmp_path / "notes.txt")
    removed, kept = remove_written(tmp_path)
    assert removed == 1 and kept == [tmp_path / "notes.txt"]

