"""Interrupted and concurrent runs, determinism, and security (reliability issue)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

import lmgeom
from conftest import CORPUS, assert_same_table, paused_at, release, wait_paused
from lmgeom import metrics as M
from lmgeom.cli import main


def _corpus(tmp_path, n=40):
    p = tmp_path / "corpus.txt"
    lines = [f"{CORPUS[i % len(CORPUS)].replace(chr(10), ' ')} number {i} " + "x " * (i % 7) for i in range(n)]
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def _env(tmp_path):
    env = {**os.environ, "LMGEOM_QUIET": "1", "LMGEOM_CACHE": str(tmp_path / "cache")}
    return env


# ------------------------------------------------------------------ determinism
def test_pga_is_bit_identical_for_a_seed_and_moves_within_uncertainty_otherwise():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((120, 24)) @ rng.standard_normal((24, 24))
    B = np.linalg.qr(rng.standard_normal((24, 6)))[0]
    a = M.subspace_pga(X, B, n_null=50, ccr=1, seed=7)
    b = M.subspace_pga(X, B, n_null=50, ccr=1, seed=7)
    assert a.z == b.z and np.array_equal(a.null, b.null)
    s = M.subspace_pga(X, B, n_null=50, ccr=1, pairs=2000, seed=7)
    assert s.z == M.subspace_pga(X, B, n_null=50, ccr=1, pairs=2000, seed=7).z
    c = M.subspace_pga(X, B, n_null=50, ccr=1, seed=8)
    assert not np.array_equal(a.null, c.null)
    # z's own sampling error: the null mean is estimated from n_null draws
    se = abs(a.z) / np.sqrt(a.n_null) + 4 / np.sqrt(a.n_null) * max(1.0, abs(a.z))
    assert abs(a.z - c.z) < se


def test_bootstrap_and_probe_splits_are_deterministic():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(200), rng.standard_normal(200)
    r1 = M.correlation_with_ci(x, y, method="spearman", n_boot=200, seed=3)
    r2 = M.correlation_with_ci(x, y, method="spearman", n_boot=200, seed=3)
    assert (r1.low, r1.high) == (r2.low, r2.high)
    X = rng.standard_normal((60, 5))
    lab = np.array(["a", "b", "c"] * 20)
    p1 = M.probe_accuracy(X, lab, seed=2)
    p2 = M.probe_accuracy(X, lab, seed=2)
    assert p1.fold_accuracies == p2.fold_accuracies


def test_analyze_tables_are_bit_identical_across_runs(tiny_dir, tmp_path):
    corpus = _corpus(tmp_path, 24)
    argv = ["analyze", "--model", str(tiny_dir("llama")), "--texts", corpus, "--k", "4", "--n-null", "10",
            "--ccr", "0,1", "--quiet", "--no-cache"]
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0
    assert main(argv + ["--out", str(tmp_path / "b")]) == 0
    a = (tmp_path / "a" / "layers.csv").read_bytes()
    assert a == (tmp_path / "b" / "layers.csv").read_bytes()


# ------------------------------------------------------------------ interrupted analyze
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["extract", "metrics", "report"])
def test_sigkill_analyze_at_each_stage_then_rerun_is_identical(stage, tiny_dir, tmp_path):
    corpus = _corpus(tmp_path, 40)
    model = str(tiny_dir("llama"))
    env = _env(tmp_path)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "lmgeom.cli", "analyze", "--model", model, "--texts", corpus,
           "--k", "4", "--n-null", "20", "--ccr", "0,1", "--batch-size", "2", "--quiet", "--out", str(out)]
    hook = tmp_path / "pause"  # stopped inside the stage at a known point, then killed there
    proc = subprocess.Popen(cmd, env={**env, **paused_at(hook, stage)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    wait_paused(proc, hook, stage)
    marker = {"extract": lambda: list((tmp_path / "cache" / "activations").glob("*/shard-*")),
              "metrics": lambda: list((out / ".work").glob("metrics-*.json")),
              "report": lambda: list((out / "plots").glob("*.png"))}[stage]
    assert marker() and proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    clean = tmp_path / "clean"
    ok = subprocess.run(cmd[:-1] + [str(clean), "--no-cache"], env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert_same_table(out / "layers.csv", clean / "layers.csv")
    assert_same_table(out / "layers.parquet", clean / "layers.parquet")
    html = (out / "report.html").read_text()
    assert html.rstrip().endswith("</html>")
    assert not list(out.rglob(".*.tmp"))


# ------------------------------------------------------------------ concurrent extraction
@pytest.mark.slow
def test_two_processes_extracting_the_same_key(tiny_dir, tmp_path):
    corpus = _corpus(tmp_path, 40)
    env = _env(tmp_path)
    cmd = [sys.executable, "-m", "lmgeom.cli", "extract", "--model", str(tiny_dir("llama")), "--texts",
           corpus, "--batch-size", "2", "--quiet"]
    # the first holds the cache entry's lock, paused after its first batch; the second is
    # started and stopped just before it asks for that lock, then both go on: the second must
    # wait for the first and compute nothing itself, in every interleaving
    hold0, hold1 = tmp_path / "p0", tmp_path / "p1"
    p0 = subprocess.Popen(cmd + ["--out", str(tmp_path / "acts0")],
                          env={**env, **paused_at(hold0, "extract")},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_paused(p0, hold0, "extract")
    p1 = subprocess.Popen(cmd + ["--out", str(tmp_path / "acts1")],
                          env={**env, **paused_at(hold1, "extract-lock")},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_paused(p1, hold1, "extract-lock")
    release(hold1, "extract-lock")
    release(hold0, "extract")
    outs = []
    for p in (p0, p1):
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr.decode()
        outs.append(stdout.decode())
    assert "20 batches computed, 0 from cache" in outs[0], outs[0]
    assert "0 batches computed, 20 from cache" in outs[1], outs[1]
    a0 = lmgeom.load_activations(tmp_path / "acts0")
    a1 = lmgeom.load_activations(tmp_path / "acts1")
    np.testing.assert_array_equal(a0.states, a1.states)
    entries = [p for p in (tmp_path / "cache" / "activations").iterdir() if p.is_dir()]
    assert len(entries) == 1 and len(list(entries[0].glob("shard-*.safetensors"))) == 20
    assert not list(entries[0].glob(".*.tmp"))
    clean = lmgeom.extract(lmgeom.load_model(str(tiny_dir("llama"))), lmgeom.load_texts(corpus),
                           batch_size=2, cache=False)
    np.testing.assert_array_equal(a0.states, clean.states)


# ------------------------------------------------------------------ security
def test_no_pickle_is_ever_loaded(tiny_dir, tmp_path, monkeypatch):
    import pickle

    import torch

    def refuse(*a, **k):
        raise AssertionError("pickle loading attempted")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    real_load = torch.load

    def safe_only(*a, **k):
        assert k.get("weights_only", True) is True, "torch.load without weights_only=True"
        return real_load(*a, **k)

    monkeypatch.setattr(torch, "load", safe_only)
    model = lmgeom.load_model(str(tiny_dir("llama")))
    acts = lmgeom.extract(model, CORPUS[:4], cache_root=tmp_path)
    acts.save(tmp_path / "a")
    lmgeom.load_activations(tmp_path / "a")
    lmgeom.extract(model, CORPUS[:4], cache_root=tmp_path)  # cache read path


def test_trust_remote_code_is_off_unless_asked(tiny_dir, monkeypatch, caplog):
    import transformers

    seen = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*a, **k):
        seen.append(k.get("trust_remote_code"))
        return real(*a, **k)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    lmgeom.load_model(str(tiny_dir("llama")))
    assert seen == [False]
    with caplog.at_level("WARNING"):
        lmgeom.load_model(str(tiny_dir("llama")), trust_remote_code=True)
    assert seen[-1] is True and "trust_remote_code" in caplog.text


def test_report_escapes_user_text(tiny_dir, tmp_path):
    p = tmp_path / "evil.jsonl"
    evil = "<script>alert('x')</script>"
    rows = [{"text": f"{evil} {t} item {i} " + "ab" * i, "label": ["<b>a</b>", evil][i % 2]} for i, t in enumerate(CORPUS[:16])]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "r"
    assert main(["analyze", "--model", str(tiny_dir("llama")), "--texts", str(p), "--k", "4",
                 "--n-null", "5", "--ccr", "1", "--pooling", "mean", "--quiet", "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "<script>" not in html and "<b>a</b>" not in html


def test_no_network_for_local_work(tiny_dir, monkeypatch):
    def no_net(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_net)
    monkeypatch.setattr(socket, "create_connection", no_net)
    model = lmgeom.load_model(str(tiny_dir("llama")))
    lmgeom.extract(model, lmgeom.load_texts("builtin:news", limit=4), cache=False)
    lmgeom.load_model("smollm2-135m")
