"""The geometry trajectory of lmgeom's own training (issue 29 part 4): ``lmgeom suite train`` and
``lmgeom train`` record Subspace PGA z, dispersion, PC1 share and RankMe by step through
:mod:`lmgeom.monitor`, training is bit-identical with and without it, and an interrupted run
resumes to the same table."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from support.suite import (
    corpus,  # noqa: F401 (a fixture)
    micro_config,  # noqa: F401 (a fixture)
    micro_suite,  # noqa: F401 (a fixture)
    write_corpus,
)

from lmgeom.cli import main
from lmgeom.errors import ConfigError
from lmgeom.training.geometry import GEOMETRY_FILE, read_geometry
from lmgeom.training.suite import train_suite
from lmgeom.training.suite_config import SuiteConfig, checkpoint_steps
from lmgeom.training.suite_manifest import suite_checkpoints

METRICS = {"pga_z", "dispersion", "pc1_share", "rankme"}


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> SuiteConfig:
    corpus = write_corpus(tmp_path_factory.mktemp("corpus") / "train.txt")
    return SuiteConfig.micro(texts=(str(corpus),), widths=(16,))


def _weights(root):
    return {(c["width"], c["step"]): c["weights_sha256"] for c in suite_checkpoints(root)}


def _z(df: pd.DataFrame) -> pd.Series:
    z = df[df.metric == "pga_z"].set_index(["model", "revision", "layer"])["value"]
    return z.sort_index()


def test_suite_records_geometry_without_changing_training(tmp_path, config):
    with_geo = train_suite(tmp_path / "geo", config, progress=False)
    plain = train_suite(tmp_path / "plain", config, progress=False, geometry=False)
    # the monitor restores modes and random generators: the same weights bit for bit
    assert _weights(tmp_path / "geo") == _weights(tmp_path / "plain")
    assert with_geo["widths"]["16"]["status"] == plain["widths"]["16"]["status"] == "complete"
    assert not (tmp_path / "plain" / GEOMETRY_FILE).exists()

    df = pd.read_parquet(tmp_path / "geo" / GEOMETRY_FILE)
    steps = sorted({0, *checkpoint_steps(config.steps, config.n_regular)})
    assert sorted(df.revision.unique(), key=lambda r: int(r[4:])) == [f"step{s}" for s in steps]
    assert set(df.model) == {"w16"} and METRICS <= set(df.metric)
    z = df[df.metric == "pga_z"]
    assert set(z.layer) == {"0", "1", "2", "final"} and np.isfinite(z.value).all()
    assert (z.seed == config.seed).all() and (z.setting == "ccr=1").all()
    # the per-width file holds the same rows as the suite's combined table
    w = pd.read_parquet(tmp_path / "geo" / "16" / GEOMETRY_FILE)
    assert _z(w).equals(_z(df))
    # step 0 is the initial model: measured before any update
    assert math.isfinite(float(z[z.revision == "step0"].value.iloc[0]))


def test_interrupted_suite_resumes_to_the_same_geometry(tmp_path, config):
    full = tmp_path / "full"
    train_suite(full, config, progress=False)
    cut = tmp_path / "cut"
    first = train_suite(cut, config, progress=False, stop_after_steps=5)
    assert first["widths"]["16"]["status"] == "partial"
    part = pd.read_parquet(cut / "16" / GEOMETRY_FILE)
    assert {"step0", "step1", "step2", "step4"} <= set(part.revision)  # written as it went
    train_suite(cut, config, progress=False)
    assert _weights(cut) == _weights(full)
    a, b = _z(pd.read_parquet(cut / GEOMETRY_FILE)), _z(pd.read_parquet(full / GEOMETRY_FILE))
    assert list(a.index) == list(b.index)  # every step once, none lost or doubled
    assert np.array_equal(a.values, b.values)


def test_cli_options_and_a_foreign_file(tmp_path, config, capsys):
    out = tmp_path / "s"
    argv = ["suite", "train", "--out", str(out), "--micro", "--widths", "16",
            "--texts", config.texts[0], "--quiet", "--geometry-every", "3"]
    assert main(argv) == 0
    revs = set(pd.read_parquet(out / GEOMETRY_FILE).revision)
    assert {"step3", "step6", "step9"} <= revs  # every 3 steps besides the checkpoints
    assert main(["suite", "train", "--out", str(tmp_path / "n"), "--micro", "--widths", "16",
                 "--texts", config.texts[0], "--quiet", "--no-geometry"]) == 0
    assert not (tmp_path / "n" / GEOMETRY_FILE).exists()
    # a geometry.parquet lmgeom did not write is neither read nor replaced
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(foreign)
    with pytest.raises(ConfigError, match="not written by lmgeom"):
        read_geometry(foreign)
    assert read_geometry(tmp_path / "absent.parquet") is None


def test_finetune_records_geometry_per_arm(tiny_dir, tmp_path):
    corpus = tmp_path / "prose.txt"
    corpus.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog {i % 7}"
                                for i in range(40)))
    tiny = tiny_dir("llama")
    base = ["train", "--model", str(tiny), "--texts", str(corpus), "--steps", "4",
            "--eval-every", "2", "--batch-size", "2", "--seq-len", "16", "--eval-chunks", "4",
            "--full", "--quiet"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--out", str(tmp_path / "b"), "--no-geometry"]) == 0
    geo = pd.read_parquet(tmp_path / "a" / "arms" / "push-away" / GEOMETRY_FILE)
    assert set(geo.revision) == {"step0", "step2", "step4"} and set(geo.model) == {"push-away"}
    assert METRICS <= set(geo.metric)
    assert not (tmp_path / "b" / "arms" / "push-away" / GEOMETRY_FILE).exists()
    # the same training with and without the monitor
    ta, tb = (pd.read_parquet(tmp_path / x / "train.parquet") for x in "ab")
    assert list(ta.value) == list(tb.value)
    sig = [json.loads((tmp_path / x / "manifest.json").read_text())["signature"] for x in "ab"]
    assert sig[0] == sig[1]  # the monitor is no setting of the run


# --------------------------------------------------------------------------- train --compare


def test_regulariser_names_agree():
    from lmgeom.commands.train import COMPARABLE
    from lmgeom.experiments.finetune import ALL_ARMS
    from lmgeom.training.regularisers import REGULARISERS

    assert set(ALL_ARMS) == set(REGULARISERS) == set(COMPARABLE)


def test_t_interval_matches_scipy():
    from scipy import stats

    from lmgeom.experiments.finetune import t_interval

    x = [0.3, -0.1, 0.7, 0.2]
    m, lo, hi = t_interval(x)
    ref = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert m == pytest.approx(np.mean(x)) and (lo, hi) == pytest.approx(ref)
    m1, lo1, hi1 = t_interval([2.0])
    assert m1 == 2.0 and math.isnan(lo1) and math.isnan(hi1)


def test_compare_over_seeds_end_to_end(tiny_dir, tmp_path, capsys):
    from lmgeom.experiments.finetune import seed_changes

    corpus = tmp_path / "prose.txt"
    corpus.write_text("\n".join(f"a river {i} crosses the valley {i % 5} again" for i in range(40)))
    out = tmp_path / "cmp"
    argv = ["train", "--model", str(tiny_dir("llama")), "--texts", str(corpus), "--steps", "2",
            "--eval-every", "2", "--batch-size", "2", "--seq-len", "16", "--eval-chunks", "4",
            "--full", "--quiet", "--no-geometry", "--lambda", "0.5",
            "--compare", "none,push-away,infonce-cos", "--seeds", "0,1", "--out", str(out)]
    assert main(argv) == 0
    df = pd.read_parquet(out / "compare.parquet")
    assert set(df.revision) == {"none", "push-away", "infonce-cos"}
    ch = df[df.metric == "perplexity_change"].set_index("revision")
    assert (ch.n == 2).all() and np.isfinite(ch.ci_low).all() and (ch.ci_low <= ch.value).all()
    assert set(df[df.metric == "dispersion_vs_none"].revision) == {"push-away", "infonce-cos"}
    # the mean over seeds of each seed's own run (last step minus step 0)
    per = pd.concat([seed_changes(pd.read_parquet(out / ".work" / f"seed{s}" / "train.parquet"), s)
                     for s in (0, 1)])
    want = per[(per.arm == "push-away") & (per.metric == "perplexity")]["change"].mean()
    assert ch.loc["push-away", "value"] == pytest.approx(want)
    assert (out / "plots" / "compare.png").is_file() and (out / "report.html").is_file()
    assert "95 % CI over seeds" in capsys.readouterr().out
    # mistakes: one line each, nothing run
    for bad in (["--compare", "push-away"], ["--compare", "push-away,nope"],
                ["--seeds", "0,1"], ["--compare", "--seeds", "3"]):
        assert main([*argv[:-8], *bad, "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
