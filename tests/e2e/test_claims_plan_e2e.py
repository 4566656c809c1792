"""``lmgeom claims`` decides up front what the data can support (issue 36), on the bundled model:

* a k that cannot fit n and the CCR levels is refused before any model loads, and the run
  folder is not created; without ``--k`` the run takes the largest k that fits and says so once;
* a model whose every layer is flagged (z not meaningful) gets ``not testable here`` with the
  reason, and the model beside it still gives its verdict: no crash, claims.parquet written;
* the layer sweep is kept in the cache: a rerun with other options reuses every layer;
* the README's and the Makefile's quick-look commands run (with few texts).

End-to-end half (the unit half is tests/unit/test_claims_plan.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
from support.claims_plan import ROOT, quick_looks

from lmgeom.metrics.claims import NOT_TESTABLE, UNDERPOWERED

QUICK = ["--n-null", "20", "--quiet"]


def _cli(args: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lmgeom.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_without_k_the_largest_that_fits_is_used_and_said_once(tmp_path):
    out = tmp_path / "c16"
    r = _cli(["claims", "--model", "smollm2-135m", "--n", "16", "--only", "P2", *QUICK[:2],
              "--out", str(out)])
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "k = 4 instead of 100" in ln]
    assert len(said) == 1, r.stderr  # once, not per model or layer
    man = json.loads((out / "manifest.json").read_text())
    assert man["readout_k"]["k"] == 4 and man["readout_k"]["k_asked"] is None
    df = pd.read_parquet(out / "claims.parquet")
    p2 = df[df.claim == "P2"].iloc[0]
    assert "k = 4 instead of 100" in p2.reason and p2.n == 16
    # at 16 texts z moves by about ±4 between samples of texts: a decision needs z beyond
    # the band and that error together, else it is underpowered with the n it needs
    assert p2.band_half_width > 0 and p2.min_effect_z > p2.band_half_width
    if p2.verdict == UNDERPOWERED:
        assert p2.n_needed > 16
    else:
        assert abs(p2.estimate) > 4.0, p2.reason
    layers = pd.read_parquet(out / "layers.parquet")
    z = layers[layers.metric == "pga_z"]
    # the fitted k fits the texts: the only flag left is at the embeddings (layer 0), where
    # two texts ending in the same token are one point (15 distinct states of 16)
    assert set(z[z.flag.fillna("") != ""].layer.astype(str)) <= {"0"}


@pytest.mark.slow
def test_an_all_flagged_model_beside_a_good_one(tiny_dir, tmp_path):
    """k = 31 on a width-32 model: after CCR-1 its states have rank <= 31, so every layer is
    flagged k_rank (z not meaningful); SmolLM2 (d = 576) beside it is measured as usual."""
    tiny = str(tiny_dir("llama"))
    out = tmp_path / "mixed"
    r = _cli(["claims", "--model", "smollm2-135m", "--model", tiny, "--n", "40", "--k", "31",
              "--ccr", "0,1", "--only", "P2,P3,P5", *QUICK, "--out", str(out)])
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(out / "claims.parquet").set_index("claim")
    assert set(df.index) == {"P2", "P2.zone", "P2.recovery", "P3", "P5"}
    assert (out / "report.html").is_file()
    man = json.loads((out / "manifest.json").read_text())
    p2 = man["claims"]["P2"]["details"]
    smol = next(k for k in p2 if "smol" in k.lower())
    name = next(k for k in p2 if k != smol)
    assert p2[name]["verdict"] == NOT_TESTABLE
    assert "every layer is flagged k_rank" in p2[name]["note"]
    assert p2[smol]["verdict"] != NOT_TESTABLE
    assert df.loc["P2", "verdict"] != NOT_TESTABLE  # the good model decides the claim
    assert "every layer is flagged k_rank" in df.loc["P5", "reason"]


@pytest.mark.slow
def test_a_rerun_with_other_options_reuses_the_sweep(tmp_path):
    base = ["claims", "--model", "smollm2-135m", "--n", "24", *QUICK]
    t = time.perf_counter()
    r = _cli([*base, "--only", "P2", "--out", str(tmp_path / "one")])
    first = time.perf_counter() - t
    assert r.returncode == 0, r.stderr
    t = time.perf_counter()
    r = _cli([*base, "--only", "P2,P3", "--out", str(tmp_path / "two")])
    again = time.perf_counter() - t
    assert r.returncode == 0, r.stderr
    tm = json.loads((tmp_path / "two" / "manifest.json").read_text())["timings"]
    assert tm["pga.sweep.layers_computed[smollm2-135m]"] == 0
    assert tm["pga.sweep.layers_cached[smollm2-135m]"] == 32  # points 0..30 and final
    models = json.loads((tmp_path / "two" / "manifest.json").read_text())["loaded_models"]
    assert models[0]["batches_cached"] >= 1  # and no forward pass: the activation cache
    print(f"first run {first:.1f} s, rerun with other claims {again:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("i", range(2))
def test_each_quick_look_runs(i, tmp_path):
    """Each quick look as written, with few texts (``--n 24``) and into a temporary folder."""
    args = quick_looks()[i]
    if "--n" in args:
        args[args.index("--n") + 1] = "24"
    else:
        args += ["--n", "24"]
    if "--out" in args:
        args[args.index("--out") + 1] = str(tmp_path / "q")
    else:
        args += ["--out", str(tmp_path / "q")]
    r = _cli([*args, "--quiet"])
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(tmp_path / "q" / "claims.parquet")
    assert len(df) > 0
    # every PGA verdict knows its power: an underpowered one says what n it needs
    p = df[df.claim.str.startswith("P")]
    under = p[p.verdict == UNDERPOWERED]
    assert (under.n_needed > 24).all(), under[["claim", "n_needed"]]
    assert (p[p.claim.isin(["P2", "P4"]) & (p.verdict != NOT_TESTABLE)].n == 24).all()

