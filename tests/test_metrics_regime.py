"""The collapse-zone rule (lmgeom.metrics.regime): known answers, and the same zones for the
sweep's regime label and the report's reading on random profiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmgeom.errors import DataError
from lmgeom.metrics.regime import collapse_profile


def test_known_profile():
    labels = ["0", "1", "2", "3", "4", "5", "6", "final"]
    z = [1.0, 3.0, -0.5, -0.2, 1.0, -2.5, 0.5, 2.0]
    p = collapse_profile(labels, z)
    assert (p.peak_layer, p.peak_z) == ("1", 3.0)
    assert p.after == ("2", "3", "4", "5", "6")
    assert [z.layers for z in p.zones] == [("2", "3"), ("5",)]
    assert [(z.min_z, z.min_layer) for z in p.zones] == [(-0.5, "2"), (-2.5, "5")]
    assert p.weak == () and p.detour and (p.final_layer, p.final_z) == ("final", 2.0)


def test_weak_dip_is_no_zone_and_before_peak_is_ignored():
    p = collapse_profile(["0", "1", "2", "3", "final"], [-5.0, 2.0, -0.5, 1.0, -9.0])
    assert p.zones == () and p.weak == ("2",) and not p.detour
    assert p.final_z == -9.0  # the final layer never forms a zone


def test_non_finite_dropped_and_errors():
    p = collapse_profile(["0", "1", "2", "3", "final"], [0.0, 1.0, math.nan, -0.1, 1.0])
    assert p.after == ("3",) and p.weak == ("3",)
    with pytest.raises(DataError):
        collapse_profile(["0"], [math.nan])
    with pytest.raises(DataError):
        collapse_profile(["0", "1"], [1.0])


@pytest.mark.parametrize("seed", range(20))
def test_regime_and_report_reading_agree(seed):
    """A sweep's regime and the report's collapse zones come from the one rule."""
    from lmgeom.experiments.regime import classify_regime
    from lmgeom.report.reading import pga_findings
    from lmgeom.results import table

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 12))
    labels = [str(i) for i in range(n)] + ["final"]
    z = rng.normal(0, 2, n + 1)
    reg = classify_regime(dict(zip(labels, z)))
    df = table.frame(table.row(model="m", layer=lab, layer_index=i, metric="pga_z",
                               setting="ccr=1", value=float(v))
                     for i, (lab, v) in enumerate(zip(labels, z)))
    f = pga_findings(df)[0]
    assert reg.zones == tuple(tuple(zz.layers) for zz in f.zones)
    assert reg.detour == bool(f.zones) and reg.peak_layer == f.primary_peak_layer
    # and an explicit loop of the rule
    nonfinal = z[:-1]
    p = int(np.argmax(nonfinal))
    want, run = [], []
    for i in range(p + 1, n):
        if nonfinal[i] < 0:
            run.append(i)
        if run and (nonfinal[i] >= 0 or i == n - 1):
            if len(run) >= 2 or min(nonfinal[run]) < -2:
                want.append(tuple(str(j) for j in run))
            run = []
    assert reg.zones == tuple(want)
