"""Hostile sample sizes (issue 26): no statistically empty number without a warning.

Every case either refuses with a typed error that names the value (and the fix), or computes
the number, raises a :class:`~lmgeom.errors.LowSampleWarning` and sets the flag in the result
and in the tidy table's ``flag`` column. Plus: ``analyze`` skips the optional probes when the
classes are too small, identical last tokens are named as the cause, and a sweep with a failed
job exits 1 without retrying a user error. Small random arrays and the tiny models of
``conftest.py`` only.

End-to-end half (the unit half is tests/unit/test_hostile_stats.py).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from support.hostile_stats import data, make_texts, tiny  # noqa: F401 (fixtures)

from lmgeom import metrics as M
from lmgeom.errors import LowSampleWarning


@pytest.mark.parametrize("n_null", [2, 3, 5, 10, 19])
def test_few_null_draws_warn_and_flag(n_null):
    X, V = data()
    with pytest.warns(LowSampleWarning, match=rf"n_null={n_null} null draws \(fewer than 20\)"):
        r = M.subspace_pga(X, V, n_null=n_null)
    assert r.flags == ("low_null",) and r.flag == "low_null" and r.low_sample
    assert len(r.warnings) == 1 and "use n_null >= 20" in r.warnings[0]
    assert r.to_dict()["flags"] == "low_null" and "warnings" not in r.to_dict()


def test_analyze_with_few_texts_skips_probes_and_keeps_the_run(tiny, tmp_path, capsys,
                                                                 monkeypatch):
    """``analyze --n 16``: the probes need 5 texts per class; the run goes on without them.
    k is decided before any work: ``--k 8`` cannot fit 16 texts with CCR-10 (rank <= 5), so it
    is refused at once; without ``--k`` the run takes k = 16 - 10 - 2 = 4 and says so."""
    import lmgeom.experiments.analyze as A
    from lmgeom.cli import main

    p = tmp_path / "labeled.jsonl"
    labels = ["code", "math", "news", "science", "wiki"]
    p.write_text("\n".join(json.dumps({"text": t, "label": labels[i % 5]})
                           for i, t in enumerate(make_texts(40))) + "\n")
    out = tmp_path / "run"
    argv = ["analyze", "--model", tiny, "--texts", str(p), "--n", "16", "--n-null", "20",
            "--ccr", "0,1,10", "--layers", "0,1,final", "--pooling", "mean",
            "--max-length", "24", "--no-logit-lens", "--quiet", "--out", str(out)]
    loads = []
    real = A.analyze_model
    monkeypatch.setattr(A, "analyze_model", lambda *a, **kw: loads.append(a) or real(*a, **kw))
    assert main([*argv, "--k", "8"]) == 2
    err = capsys.readouterr().err
    assert "--k 8 does not fit 16 texts" in err and "use --k 4 or less" in err
    assert "--n 20 or more" in err
    assert loads == []  # refused before any model was loaded or run
    with pytest.warns(LowSampleWarning) as rec:
        rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    msgs = [str(w.message) for w in rec if issubclass(w.category, LowSampleWarning)]
    skip = [m for m in msgs if "linear probes skipped" in m]
    assert len(skip) == 1 and "--n 25 or more" in skip[0] and "folds=5" in skip[0]
    assert any("k = 4 instead of 100" in m for m in msgs)
    df = pd.read_parquet(out / "layers.parquet")
    assert not df.metric.str.startswith("probe").any()
    z = df[df.metric == "pga_z"]
    assert set(z.layer) == {"0", "1", "final"} and np.isfinite(z.value).all()
    assert (z.flag == "").all()  # k fits every CCR level: no k_rank flag anywhere
    assert "LOW SAMPLE" not in cap.out and "(k=4," in cap.out
    man = json.loads((out / "manifest.json").read_text())
    assert "linear probes skipped" in man["models"][0]["probes_skipped"]


def test_cli_few_null_draws_warned_and_flagged(tiny, tmp_path):
    from lmgeom.cli import main

    p = tmp_path / "t.txt"
    p.write_text("\n".join(make_texts(24)) + "\n")
    with pytest.warns(LowSampleWarning, match=r"layers 1, final: n_null=5 null draws"):
        rc = main(["analyze", "--model", tiny, "--texts", str(p), "--k", "4", "--n-null", "5",
                   "--ccr", "1", "--layers", "1,final", "--max-length", "24", "--no-logit-lens",
                   "--quiet", "--out", str(tmp_path / "run")])
    assert rc == 0
    df = pd.read_parquet(tmp_path / "run" / "layers.parquet")
    pga = df[df.metric.isin(["pga_z", "null_std", "p_value"])]
    assert len(pga) == 6 and (pga.flag == "low_null").all()
    assert (df[df.metric == "pc1_share"].flag == "").all()  # not about the rows


def test_ray_engine_does_not_retry_a_user_error(tiny, tmp_path, monkeypatch):
    """On Ray too: the job whose model path does not exist is attempted once (ModelError),
    the other job's rows are kept."""
    ray = pytest.importorskip("ray")
    from lmgeom.engines.base import EngineConfig
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import JobOptions, JobSpec, run_sweep
    from lmgeom.texts import as_textset

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    try:
        jobs = [JobSpec(model="missing", spec=str(tmp_path / "no-such-model")),
                JobSpec(model="tiny", spec=tiny)]
        res = run_sweep(jobs, as_textset(make_texts(24)),
                        LayerSweepConfig(n_null=20, ccr=(1,), max_length=24, layers="1",
                                         logit_lens=False),
                        out_dir=tmp_path / "o", options=JobOptions(k=4, cache=False),
                        engine=EngineConfig(engine="ray", retries=2))
    finally:
        if started:
            ray.shutdown()
    att = {r.job.name: (r.ok, r.info["attempts"]) for r in res.results}
    assert att == {"missing": (False, 1), "tiny": (True, 1)}
    assert "ModelError" in res.results[0].error and res.entries["failed_jobs"][0]["attempts"] == 1
    assert (res.frame[res.frame.metric == "pga_z"].model == "tiny").sum() == 1

