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
    from lmgeom.metrics.regime import classify_regime, pga_findings
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


# --------------------------------------------------------------------------- setting strings


def test_parse_setting_and_ccr_of():
    from lmgeom.metrics.regime import ccr_of, parse_setting

    assert parse_setting("") == {}
    assert parse_setting("ccr=1") == {"ccr": "1"}
    assert parse_setting("vs=B;layer_b=3;ccr=1") == {"vs": "B", "layer_b": "3", "ccr": "1"}
    assert parse_setting("ccr=1,readout=raw") == {"ccr": "1", "readout": "raw"}
    # a part without '=' continues the value before it; the first of repeated keys wins
    assert parse_setting("forms=('a', 'b');k=v") == {"forms": "('a', 'b')", "k": "v"}
    assert parse_setting("eval=wiki;step=8;lambda=0.1;layer=final") == {
        "eval": "wiki", "step": "8", "lambda": "0.1", "layer": "final"}
    assert parse_setting("a=1;a=2") == {"a": "1"}
    assert parse_setting("texts=hf:x::test;level=group;g=100")["texts"] == "hf:x::test"
    assert [ccr_of(s) for s in ("ccr=10", "x=1;ccr=5", "ccr=1,readout=raw", "noccr=3",
                                "ccr=-1", "level=chunk", "")] == [10, 5, 1, None, None, None, None]


def test_primary_and_higher_settings():
    from lmgeom.metrics.regime import higher_settings, primary_setting

    assert primary_setting(["ccr=0", "ccr=1", "ccr=5"]) == "ccr=1"
    assert primary_setting(["ccr=0", "ccr=10", "ccr=5"]) == "ccr=5"   # smallest m > 0
    assert primary_setting(["ccr=0", "folds=5"]) == "ccr=0"
    assert primary_setting(["level=chunk", "level=group"]) == "level=chunk"
    s = ["ccr=1,readout=raw", "ccr=10,readout=raw", "ccr=5", "ccr=5,readout=raw"]
    assert primary_setting(s) == "ccr=1,readout=raw"
    assert higher_settings(s, "ccr=1,readout=raw") == ["ccr=5,readout=raw", "ccr=10,readout=raw"]
    assert higher_settings(["ccr=0", "ccr=1", "ccr=10", "ccr=5"], "ccr=1") == ["ccr=5", "ccr=10"]
    assert higher_settings(["level=chunk"], "level=chunk") == []
    with pytest.raises(DataError):
        primary_setting([])


# --------------------------------------------------------------------------- planted cases


def _table(curves, model="m", revision=""):
    from lmgeom.results import table

    rows = []
    for s, z in curves.items():
        labels = [str(i) for i in range(len(z) - 1)] + ["final"]
        rows += [table.row(model=model, revision=revision, layer=lab, layer_index=i,
                           metric="pga_z", setting=s, value=float(v))
                 for i, (lab, v) in enumerate(zip(labels, z))]
    return table.frame(rows)


