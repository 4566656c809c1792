"""Regime classification (planted profiles) and the sweep over a micro suite.

The layer sweeps of trained micro suites: every test here trains or sweeps one (the whole
module is end to end)."""

from __future__ import annotations

import json
import logging
import math
import pickle
import shutil

import numpy as np
import pandas as pd
import pytest
from support.sweep import SWEEP_ARGS, make_texts, micro, swept  # noqa: F401 (fixtures)  # noqa: F401 (fixtures)

from lmgeom.errors import DataError
from lmgeom.experiments.regime import regime_rows
from lmgeom.metrics.regime import classify_regime, regimes_from_table


def test_sweep_rows_per_width_and_step(micro, swept):
    from lmgeom.results.table import COLUMNS

    _, manifest, _ = micro
    out, df, man = swept
    assert tuple(df.columns) == COLUMNS
    steps = manifest["checkpoint_steps"]
    assert steps == [0, 1, 2, 3, 4]
    want = {(f"w{w}", f"step{s}") for w in (16, 32) for s in steps}
    z = df[df.metric == "pga_z"]
    assert set(zip(z.model, z.revision)) == want
    # every run: layers 0, 1, 2, final x CCR-1 and CCR-5, exactly once
    counts = z.groupby(["model", "revision", "setting"]).layer.apply(lambda s: sorted(s))
    assert all(v == ["0", "1", "2", "final"] for v in counts)
    assert set(z.setting) == {"ccr=1", "ccr=5"}
    for metric in ("rankme", "pc1_share", "logit_lens_top1"):
        assert set(zip(*[df[df.metric == metric][c] for c in ("model", "revision")])) == want
    ml = df[df.layer_index == -1]
    for metric in ("regime_detour", "collapse_min_z", "collapse_restored_ccr", "val_loss", "readout_k",
                   "zone_pga_z_min"):
        assert set(zip(ml[ml.metric == metric].model, ml[ml.metric == metric].revision)) == want, metric
    assert set(ml[ml.metric == "regime_detour"].value) <= {0.0, 1.0}
    k = ml[ml.metric == "readout_k"].groupby("model").value.first().to_dict()
    assert k == {"w16": 4.0, "w32": 8.0}  # min(100, d // 4)
    vl = ml[ml.metric == "val_loss"].set_index(["model", "revision"]).value
    for w, v in manifest["widths"].items():
        for rev, c in v["checkpoints"].items():
            assert vl[(f"w{w}", rev)] == pytest.approx(c["val_loss"])
    assert set(man["regime_labels"].values()) <= {"direct", "detour"}
    assert len(man["jobs"]) == 10 and all(j["ok"] for j in man["jobs"])
    assert man["failed_jobs"] == [] and man["identical_weights"] == []
    assert len({j["weights_sha256"] for j in man["jobs"]}) == 10
    for stem in ("profiles_by_step", "trajectory"):
        assert (out / "plots" / f"{stem}.png").is_file() and (out / "plots" / f"{stem}.svg").is_file()
    html = (out / "report.html").read_text()
    assert "Training trajectories" in html and "Regimes (direct / detour)" in html
    # the per-layer sections show each width's last checkpoint
    assert "w16 @ step4" in html and "w16 @ step2" not in html.split("Training trajectories")[0]


