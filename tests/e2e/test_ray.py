"""The ``ray`` engine on a real local Ray instance (``ray.init(num_cpus=2)``, auth disabled).

Same jobs, same numbers: a sweep over two tiny models x two checkpoints gives the identical
table on both engines; a flaky job is retried and then succeeds, a job that always raises is
retried a bounded number of times and reported while the others' results are kept; a
distributed extraction fills the activation cache a local extraction then reads.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pandas as pd
import pytest
import ray  # the ray extra is installed by `make test`; a missing Ray must fail, not skip


def _texts(n: int = 24, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "model", "token", "river", "bridge", "market",
             "prices", "the", "a", "of", "to", "in", "cat", "dog", "fish", "reads", "sees",
             "predicts", "quickly", "today"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" {i}."
            for i in range(n)]



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    flaky = tmp_path_factory.mktemp("flaky")
    old = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "LMGEOM_TEST_FLAKY_DIR")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["LMGEOM_TEST_FLAKY_DIR"] = str(flaky)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    yield flaky
    ray.shutdown()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    from lmgeom.training.suite import train_suite
    from lmgeom.training.suite_config import SuiteConfig

    base = tmp_path_factory.mktemp("ray-suite")
    corpus = base / "train.txt"
    corpus.write_text("\n".join(_texts(300, seed=1)) + "\n")
    root = base / "suite"
    train_suite(root, SuiteConfig.micro(texts=(str(corpus),), tokens=256), progress=False)
    texts_file = base / "texts.txt"
    texts_file.write_text("\n".join(_texts()) + "\n")
    return root, texts_file


ARGS = ["--steps", "2,4", "--n-null", "10", "--ccr", "1,5", "--max-length", "24", "--quiet"]


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["model", "revision", "layer", "metric", "setting"]
    return df.sort_values(cols, kind="stable").reset_index(drop=True)


def test_sweep_ray_equals_local(cluster, suite, tmp_path):
    from lmgeom.cli import main

    root, texts = suite
    common = ["sweep", "--suite", str(root), "--texts", str(texts), *ARGS, "--no-report"]
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 0
    loc = _sorted(pd.read_parquet(tmp_path / "local" / "sweep.parquet"))
    ray_df = _sorted(pd.read_parquet(tmp_path / "ray" / "sweep.parquet"))
    # two widths x two checkpoints, every layer x CCR level
    z = ray_df[ray_df.metric == "pga_z"]
    assert set(zip(z.model, z.revision)) == {(w, s) for w in ("w16", "w32") for s in ("step2", "step4")}
    assert len(z) == 4 * 4 * 2
    pd.testing.assert_frame_equal(loc, ray_df)  # same numbers, bit for bit
    man = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert man["engine"]["engine"] == "ray"
    assert {j["engine"] for j in man["jobs"]} == {"ray"} and all(j["ok"] for j in man["jobs"])
    assert len({j["pid"] for j in man["jobs"] if "pid" in j}) >= 1


def test_retry_then_report_keeps_other_results(cluster, suite, tmp_path):
    from lmgeom.engines.base import EngineConfig
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import jobs_from_suite, run_sweep
    from lmgeom.texts import as_textset

    root, _ = suite
    good = jobs_from_suite(root, widths=[16, 32], steps=[4])
    from dataclasses import replace

    flaky = replace(good[0], model="w16-flaky")
    bad = replace(good[1], model="always-fails")
    cfg = LayerSweepConfig(n_null=10, ccr=(1,), max_length=24)
    res = run_sweep([bad, flaky, *good], as_textset(_texts()), cfg, out_dir=tmp_path / "out",
                    engine=EngineConfig(engine="ray", retries=2))
    ok = {r.job.name: r.ok for r in res.results}
    assert ok == {"always-fails@step4": False, "w16-flaky@step4": True, "w16@step4": True,
                  "w32@step4": True}
    att = {r.job.name: r.info["attempts"] for r in res.results}
    assert att["always-fails@step4"] == 3  # 1 + 2 retries, then reported
    assert att["w16-flaky@step4"] == 2     # failed once, the retry succeeded
    assert att["w16@step4"] == 1
    assert "injected failure" in res.results[0].error
    failed = res.frame[res.frame.metric == "job_failed"]
    assert list(zip(failed.model, failed.value)) == [("always-fails", 1.0)]
    assert res.entries["failed_jobs"][0]["attempts"] == 3
    # the retried job's numbers are those of the same checkpoint run cleanly
    zf = res.frame[(res.frame.model == "w16-flaky") & (res.frame.metric == "pga_z")]
    zg = res.frame[(res.frame.model == "w16") & (res.frame.metric == "pga_z")]
    np.testing.assert_array_equal(zf.sort_values("layer").value.to_numpy(),
                                  zg.sort_values("layer").value.to_numpy())
    # a rerun recomputes only the failed job (finished jobs come from the cache)
    res2 = run_sweep([bad, *good], as_textset(_texts()), cfg, out_dir=tmp_path / "out",
                     engine=EngineConfig(engine="ray", retries=0))
    assert [r.info.get("reused", False) for r in res2.results] == [False, True, True]
    assert res2.results[0].info["attempts"] == 1


def test_local_engine_retries_the_same_way(cluster, suite, tmp_path):
    from dataclasses import replace

    from lmgeom.engines.base import EngineConfig
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import jobs_from_suite, run_sweep
    from lmgeom.texts import as_textset

    root, _ = suite
    good = jobs_from_suite(root, widths=[16], steps=[4])
    jobs = [replace(good[0], model="local-flaky"), replace(good[0], model="always-fails")]
    res = run_sweep(jobs, as_textset(_texts()), LayerSweepConfig(n_null=10, ccr=(1,), max_length=24),
                    out_dir=tmp_path / "o", engine=EngineConfig(engine="local", retries=1))
    assert [(r.ok, r.info["attempts"]) for r in res.results] == [(True, 2), (False, 2)]


def test_extract_ray_fills_the_cache_local_reads(cluster, tiny_dir, tmp_path, monkeypatch):
    from lmgeom import extract, load_model
    from lmgeom.engines.base import EngineConfig
    from lmgeom.engines.ray_extract import extract_distributed

    folder = str(tiny_dir("llama"))
    texts = _texts(40, seed=3)
    root = tmp_path / "acts"
    got = extract_distributed(folder, texts, engine=EngineConfig(engine="ray", workers=2),
                              load_kwargs={"device": "cpu"}, pooling="mean", batch_size=8,
                              max_length=24, cache_root=root, progress=False)
    assert got.timings["workers"] == 2 and got.timings["batches_computed"] == 5
    model = load_model(folder, device="cpu")
    ref = extract(model, texts, pooling="mean", batch_size=8, max_length=24, cache=False)
    np.testing.assert_allclose(got.states, ref.states, rtol=1e-5, atol=1e-6)
    assert got.key == ref.key and got.layers == ref.layers
    again = extract(model, texts, pooling="mean", batch_size=8, max_length=24, cache_root=root)
    assert again.timings["batches_computed"] == 0 and again.timings["batches_cached"] == 5
    np.testing.assert_array_equal(again.states, got.states)
    # a second distributed run reuses the cache too (nothing to compute, no extra workers)
    more = extract_distributed(folder, texts, engine=EngineConfig(engine="ray"),
                               load_kwargs={"device": "cpu"}, pooling="mean", batch_size=8,
                               max_length=24, cache_root=root, progress=False)
    assert more.timings["batches_computed"] == 0


def test_cli_extract_and_analyze_on_ray(cluster, tiny_dir, tmp_path, capsys):
    from lmgeom import load_activations
    from lmgeom.cli import main

    tf = tmp_path / "t.txt"
    tf.write_text("\n".join(_texts(30, seed=5)) + "\n")
    a, b = str(tiny_dir("llama")), str(tiny_dir("gpt2"))
    assert main(["extract", "--model", a, "--texts", str(tf), "--max-length", "24",
                 "--batch-size", "8", "--engine", "ray", "--workers", "2", "--no-cache",
                 "--out", str(tmp_path / "acts"), "--quiet"]) == 0
    assert "on 2 Ray workers" in capsys.readouterr().out
    assert load_activations(tmp_path / "acts").states.shape[1] == 30
    common = ["analyze", "--model", a, "--model", b, "--texts", str(tf), "--k", "4",
              "--n-null", "10", "--ccr", "1", "--max-length", "24", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "an-local")]) == 0
    assert main([*common, "--out", str(tmp_path / "an-ray"), "--engine", "ray"]) == 0
    loc = _sorted(pd.read_parquet(tmp_path / "an-local" / "layers.parquet"))
    rdf = _sorted(pd.read_parquet(tmp_path / "an-ray" / "layers.parquet"))
    assert set(rdf.model) == {a, b}
    pd.testing.assert_frame_equal(loc.drop(columns="value"), rdf.drop(columns="value"))
    np.testing.assert_allclose(rdf.value.to_numpy(), loc.value.to_numpy(), rtol=1e-6, atol=1e-9)


def test_engine_errors_are_one_line(cluster, suite, capsys, tmp_path):
    from lmgeom.cli import main

    root, texts = suite
    base = ["sweep", "--suite", str(root), "--texts", str(texts), *ARGS, "--out", str(tmp_path / "o")]
    assert main([*base, "--gpus-per-job", "1"]) == 2  # local engine + a Ray option
    assert "need --engine ray" in capsys.readouterr().err
    assert main([*base, "--engine", "ray", "--gpus-per-job", "1"]) == 2  # no GPU in the cluster
    assert "GPUs" in capsys.readouterr().err
    assert main([*base, "--engine", "ray", "--retries", "-1"]) == 2
