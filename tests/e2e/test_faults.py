"""Faults on one machine: a disk that fills up, Ctrl-C, two runs racing for one folder, and an
unusable ``LMGEOM_CACHE`` (issue 19). The Ray cluster faults are in ``test_ray_cluster.py``.

Every run is a real ``lmgeom`` process on a tiny random model; the small disks are tmpfs
mounts (skipped, with the reason, where mounting is not allowed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import CORPUS, assert_same_table, paused_at, release, sigint_default, wait_paused

pytestmark = pytest.mark.timeout(300)

ANALYZE = ["analyze", "--k", "4", "--n-null", "10", "--ccr", "0,1", "--batch-size", "2",
           "--quiet"]


def _corpus(folder: Path, n: int = 30) -> str:
    p = folder / "corpus.txt"
    lines = [f"{CORPUS[i % len(CORPUS)].replace(chr(10), ' ')} number {i} " + "x " * (i % 7)
             for i in range(n)]
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "LMGEOM_QUIET": "1", "LMGEOM_CACHE": str(cache), **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                         env.get("PYTHONPATH", "")])
    return env


def _lmgeom(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmgeom.cli", *args]


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _one_clean_line(stderr: str) -> str:
    """The one error / interruption line (low-sample warnings of the tiny runs aside)."""
    lines = [line for line in stderr.splitlines() if line.strip() and ": warning: " not in line]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


# ---------------------------------------------------------------------- small disks
@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs (root only; CI containers often forbid mount: then skip, saying why)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = _sh("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt))
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}); "
                    "the disk-full tests need one (run as root outside a locked-down container)")
    try:
        yield mnt
    finally:
        _sh("umount", "-l", str(mnt))


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler (delete it to free the space)."""
    filler = disk / "filler.bin"
    with open(filler, "ab", buffering=0) as fh:
        for size in (1 << 16, 4096, 512, 1):  # down to the last partial page
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError:
                continue
    return filler


def _no_partial_files(*folders: Path) -> None:
    for f in folders:
        assert not list(f.rglob(".*.tmp")), list(f.rglob(".*.tmp"))


