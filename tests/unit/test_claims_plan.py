"""``lmgeom claims`` decides up front what the data can support (issue 36), on the bundled model:

* a k that cannot fit n and the CCR levels is refused before any model loads, and the run
  folder is not created; without ``--k`` the run takes the largest k that fits and says so once;
* a model whose every layer is flagged (z not meaningful) gets ``not testable here`` with the
  reason, and the model beside it still gives its verdict: no crash, claims.parquet written;
* the layer sweep is kept in the cache: a rerun with other options reuses every layer;
* the README's and the Makefile's quick-look commands run (with few texts).
"""

from __future__ import annotations

import time

import pytest
from support.claims_plan import quick_looks

from lmgeom.cli import main


def test_a_k_that_cannot_fit_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    from lmgeom.experiments.options import ModelOptions

    loads: list[str] = []
    monkeypatch.setattr(ModelOptions, "load", lambda self, spec: loads.append(spec))
    out = tmp_path / "c"
    t = time.perf_counter()
    rc = main(["claims", "--model", "smollm2-135m", "--n", "16", "--k", "200", "--only", "P2",
               "--out", str(out)])
    took = time.perf_counter() - t
    err = capsys.readouterr().err
    assert rc == 2
    assert "--k 200 does not fit 16 texts with CCR levels up to 10" in err
    assert "use --k 4 or less" in err and "--n 212 or more" in err
    assert loads == [] and not out.exists()  # no model, no run folder: nothing to clean up
    print(f"refused in {took:.2f} s")
    # the same rule in analyze and sweep, before their work
    assert main(["analyze", "--model", "smollm2-135m", "--n", "16", "--k", "200",
                 "--out", str(tmp_path / "a")]) == 2
    assert "does not fit 16 texts" in capsys.readouterr().err and loads == []
    assert not (tmp_path / "a").exists()


def test_fit_k_rules():
    from lmgeom.errors import ConfigError
    from lmgeom.experiments.layer_sweep import fit_k

    assert fit_k(None, n=512, ccr=(0, 1, 5, 10)) == (100, None)
    k, note = fit_k(None, n=64, ccr=(0, 1, 5, 10))
    assert k == 64 - 10 - 2 and "give --n 112 or more for k = 100" in note
    assert fit_k(None, n=512, ccr=(1,), d=64) == (63, "k = 63, the width d = 64 minus one")
    assert fit_k("auto", n=512, ccr=(1,), d=576)[0] == 100
    assert fit_k("auto", n=512, ccr=(1,), d=256)[0] == 64
    assert fit_k(48, n=64, ccr=(0, 1, 5, 10)) == (48, None)  # an explicit k that fits: as is
    with pytest.raises(ConfigError, match="smaller than the width d = 32"):
        fit_k(40, n=100, ccr=(1,), d=32)
    with pytest.raises(ConfigError, match="use --k 52 or less, give --n 112 or more"):
        fit_k(100, n=64, ccr=(0, 1, 5, 10))
    with pytest.raises(ConfigError, match="too few for CCR levels up to 10"):
        fit_k(None, n=12, ccr=(0, 10))


def test_the_quick_looks_are_found():
    looks = quick_looks()
    assert len(looks) >= 2, looks
    assert all(c[0] == "claims" for c in looks)

