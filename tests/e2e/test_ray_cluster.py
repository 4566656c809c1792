"""A real two-node Ray cluster on this machine, and what happens when it loses parts (issue 19).

The head node and a worker node are two ``ray start --block`` processes (own temp dir, own
ports, one CPU each, each with its own ``LMGEOM_CACHE``); the module's fixture stops both and
kills whatever is left of them by pid (never ``ray stop``, which would stop every Ray on the
machine). Drivers are real ``lmgeom`` processes joining with ``--ray-address``, except the
distributed extraction, driven from the test process. On it:

* a worker process is SIGKILLed in the middle of a sweep job: the job is retried, the table
  equals the local engine's, the manifest records the attempts;
* an extraction actor is SIGKILLed mid-batch: it is replaced, its batches are redone, the
  driver's cache is complete and verified;
* the worker node is stopped mid-sweep with ``--retries 0``: the job it held is reported
  failed with the reason, every other job finishes on the head node and none is lost; the
  rerun computes only the missing job.

A job is stopped at a known point with the ``hold`` test hook (:mod:`lmgeom._testing`): the
first process to reach it writes its pid and waits to be killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SRC = str(Path(__file__).parents[2] / "src")
RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
SWEEP = ["--steps", "2,3,4", "--n-null", "10", "--ccr", "1,5", "--max-length", "24",
         "--quiet", "--no-report"]


def _texts(n: int = 24, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "model", "token", "river", "bridge", "market",
             "prices", "the", "a", "of", "to", "in", "cat", "dog", "fish", "reads", "sees",
             "predicts", "quickly", "today"]  # as tests/test_ray.py: a suite known to work
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" {i}."
            for i in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports(head: bool) -> list[str]:
    names = ["--node-manager-port", "--object-manager-port", "--min-worker-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--runtime-env-agent-port", "--metrics-export-port"]
    if head:
        names += ["--ray-client-server-port", "--dashboard-port"]
    out = []
    for n in names:
        out += [n, str(_free_port())]
    return [*out, "--max-worker-port", "0"]


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


class Cluster:
    """Two Ray nodes on this machine (see the module docstring)."""

    def __init__(self, base: Path) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="lmg-ray-", dir="/tmp"))  # short socket paths
        self.base = base
        self.caches = {"head": base / "cache-head", "worker": base / "cache-worker"}
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "OMP_NUM_THREADS": "1", "LMGEOM_QUIET": "1",
                    # a held job waits for the test's kill however slow the machine is
                    "LMGEOM_TEST_HOLD_S": "900",
                    "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}

    def _start(self, name: str, args: list[str]) -> None:
        env = {**self.env, "LMGEOM_CACHE": str(self.caches[name]), "LMGEOM_TEST_NODE": name}
        log = open(self.base / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            [RAY, "start", "--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
             "--temp-dir", str(self.temp), "--object-store-memory", str(80 << 20),
             "--disable-usage-stats", *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def start(self) -> Cluster:
        self._start("head", ["--head", "--port", str(self.port), "--include-dashboard",
                             "false", *_ports(head=True)])
        self.wait_nodes(1)
        self._start("worker", ["--address", self.address, *_ports(head=False)])
        self.wait_nodes(2)
        return self

    def alive_nodes(self) -> int:
        r = subprocess.run([RAY, "status", "--address", self.address], env=self.env,
                           capture_output=True, text=True, timeout=60, check=False)
        active = r.stdout.split("Active:")[-1].split("Pending:")[0]
        return active.count("node_") if r.returncode == 0 else 0

    def wait_nodes(self, n: int, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"ray node {name} exited: "
                                       + (self.base / f"{name}.log").read_text()[-2000:])
            if self.alive_nodes() == n:
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes in {timeout:.0f} s")

    def stop_worker_node(self) -> None:
        """The worker node dies at once: its ``ray start``, raylet and workers, by pid."""
        _kill(_tree(self.procs["worker"].pid))

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        left = [p for p in psutil.process_iter(["cmdline"])
                if str(self.temp) in " ".join(p.info["cmdline"] or [])]
        for p in self.procs.values():
            left += _tree(p.pid)
        _kill(left)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("ray-cluster"))
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    from lmgeom.training.suite import train_suite
    from lmgeom.training.suite_config import SuiteConfig

    base = tmp_path_factory.mktemp("cluster-suite")
    corpus = base / "train.txt"
    corpus.write_text("\n".join(_texts(300, seed=1)) + "\n")
    root = base / "suite"
    train_suite(root, SuiteConfig.micro(texts=(str(corpus),), tokens=256), progress=False)
    texts = base / "texts.txt"
    texts.write_text("\n".join(_texts()) + "\n")
    return root, texts


@pytest.fixture(scope="module")
def local_table(suite, tmp_path_factory):
    """The same sweep on the local engine: the reference table."""
    root, texts = suite
    out = tmp_path_factory.mktemp("local-sweep") / "out"
    r = subprocess.run([sys.executable, "-m", "lmgeom.cli", "sweep", "--suite", str(root),
                        "--texts", str(texts), *SWEEP, "--out", str(out)],
                       env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    return _sorted(pd.read_parquet(out / "sweep.parquet"))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["model", "revision", "layer", "metric", "setting"]
    return df.sort_values(cols, kind="stable").reset_index(drop=True)


def _driver_env(cluster: Cluster, hold_dir: Path, cache: Path, **extra: str) -> dict[str, str]:
    return {**cluster.env, "LMGEOM_CACHE": str(cache), "LMGEOM_TEST_HOLD_DIR": str(hold_dir),
            "LMGEOM_TEST_HOLD": "job", **extra}


def _wait(check, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the driver ended before {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"never saw {what}")


def _held_pid(hold_dir: Path, point: str) -> tuple[int, str]:
    pid, node = (hold_dir / f"{point}.pid").read_text().split("\n")[:2]
    return int(pid), node


def _sweep(cluster: Cluster, suite, out: Path, *extra: str) -> list[str]:
    root, texts = suite
    return [sys.executable, "-m", "lmgeom.cli", "sweep", "--suite", str(root), "--texts",
            str(texts), *SWEEP, "--engine", "ray", "--ray-address", cluster.address,
            "--out", str(out), *extra]


def test_worker_killed_mid_job_is_retried(cluster, suite, local_table, tmp_path):
    hold = tmp_path / "hold"
    hold.mkdir()
    out = tmp_path / "out"
    proc = subprocess.Popen(_sweep(cluster, suite, out), env=_driver_env(
        cluster, hold, tmp_path / "driver-cache"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    # a job is held inside its worker, and another one has finished on the other node
    _wait(lambda: (hold / "job.pid").is_file()
          and list((out / ".work" / "jobs").glob("*.parquet")), proc, "a held job")
    pid, node = _held_pid(hold, "job")
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    assert "failed (attempt 1 of 3)" in err and "retrying" in err, err
    pd.testing.assert_frame_equal(_sorted(pd.read_parquet(out / "sweep.parquet")), local_table)
    man = json.loads((out / "manifest.json").read_text())
    jobs = man["jobs"]
    assert len(jobs) == 6 and all(j["ok"] for j in jobs) and man["failed_jobs"] == []
    retried = [j for j in jobs if j["attempts"] == 2]
    assert len(retried) == 1 and all(j["attempts"] == 1 for j in jobs if j not in retried)
    assert retried[0]["pid"] != pid  # the result came from a new worker process
    assert len({j["pid"] for j in jobs}) >= 2
    # each node extracted into its own LMGEOM_CACHE (the driver's is not forwarded)
    for name in ("head", "worker"):
        assert list((cluster.caches[name] / "activations").glob("*/shard-*")), name
    assert not (tmp_path / "driver-cache" / "activations").exists()
    assert node in ("head", "worker")


def test_extraction_actor_killed_mid_batch_is_replaced(cluster, tiny_dir, tmp_path,
                                                       monkeypatch):
    import ray

    from lmgeom import extract, load_model
    from lmgeom.engines.base import EngineConfig
    from lmgeom.engines.ray_extract import extract_distributed

    hold = tmp_path / "hold"
    hold.mkdir()
    for k, v in {"RAY_AUTH_MODE": "disabled", "LMGEOM_TEST_HOLD_DIR": str(hold),
                 "LMGEOM_TEST_HOLD": "extract-batch"}.items():
        monkeypatch.setenv(k, v)
    folder, texts, root = str(tiny_dir("llama")), _texts(40, seed=3), tmp_path / "acts"
    def killer() -> None:
        deadline = time.time() + 600  # guard only: the hold waits for this kill
        while time.time() < deadline and not (hold / "extract-batch.pid").is_file():
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(_held_pid(hold, "extract-batch")[0], signal.SIGKILL)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        got = extract_distributed(
            folder, texts, engine=EngineConfig(engine="ray", address=cluster.address, workers=2,
                                               retries=2),
            load_kwargs={"device": "cpu"}, pooling="mean", batch_size=8, max_length=24,
            cache_root=root, progress=False)
    finally:
        t.join(timeout=5)
        ray.shutdown()
    assert (hold / "extract-batch.pid").is_file()
    tm = got.timings
    assert tm["workers"] == 2 and tm["batches_computed"] == 5
    assert tm["workers_replaced"] == 1 and 1 <= tm["batches_lost"] <= 2  # two in flight
    # the driver's cache is complete and verified: a local run computes nothing
    model = load_model(folder, device="cpu")
    again = extract(model, texts, pooling="mean", batch_size=8, max_length=24, cache_root=root)
    assert again.timings["batches_computed"] == 0 and again.timings["batches_cached"] == 5
    ref = extract(model, texts, pooling="mean", batch_size=8, max_length=24, cache=False)
    np.testing.assert_array_equal(again.states, got.states)
    np.testing.assert_allclose(got.states, ref.states, rtol=1e-5, atol=1e-6)


def test_worker_node_stopped_mid_sweep(cluster, suite, local_table, tmp_path):
    """Runs last: it leaves the cluster with the head node only."""
    hold = tmp_path / "hold"
    hold.mkdir()
    out = tmp_path / "out"
    env = _driver_env(cluster, hold, tmp_path / "driver-cache", LMGEOM_TEST_HOLD_NODE="worker")
    proc = subprocess.Popen(_sweep(cluster, suite, out, "--retries", "0"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait(lambda: (hold / "job.pid").is_file()
          and list((out / ".work" / "jobs").glob("*.parquet")), proc, "a job held on the worker")
    assert _held_pid(hold, "job")[1] == "worker"
    finished = {p.name for p in (out / ".work" / "jobs").glob("*.parquet")}
    cluster.stop_worker_node()
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 1, err  # a job failed (the others' results are kept): exit 1
    assert "1 of 6 jobs failed" in err, err
    man = json.loads((out / "manifest.json").read_text())
    assert len(man["jobs"]) == 6
    failed = man["failed_jobs"]
    assert len(failed) == 1, failed
    reason = failed[0]["error"]
    assert any(w in reason for w in ("WorkerCrashedError", "NodeDiedError", "died",
                                     "ActorUnavailable", "Raylet")), reason
    df = pd.read_parquet(out / "sweep.parquet")
    bad = df[df.metric == "job_failed"]
    assert len(bad) == 1 and f"{bad.model.iloc[0]}@{bad.revision.iloc[0]}" == failed[0]["name"]
    # no finished job is lost: those done before the node left are in the table, unchanged
    now = {p.name for p in (out / ".work" / "jobs").glob("*.parquet")}
    assert finished <= now and len(now) == 5
    deadline = time.time() + 300  # guard only: Ray marks the node dead once its health checks fail
    while cluster.alive_nodes() != 1 and time.time() < deadline:
        time.sleep(1)
    assert cluster.alive_nodes() == 1
    # the rerun (head node only) computes just the failed job
    env.pop("LMGEOM_TEST_HOLD_NODE")
    r = subprocess.run(_sweep(cluster, suite, out, "--retries", "0"), env=env,
                       capture_output=True, text=True, timeout=400, check=False)
    assert r.returncode == 0, r.stderr
    man = json.loads((out / "manifest.json").read_text())
    assert man["failed_jobs"] == []
    # (a job's "name" in the manifest is overwritten by the model's own name: model@revision)
    fresh = [f"{j['model']}@{j['revision']}" for j in man["jobs"] if not j.get("reused")]
    assert fresh == [failed[0]["name"]]
    pd.testing.assert_frame_equal(_sorted(pd.read_parquet(out / "sweep.parquet")), local_table)
