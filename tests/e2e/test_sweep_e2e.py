"""Regime classification (planted profiles) and the sweep over a micro suite.

End-to-end half (the unit half is tests/unit/test_sweep.py).
"""

from __future__ import annotations

import json
import logging
import shutil

import pandas as pd
import pytest
from support.sweep import SWEEP_ARGS, micro, swept  # noqa: F401 (fixtures)


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