def test_sweep_rerun_reuses_jobs(micro, swept, capsys):
    from lmgeom.cli import main

    root, _, texts_file = micro
    out, df, _ = swept
    assert main(["sweep", "--suite", str(root), "--texts", str(texts_file), "--out", str(out),
                 *SWEEP_ARGS, "--no-report"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert all(j.get("reused") for j in man["jobs"])
    again = pd.read_parquet(out / "sweep.parquet")
    pd.testing.assert_frame_equal(again, df)


def test_identical_weights_warned_in_sweep(micro, tmp_path, caplog, capsys):
    from lmgeom.cli import main
    from lmgeom.report.figures_sweep import report_sections
    from lmgeom.report.html import write_report

    root, _, texts_file = micro
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(root / "16" / "step4", a)
    shutil.copytree(root / "16" / "step4", b)
    with caplog.at_level(logging.WARNING, logger="lmgeom.experiments.sweep"):
        rc = main(["sweep", "--model", str(a), "--model", str(b), "--texts", str(texts_file),
                   "--out", str(tmp_path / "out"), "--ccr", "1", "--n-null", "10",
                   "--max-length", "24", "--quiet", "--no-report"])
    assert rc == 0
    assert any("IDENTICAL WEIGHTS" in r.message for r in caplog.records)
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["identical_weights"] == [[str(a), str(b)]]
    assert "WARNING: identical weights" in capsys.readouterr().out
    # the report states it (model-level rows only: the per-layer plots are tested above)
    df = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    df = df[df.layer_index < 0].reset_index(drop=True)
    extra = report_sections(df, man, n_jobs=2, plots_dir=tmp_path / "rep" / "plots")
    html = write_report(tmp_path / "rep", df, man, extra_figures=extra).read_text()
    assert f"WARNING: identical weights in {a}, {b}" in html


def prof(*z):
    """A profile 0..L, final from a list of z values (last = final)."""
    labels = [str(i) for i in range(len(z) - 1)] + ["final"]
    return dict(zip(labels, map(float, z)))


def test_direct_profile():
    r = classify_regime(prof(1, 4, 6, 5, 3, 2, 4))
    assert r.label == "direct" and not r.detour and r.zones == ()
    assert (r.peak_layer, r.peak_z) == ("2", 6.0)
    assert (r.min_layer, r.min_z) == ("5", 2.0)  # lowest after the peak, final excluded
    assert r.final_z == 4.0 and r.restored_ccr is None


def test_detour_profile_zone_minimum_and_restoration():
    z1 = prof(1, 3, 5, 2, -1, -3, -2, 4)
    z5 = prof(2, 4, 6, 5, 1, 0.5, 2, 5)
    z10 = prof(2, 4, 6, 5, 3, 2, 2, 5)
    r = classify_regime(z1, other_ccr={5: z5, 10: z10})
    assert r.label == "detour" and r.zones == (("4", "5", "6"),)
    assert (r.min_layer, r.min_z) == ("5", -3.0)
    assert r.restored_ccr == 5 and r.restoration == {5: (3, 3), 10: (3, 3)}
    # CCR-5 fails at one zone layer -> the collapse disappears only at CCR-10
    r = classify_regime(z1, other_ccr={5: prof(2, 4, 6, 5, 1, -0.2, 2, 5), 10: z10})
    assert r.restored_ccr == 10 and r.restoration[5] == (2, 3)
    # nothing restores it
    assert classify_regime(z1, other_ccr={5: z1}).restored_ccr is None
    assert classify_regime(z1).restored_ccr is None


def test_zone_rule_edges():
    # one strongly negative layer is a zone, one weak dip is not
    assert classify_regime(prof(1, 5, -2.5, 3, 4)).zones == (("2",),)
    weak = classify_regime(prof(1, 5, -0.5, 3, 4))
    assert weak.label == "direct" and weak.min_z == -0.5
    # negatives before the peak and at the final layer are no collapse
    assert classify_regime(prof(-3, -2, 5, 4, -6)).label == "direct"
    # two zones: the minimum is the lower one; restoration must hold in both
    r = classify_regime(prof(6, -1, -1, 2, -4, 1, 3), other_ccr={5: prof(6, 1, 1, 2, -1, 1, 3)})
    assert r.zones == (("1", "2"), ("4",)) and r.min_z == -4 and r.restored_ccr is None
    # order of the mapping does not matter; a list means 0..L with the last as final
    z = prof(1, 3, 5, 2, -1, -3, -2, 4)
    shuffled = dict(reversed(list(z.items())))
    assert classify_regime(shuffled) == classify_regime(z) == classify_regime(list(z.values()))


def test_regime_agrees_with_report_reading():
    """Random profiles: detour exactly when the report's reading finds a collapse zone."""
    from lmgeom.metrics.regime import pga_findings
    from lmgeom.results import table

    rng = np.random.default_rng(0)
    for _ in range(40):
        z = rng.normal(1.0, 2.5, size=rng.integers(4, 12))
        p = {str(i): v for i, v in enumerate(z[:-1])} | {"final": z[-1]}
        df = table.frame(table.row(model="m", layer=k, layer_index=i, metric="pga_z",
                                   setting="ccr=1", value=v) for i, (k, v) in enumerate(p.items()))
        f = pga_findings(df)[0]
        r = classify_regime(p)
        assert r.detour == bool(f.zones)
        assert r.zone_layers == tuple(lab for zz in f.zones for lab in zz.layers)


def test_regime_errors_and_rows():
    with pytest.raises(DataError):
        classify_regime({"0": 1.0, "final": float("nan")})
    regs = {("w64", "step8"): classify_regime(prof(1, 3, -1, -2, 3), other_ccr={5: prof(1, 2, 1, 1, 2)})}
    rows = {r["metric"]: r["value"] for r in regime_rows(regs)}
    assert rows == {"regime_detour": 1.0, "collapse_min_z": -2.0, "collapse_restored_ccr": 5.0,
                    "collapse_zone_layers": 2.0}
    direct = regime_rows({("a", ""): classify_regime(prof(1, 2, 3))})
    assert math.isnan(next(r for r in direct if r["metric"] == "collapse_restored_ccr")["value"])


def test_regimes_from_table_and_tracked_layers():
    from lmgeom.experiments.sweep import tracked_layers, trajectory_rows
    from lmgeom.results import table

    rows = []
    for rev, z1 in (("step0", prof(1, 2, 3, 2, 2, 3)), ("step8", prof(1, 3, 1, -1, -2, 3))):
        for s, z in (("ccr=1", z1), ("ccr=5", {k: abs(v) + 0.1 for k, v in z1.items()})):
            for i, (k, v) in enumerate(z.items()):
                rows.append(table.row(model="w64", revision=rev, layer=k, layer_index=i,
                                      metric="pga_z", setting=s, value=v))
                rows.append(table.row(model="w64", revision=rev, layer=k, layer_index=i,
                                      metric="rankme", value=10.0 + i))
    rows.append(table.row(model="w64", revision="step8", layer="3.attn_out", layer_index=3,
                          metric="pga_z", setting="ccr=1", value=-50.0))  # sub-layer: ignored
    df = table.frame(rows)
    regs = regimes_from_table(df)
    assert regs[("w64", "step0")].label == "direct"
    assert regs[("w64", "step8")].zones == (("3", "4"),) and regs[("w64", "step8")].restored_ccr == 5
    tracked = tracked_layers(df, regs)
    assert tracked == {"w64": ["3", "4"]}  # the last checkpoint's zone
    traj = table.frame(trajectory_rows(df, tracked))
    zmin = traj[(traj.metric == "zone_pga_z_min") & (traj.setting == "ccr=1")].set_index("revision")["value"]
    assert zmin.to_dict() == {"step0": 2.0, "step8": -2.0}
    # without a detour at the last step: the late non-final layers (index > (L+1)/2)
    regs[("w64", "step8")] = classify_regime(prof(1, 2, 3, 2, 2, 3))
    assert tracked_layers(df, regs) == {"w64": ["3", "4"]}


def test_resolve_k_and_step_of():
    from lmgeom.experiments.analyze import resolve_k
    from lmgeom.results.table import step_of

    assert [resolve_k("auto", d) for d in (16, 64, 128, 256, 512, 2048)] == [4, 16, 32, 64, 100, 100]
    assert resolve_k(8, 512) == 8 and resolve_k("12", 64) == 12
    assert step_of("step512") == 512 and step_of("step_3") == 3 and step_of("main") is None


def test_sweep_job_is_picklable_and_matches(micro, swept):
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import JobOptions, jobs_from_suite, sweep_job
    from lmgeom.texts import load_texts

    root, _, texts_file = micro
    _, df, _ = swept
    job = next(iter(jobs_from_suite(root, widths=[32], steps=[4])))
    texts = load_texts(str(texts_file), limit=256, seed=0)
    cfg = LayerSweepConfig(n_null=10, ccr=(1, 5), max_length=24, seed=0)
    args = pickle.loads(pickle.dumps((job, texts, cfg, JobOptions())))
    res = sweep_job(*args[:3], options=args[3])
    assert res.ok and pickle.loads(pickle.dumps(res)).job == job
    got = res.frame[res.frame.metric == "pga_z"].set_index(["layer", "setting"]).value.sort_index()
    ref = df[(df.model == "w32") & (df.revision == "step4") & (df.metric == "pga_z")]
    ref = ref.set_index(["layer", "setting"]).value.sort_index()
    pd.testing.assert_series_equal(got, ref, check_names=False)


def test_failed_job_is_recorded_not_fatal(micro, tmp_path):
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import JobSpec, jobs_from_suite, run_sweep
    from lmgeom.texts import as_textset

    root, _, _ = micro
    good = jobs_from_suite(root, widths=[16], steps=[4])
    bad = JobSpec(model="broken", spec=str(tmp_path / "missing-model"), revision="step1")
    toobig = JobSpec(model="w16k", spec=good[0].spec, revision="step4")
    res = run_sweep([bad, *good], as_textset(make_texts()), LayerSweepConfig(n_null=10, ccr=(1,), max_length=24),
                    out_dir=tmp_path / "out")
    assert [r.ok for r in res.results] == [False, True]
    assert "ModelError" in res.results[0].error
    failed = res.frame[res.frame.metric == "job_failed"]
    assert list(zip(failed.model, failed.revision, failed.value)) == [("broken", "step1", 1.0)]
    assert res.entries["failed_jobs"][0]["name"] == "broken@step1"
    assert (res.frame[res.frame.model == "w16"].metric == "pga_z").sum() == 4
    # k >= d fails inside the job (ConfigError), also recorded
    from lmgeom.experiments.sweep import JobOptions

    r2 = run_sweep([toobig], as_textset(make_texts()), LayerSweepConfig(n_null=10, ccr=(1,), max_length=24),
                   out_dir=tmp_path / "out2", options=JobOptions(k=16))
    assert not r2.results[0].ok and "ConfigError" in r2.results[0].error


def test_cli_argument_errors(micro, capsys):
    from lmgeom.cli import main

    root, _, _ = micro
    assert main(["sweep"]) == 2
    assert main(["sweep", "--suite", str(root), "--model", "x"]) == 2
    assert main(["sweep", "--suite", str(root), "--revision", "step1"]) == 2
    assert main(["sweep", "--suite", str(root), "--widths", "999"]) == 2
    assert "error" in capsys.readouterr().err


def test_jobs_from_models_hub_revisions_and_folders(micro):
    from lmgeom.errors import ConfigError
    from lmgeom.experiments.sweep import jobs_from_models

    jobs = jobs_from_models(["EleutherAI/pythia-70m", "EleutherAI/pythia-160m"],
                            ["step1000", "step143000"])
    assert [(j.model, j.revision, j.hub_revision, j.step) for j in jobs] == [
        ("EleutherAI/pythia-70m", "step1000", "step1000", 1000),
        ("EleutherAI/pythia-70m", "step143000", "step143000", 143000),
        ("EleutherAI/pythia-160m", "step1000", "step1000", 1000),
        ("EleutherAI/pythia-160m", "step143000", "step143000", 143000),
    ]
    root, _, _ = micro
    folder = str(root / "16" / "step4")
    assert [(j.spec, j.revision, j.hub_revision) for j in jobs_from_models([folder])] == [(folder, "", None)]
    with pytest.raises(ConfigError, match="local folder"):
        jobs_from_models([folder], ["step1"])