@pytest.mark.parametrize("seed", range(25))
def test_planted_detour_is_found_and_restored(seed):
    """A run of negative layers planted after a clear peak is the zone, in the regime, the
    table rows and the report's finding alike; a higher level positive there restores it."""
    from lmgeom.metrics.regime import classify_regime, pga_findings, regimes_from_table

    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 30))                     # non-final layers
    z = rng.uniform(0.5, 4.0, n + 1)
    peak = int(rng.integers(1, n // 2))
    z[peak] = 10.0
    a = int(rng.integers(peak + 1, n - 1))
    b = int(rng.integers(a + 2, n + 1))              # zone a..b-1, >= 2 layers, non-final
    z[a:b] = -rng.uniform(0.1, 5.0, b - a)
    z5 = np.abs(z) + 0.5                             # restores everything
    z10 = z5.copy()
    z10[a] = -1.0                                    # fails at one zone layer
    want = tuple(str(i) for i in range(a, b))
    reg = classify_regime(list(z), other_ccr={10: list(z10), 5: list(z5)})
    assert reg.detour and reg.zones == (want,) and reg.restored_ccr == 5
    assert reg.restoration == {5: (b - a, b - a), 10: (b - a - 1, b - a)}
    assert (reg.min_z, reg.min_layer) == (float(z[a:b].min()), str(a + int(np.argmin(z[a:b]))))
    df = _table({"ccr=1": z, "ccr=5": z5, "ccr=10": z10})
    assert regimes_from_table(df)[("m", "")] == reg
    (f,) = pga_findings(df)
    assert [zn.layers for zn in f.zones] == [want] and f.primary_peak_layer == str(peak)
    r5, r10 = f.zones[0].restoration["ccr=5"], f.zones[0].restoration["ccr=10"]
    assert r5.complete and not r10.complete and r10.still_low == (str(a),)


@pytest.mark.parametrize("seed", range(25))
def test_planted_direct_is_not_a_detour(seed):
    """Positive profiles with at most weak single dips (>= -2) after the peak, negatives before
    the peak and a negative final layer: no zone anywhere."""
    from lmgeom.metrics.regime import classify_regime, pga_findings, regimes_from_table

    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(6, 30))
    z = rng.uniform(0.2, 4.0, n + 1)
    peak = int(rng.integers(2, n - 1))
    z[peak] = 10.0
    z[: peak - 1] -= 6.0                             # negatives before the peak do not count
    for i in range(peak + 1, n, 3):                  # isolated weak dips
        if rng.random() < 0.5:
            z[i] = -rng.uniform(0.01, 1.99)
    z[n] = -rng.uniform(0, 30)                       # the final layer never forms a zone
    reg = classify_regime(list(z))
    assert reg.label == "direct" and reg.zones == () and reg.restored_ccr is None
    df = _table({"ccr=1": z})
    assert regimes_from_table(df)[("m", "")] == reg
    (f,) = pga_findings(df)
    assert f.zones == () and set(f.weak_negative) == {
        str(i) for i in range(peak + 1, n) if z[i] < 0}


def test_restoration_rule():
    from lmgeom.metrics.regime import restoration

    r = restoration(["3", "4", "5"], {"3": 1.0, "4": 0.0, "5": math.nan, "6": -1.0})
    assert (r.size, r.have, r.restored, r.min_z, r.still_low) == (3, 2, 1, 0.0, ("4",))
    assert not r.complete
    assert restoration(["3", "4"], {"3": 1.0, "4": 0.5}).complete
    assert not restoration(["3", "4"], {"3": 1.0}).complete        # missing data: not restored
    assert math.isnan(restoration(["9"], {}).min_z)


# --------------------------------------------------------------------------- unchanged text


def test_report_and_regime_text_unchanged():
    """The phrased verdicts for fixed tables, as the report and the sweep said them before the
    rules moved into lmgeom.metrics.regime (issue 27)."""
    from lmgeom.metrics.regime import regimes_from_table
    from lmgeom.report.reading import describe_pga

    base = np.array([1.5 + 20 * math.exp(-((i - 12) / 5.0) ** 2) for i in range(32)])
    base[20:24] = [-3.0, -12.0, -25.0, -8.0]
    base[24:31] = np.linspace(1.0, 4.0, 7)
    base[31] = 15.0
    c5 = np.abs(base) + 1
    c5[22:24] = [-1.0, -0.5]
    df = _table({"ccr=1": base, "ccr=5": c5})
    assert describe_pga(df) == [
        "m: highest PGA z = 22.5 at layer 12 (CCR-5).",
        "Collapse zone under CCR-1: layers 20–23 (4 non-final layers with z < 0 after the CCR-1 "
        "peak of 21.5 at layer 12; lowest z = -25.0 at layer 22).",
        "In the collapse zone CCR-5 restores positive z in 2 of 4 layers (still <= 0 at layers "
        "22 and 23).",
        "Final layer (final): z = 15.0 under CCR-1 (70 % of the CCR-1 peak of 21.5 at layer 12); "
        "it recovers from the collapse zone.",
    ]
    assert regimes_from_table(df)[("m", "")].describe() == (
        "detour (CCR-1 collapse zone layers 20–23, lowest z -25.00 at layer 22; not restored by "
        "the CCR levels measured)")
    pos = np.array([6.0 + 10 * math.sin(math.pi * i / 31) for i in range(32)])
    assert describe_pga(_table({"ccr=1,readout=raw": pos})) == [
        "m: highest PGA z = 16.0 at layer 15 (CCR-1,readout=raw).",
        "No collapse zone: z is positive in every layer under CCR-1,readout=raw.",
        "Final layer (final): z = 6.00 under CCR-1,readout=raw (38 % of the CCR-1,readout=raw "
        "peak of 16.0 at layer 15).",
    ]