@pytest.mark.slow
def test_disk_fills_during_extract_then_rerun_resumes(small_disk, tiny_dir, tmp_path):
    """Cache and output on an 8 MiB disk that fills up mid-extraction: exit 2, one line naming
    the shard and the space, no partial shard; after freeing space the rerun computes only
    the missing shards and the result equals a clean extraction."""
    import lmgeom

    model, corpus = str(tiny_dir("llama")), _corpus(tmp_path, 30)
    cache, out = small_disk / "cache", small_disk / "acts"
    cmd = _lmgeom("extract", "--model", model, "--texts", corpus, "--batch-size", "2",
                  "--max-length", "24", "--quiet", "--out", str(out))
    hook = tmp_path / "pause"
    proc = subprocess.Popen(cmd, env=_env(cache, **paused_at(hook, "extract", 3)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    shards = lambda: list((cache / "activations").glob("*/shard-*.safetensors"))
    wait_paused(proc, hook, "extract")  # three shards stored, the fourth not begun
    assert len(shards()) == 3
    filler = _fill(small_disk)
    release(hook, "extract")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err.decode()
    line = _one_clean_line(err.decode())
    assert "out of disk space while writing" in line and "shard-" in line, line
    assert str(cache / "activations") in line and "B free on that disk" in line, line
    _no_partial_files(cache, small_disk)
    kept = len(shards())
    assert kept == 3  # the fourth of 15 batches (30 texts / 2) found the disk full
    filler.unlink()
    done = _run(cmd, _env(cache))
    assert done.returncode == 0, done.stderr
    assert f"{15 - kept} batches computed, {kept} from cache" in done.stdout, done.stdout
    got = lmgeom.load_activations(out)
    ref = lmgeom.extract(lmgeom.load_model(model), lmgeom.load_texts(corpus), batch_size=2,
                         max_length=24, cache=False)
    np.testing.assert_array_equal(got.states, ref.states)


@pytest.mark.slow
def test_output_disk_fills_during_metrics_then_rerun_reuses_layers(small_disk, tiny_dir,
                                                                   tmp_path):
    """``--out`` on a disk that fills in the metrics stage: exit 2 naming the file; the rerun
    after freeing space reuses every per-layer result already written and the cache."""
    model, corpus = str(tiny_dir("llama")), _corpus(tmp_path, 24)
    out = small_disk / "run"
    cmd = _lmgeom(*ANALYZE, "--model", model, "--texts", corpus, "--out", str(out))
    env = _env(tmp_path / "cache")
    hook = tmp_path / "pause"
    proc = subprocess.Popen(cmd, env={**env, **paused_at(hook, "metrics", 2)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = lambda: sorted((out / ".work").glob("metrics-*.json"))
    wait_paused(proc, hook, "metrics")  # two layers written, the third not begun
    assert len(metrics()) == 2
    filler = _fill(small_disk)
    release(hook, "metrics")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err.decode()
    line = _one_clean_line(err.decode())
    assert "out of disk space while writing" in line and str(out) in line, line
    _no_partial_files(out)
    before = {p.name: p.stat().st_mtime_ns for p in metrics()}
    assert len(before) == 2
    filler.unlink()
    done = _run(cmd, env)
    assert done.returncode == 0, done.stderr
    assert all(p.stat().st_mtime_ns == before[p.name] for p in metrics() if p.name in before)
    man = json.loads((out / "manifest.json").read_text())
    assert man["models"][0]["batches_cached"] == 12  # 24 texts / 2: nothing recomputed
    clean = tmp_path / "clean"
    ok = _run(cmd[:-1] + [str(clean), "--no-cache"], env)
    assert ok.returncode == 0, ok.stderr
    assert_same_table(out / "layers.csv", clean / "layers.csv")


def test_atomic_write_on_a_full_disk_names_path_and_size(small_disk):
    from lmgeom._io import atomic_path, write_bytes
    from lmgeom.errors import CacheError

    _fill(small_disk)
    target = small_disk / "d" / "table.bin"
    target.parent.mkdir(exist_ok=True)  # a folder costs no data pages
    with pytest.raises(CacheError) as info:
        write_bytes(target, b"x" * 200_000)
    msg = str(info.value)
    assert str(target) in msg and "needs 195.3 KiB" in msg and "0 B free on that disk" in msg, msg
    assert not target.exists() and not list(target.parent.iterdir())
    # a library that wraps ENOSPC in its own exception (safetensors does) is recognised too
    from safetensors.numpy import save_file

    shard = target.parent / "shard-00000.safetensors"
    with pytest.raises(CacheError, match="out of disk space while writing .*shard-00000"), \
            atomic_path(shard) as tmp:
        save_file({"x": np.zeros(100_000, np.float32)}, str(tmp))
    assert not list(target.parent.iterdir())


# ---------------------------------------------------------------------- Ctrl-C
@pytest.fixture(scope="module")
def clean_analyze(tiny_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("clean-analyze")
    model, corpus = str(tiny_dir("llama")), _corpus(base, 30)
    out = base / "run"
    r = _run(_lmgeom(*ANALYZE, "--model", model, "--texts", corpus, "--out", str(out),
             "--no-cache"), _env(base / "cache"))
    assert r.returncode == 0, r.stderr
    return model, corpus, out


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["extract", "metrics", "report"])
def test_ctrl_c_in_each_stage_keeps_work_and_rerun_resumes(stage, clean_analyze, tmp_path):
    model, corpus, clean = clean_analyze
    cache, out = tmp_path / "cache", tmp_path / "run"
    cmd = _lmgeom(*ANALYZE, "--model", model, "--texts", corpus, "--out", str(out))
    hook = tmp_path / "pause"
    # stopped inside the stage: after 2 stored batches / 2 written layers / 1 section's plots
    proc = subprocess.Popen(cmd, env=_env(cache, **paused_at(hook, stage, 1 if stage == "report"
                                                             else 2)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=sigint_default)
    shards = lambda: list((cache / "activations").glob("*/shard-*.safetensors"))
    metrics = lambda: list((out / ".work").glob("metrics-*.json"))
    wait_paused(proc, hook, stage)
    if stage == "extract":
        assert len(shards()) == 2
    elif stage == "metrics":
        assert len(shards()) == 15 and len(metrics()) == 2
    else:
        assert list((out / "plots").glob("*.png"))
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # no-op once it ended; a run that ignored the signal must not linger
    assert proc.returncode == 130, err.decode()
    line = _one_clean_line(err.decode())
    assert line.startswith("lmgeom analyze: interrupted; kept "), line
    assert "activation shard" in line and "rerun the same command" in line, line
    if stage != "extract":
        assert f"of finished layers / jobs in {out / '.work'}" in line, line
    assert not (out / "manifest.json").exists()  # written last: the run did not finish
    if stage != "report":  # the table is written just before the report
        assert not list(out.glob("layers.*"))
    _no_partial_files(cache, out)
    n_shards = len(shards())
    before = {p.name: p.stat().st_mtime_ns for p in metrics()}
    done = _run(cmd, _env(cache))
    assert done.returncode == 0, done.stderr
    man = json.loads((out / "manifest.json").read_text())
    assert man["models"][0]["batches_cached"] == n_shards > 0  # fewer batches computed
    if stage == "extract":
        assert n_shards == 2
    else:
        assert n_shards == 15 and len(before) >= 2
        assert all(p.stat().st_mtime_ns == before[p.name] for p in metrics()
                   if p.name in before)  # per-layer results reused, not rewritten
    assert_same_table(out / "layers.csv", clean / "layers.csv")


# ---------------------------------------------------------------------- racing runs
@pytest.mark.slow
def test_two_analyze_runs_racing_for_one_out(clean_analyze, tmp_path):
    """A holds ``--out``; B (other settings) is refused at once with a clear error, and the
    folder is A's alone (signature marker = manifest = A's settings = the table's contents).
    B after A is refused too (different run), and with --overwrite replaces it whole."""
    from lmgeom.results.folder import run_signature

    model, corpus, _ = clean_analyze
    out = tmp_path / "run"
    env = _env(tmp_path / "cache")
    a_cmd = _lmgeom(*ANALYZE, "--model", model, "--texts", corpus, "--out", str(out))
    b_cmd = [*a_cmd, "--ccr", "1"]  # the last --ccr wins: a different run
    hook = tmp_path / "pause"
    a = subprocess.Popen(a_cmd, env={**env, **paused_at(hook, "extract")},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_paused(a, hook, "extract")  # A holds --out and is inside its extraction
    assert (out / ".lmgeom-run").is_file()
    b = _run(b_cmd, env)
    assert a.poll() is None, "A must still be running while B tries"  # it waits for release
    release(hook, "extract")
    assert b.returncode == 2, b.stderr
    line = _one_clean_line(b.stderr)
    assert f"another lmgeom run is writing to {out} right now" in line, line
    _, a_err = a.communicate(timeout=240)
    assert a.returncode == 0, a_err.decode()

    def consistent(ccr: set[str]) -> str:
        marker = json.loads((out / ".lmgeom-run").read_text())["signature"]
        man = json.loads((out / "manifest.json").read_text())
        assert man["signature"] == marker == run_signature(man["settings"])
        df = pd.read_parquet(out / "layers.parquet")
        assert set(df[df.metric == "pga_z"].setting) == ccr
        assert sorted(man["settings"]["sweep"]["ccr"]) == sorted(int(c[4:]) for c in ccr)
        for f in (out / ".work").glob("metrics-*.json"):  # the resume state is this run's too
            assert {r["setting"] for r in json.loads(f.read_text()) if "setting" in r} <= ccr
        return marker

    sig_a = consistent({"ccr=0", "ccr=1"})
    table_a = (out / "layers.csv").read_bytes()
    b = _run(b_cmd, env)
    assert b.returncode == 2 and "already holds a different run" in _one_clean_line(b.stderr)
    assert (out / "layers.csv").read_bytes() == table_a and consistent({"ccr=0", "ccr=1"})
    b = _run([*b_cmd, "--overwrite"], env)
    assert b.returncode == 0, b.stderr
    assert consistent({"ccr=1"}) != sig_a


# ---------------------------------------------------------------------- unusable LMGEOM_CACHE
def _analyze_refused(monkeypatch, capsys, cache: Path, model: str, corpus: str, out: Path) -> str:
    """Run analyze in-process with LMGEOM_CACHE=cache; it must exit 2 before any forward."""
    from lmgeom.activations.core import ExtractionPlan
    from lmgeom.cli import main

    def no_forward(*a, **k):
        raise AssertionError("a forward pass ran although the cache is unusable")

    monkeypatch.setattr(ExtractionPlan, "run_batch", no_forward)
    monkeypatch.setenv("LMGEOM_CACHE", str(cache))
    capsys.readouterr()
    assert main([*ANALYZE, "--model", model, "--texts", corpus, "--out", str(out)]) == 2
    return _one_clean_line(capsys.readouterr().err)


def test_cache_that_is_a_file_is_refused_before_any_forward(monkeypatch, capsys, tiny_dir,
                                                            tmp_path):
    f = tmp_path / "cache-file"
    f.write_text("not a folder")
    line = _analyze_refused(monkeypatch, capsys, f, str(tiny_dir("llama")), _corpus(tmp_path),
                            tmp_path / "out")
    assert f"LMGEOM_CACHE={f}: it is a file, not a folder" in line, line
    line = _analyze_refused(monkeypatch, capsys, f / "sub", str(tiny_dir("llama")),
                            _corpus(tmp_path), tmp_path / "out2")
    assert f"lies under {f}, which is a file" in line, line


def test_read_only_cache_is_refused_before_any_forward(monkeypatch, capsys, tiny_dir, tmp_path):
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    r = _sh("mount", "--bind", str(src), str(ro))
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({r.stderr.strip()}); root ignores file modes, so a "
                    "read-only folder needs a read-only mount")
    try:
        r = _sh("mount", "-o", "remount,bind,ro", str(ro))
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only here ({r.stderr.strip()})")
        line = _analyze_refused(monkeypatch, capsys, ro, str(tiny_dir("llama")),
                                _corpus(tmp_path), tmp_path / "out")
        assert f"LMGEOM_CACHE={ro} is not writable (Read-only file system)" in line, line
    finally:
        _sh("umount", "-l", str(ro))


def test_cache_on_a_full_disk_is_refused_before_any_forward(monkeypatch, capsys, small_disk,
                                                            tiny_dir, tmp_path):
    (small_disk / "cache").mkdir()
    _fill(small_disk)
    line = _analyze_refused(monkeypatch, capsys, small_disk / "cache", str(tiny_dir("llama")),
                            _corpus(tmp_path), tmp_path / "out")
    assert f"LMGEOM_CACHE={small_disk / 'cache'}: the disk is full (0 B free" in line, line


def test_check_cache_writable_api(tmp_path):
    from lmgeom._paths import check_cache_writable
    from lmgeom.errors import CacheError

    assert check_cache_writable(tmp_path / "new" / "cache").is_dir()
    assert not [p for p in (tmp_path / "new" / "cache").iterdir()]  # the probe is removed
    (tmp_path / "f").write_text("x")
    with pytest.raises(CacheError, match="is a file, not a folder"):
        check_cache_writable(tmp_path / "f")
