"""The verdict rules of the PGA claims P1-P8 (lmgeom.metrics.claims_pga): each on a planted case
that must come out supported and one that must come out contradicted, plus the width
conditions and the helpers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lmgeom.metrics import claims_pga as R
from lmgeom.metrics import claims_profile as P
from lmgeom.metrics.claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
    SUPPORTED,
    ModelInfo,
    verdict_from_interval,
)
from lmgeom.results import table

NARROW = ModelInfo("narrow", d=576, family="llama", tuned="instruct", n_layers=8)
MID = ModelInfo("mid", d=896, family="qwen2", tuned="instruct", n_layers=8)
WIDE = ModelInfo("wide", d=2048, family="llama", tuned="base", n_layers=8)


def profile_rows(model: str, z, *, setting: str = "ccr=1", band: float = 2.0,
                 revision: str = "", metric: str = "pga_z"):
    """Rows of one z profile over layers 0..L and final (len(z) = L + 2), with a null band."""
    L = len(z) - 2
    labels = [str(i) for i in range(L + 1)] + ["final"]
    out = []
    for i, (lab, v) in enumerate(zip(labels, z)):
        common = dict(model=model, revision=revision, layer=lab, layer_index=i,
                      depth=i / (L + 1), setting=setting)
        out.append(table.row(metric=metric, value=float(v), **common))
        if metric == "pga_z":
            out.append(table.row(metric="null_z_low", value=-band, **common))
            out.append(table.row(metric="null_z_high", value=band, **common))
    return out


def per_layer(model: str, metric: str, values, *, ci: float | None = None):
    L = len(values) - 2
    labels = [str(i) for i in range(L + 1)] + ["final"]
    return [table.row(model=model, layer=lab, layer_index=i, depth=i / (L + 1), metric=metric,
                      value=float(v), ci_low=float(v) - ci if ci is not None else math.nan,
                      ci_high=float(v) + ci if ci is not None else math.nan,
                      setting="folds=5" if metric.startswith("probe") else "")
            for i, (lab, v) in enumerate(zip(labels, values))]


# a narrow detour: peak at layer 2, zone 4-6 well below the band, layer 8 = L, final recovers
DETOUR = [3.0, 6.0, 9.0, 5.0, -6.0, -8.0, -5.0, 2.5, 4.0, 7.0]
DIRECT = [3.0, 6.0, 9.0, 8.5, 8.0, 7.5, 7.0, 6.5, 6.0, 7.0]


def test_p1_wide_positive_supported_and_dip_contradicted():
    good = table.frame(profile_rows("wide", DIRECT))
    v = R.p1_wide_stay_positive(good, [WIDE])
    assert v.verdict == SUPPORTED
    assert v.estimate == 6.0 and v.ci_low == pytest.approx(6.0 - 2.0)  # layer 1 (of 1..7)
    bad = table.frame(profile_rows("wide", DIRECT[:4] + [-6.0] + DIRECT[5:]))
    v = R.p1_wide_stay_positive(bad, [WIDE])
    assert v.verdict == CONTRADICTED and v.estimate == -6.0
    # a dip inside the null band is neither
    mid = table.frame(profile_rows("wide", DIRECT[:4] + [1.0] + DIRECT[5:]))
    assert R.p1_wide_stay_positive(mid, [WIDE]).verdict == INCONCLUSIVE


def test_p1_needs_width_and_names_the_widest():
    v = R.p1_wide_stay_positive(table.frame(profile_rows("narrow", DIRECT)),
                                [NARROW, ModelInfo("q", d=1536, family="qwen2")])
    assert v.verdict == NOT_TESTABLE
    assert "needs d >= 2048; the widest model here has d = 1536" in v.reason


def test_p2_detour_supported_direct_contradicted():
    v = R.p2_narrow_collapse(table.frame(profile_rows("narrow", DETOUR)), [NARROW])
    assert v.verdict == SUPPORTED
    assert v.estimate == -8.0 and v.direction == "<"
    assert v.ci_high == pytest.approx(-8.0 + 2.0)
    assert "collapse zone 4-6" in v.reason
    v = R.p2_narrow_collapse(table.frame(profile_rows("narrow", DIRECT)), [NARROW])
    assert v.verdict == CONTRADICTED and "no collapse zone" in v.reason
    # a zone without recovery at the final layer contradicts the "recover" half
    v = R.p2_narrow_collapse(table.frame(profile_rows("narrow", DETOUR[:-1] + [-9.0])), [NARROW])
    assert v.verdict == CONTRADICTED


def test_p2_split_models_are_inconclusive():
    df = table.frame(profile_rows("narrow", DETOUR) + profile_rows("mid", DIRECT))
    v = R.p2_narrow_collapse(df, [NARROW, MID])
    assert v.verdict == INCONCLUSIVE and "split" in v.reason
    assert R.p2_narrow_collapse(df, [WIDE]).verdict == NOT_TESTABLE


def test_p3_pc1_share_in_zone():
    base = [100 / 576] * 10
    low = [b * (0.3 if i in (4, 5, 6) else 2.0) for i, b in enumerate(base)]
    rows = profile_rows("narrow", DETOUR) + per_layer("narrow", "pc1_baseline", base)
    v = R.p3_pc1_leaves_readout(table.frame(rows + per_layer("narrow", "pc1_share", low)),
                                [NARROW], seed=1)
    assert v.verdict == SUPPORTED and v.estimate == pytest.approx(0.3)
    high = [b * 1.8 for b in base]
    v = R.p3_pc1_leaves_readout(table.frame(rows + per_layer("narrow", "pc1_share", high)),
                                [NARROW], seed=1)
    assert v.verdict == CONTRADICTED and v.estimate == pytest.approx(1.8)
    # no zone anywhere: nothing to test
    none = table.frame(profile_rows("narrow", DIRECT) + per_layer("narrow", "pc1_share", high)
                       + per_layer("narrow", "pc1_baseline", base))
    assert R.p3_pc1_leaves_readout(none, [NARROW]).verdict == NOT_TESTABLE


def test_p4_ccr_restores_every_layer():
    ok = profile_rows("mid", DIRECT, setting="ccr=5") + profile_rows("mid", DIRECT,
                                                                      setting="ccr=10")
    assert R.p4_ccr_restores(table.frame(ok), [MID]).verdict == SUPPORTED
    # the paper: "CCR-5 or CCR-10 restores": one level restoring every layer is enough
    one = profile_rows("mid", DIRECT, setting="ccr=5") + profile_rows("mid", DETOUR,
                                                                       setting="ccr=10")
    v = R.p4_ccr_restores(table.frame(one), [MID])
    assert v.verdict == SUPPORTED and v.estimate == min(DIRECT) and "CCR-10" in v.reason
    bad = profile_rows("mid", DETOUR, setting="ccr=5") + profile_rows("mid", DETOUR,
                                                                       setting="ccr=10")
    v = R.p4_ccr_restores(table.frame(bad), [MID])
    assert v.verdict == CONTRADICTED and v.estimate == -8.0 and "CCR-10" in v.reason
    v = R.p4_ccr_restores(table.frame(ok), [NARROW])
    assert v.verdict == NOT_TESTABLE and "needs d >= 768" in v.reason


def test_p5_flat_spectra_supported_tracking_spectra_contradicted():
    swing = [1.0, 4.0, 9.0, 5.0, -6.0, -8.0, -2.0, 3.0, 6.0, 7.0]
    rows = profile_rows("narrow", swing)
    flat = rows + [r for m in R.P5_METRICS for r in per_layer("narrow", m, [1.0] * 10)]
    v = R.p5_spectral_flat(table.frame(flat), [NARROW], seed=0)
    assert v.verdict == SUPPORTED and v.estimate == 0.0
    follow = rows + [r for m in R.P5_METRICS for r in per_layer("narrow", m, swing)]
    v = R.p5_spectral_flat(table.frame(follow), [NARROW], seed=0)
    assert v.verdict == CONTRADICTED and v.estimate == pytest.approx(1.0)
    # z that does not swing beyond its band says nothing
    calm = profile_rows("narrow", [1.0, 1.5, 1.2, 0.8, 1.1, 0.9, 1.3, 1.0, 1.2, 1.1])
    calm += [r for m in R.P5_METRICS for r in per_layer("narrow", m, [1.0] * 10)]
    assert R.p5_spectral_flat(table.frame(calm), [NARROW]).verdict == INCONCLUSIVE


def _suite(losses: dict[str, list[float]], profiles: dict[str, list[float]]):
    rows = []
    steps = [f"step{100 * (i + 1)}" for i in range(4)]
    for w, ls in losses.items():
        for s, v in zip(steps, ls):
            rows.append(table.row(model=w, revision=s, metric="val_loss", value=v))
        rows += profile_rows(w, profiles[w], revision=steps[-1])
    return table.frame(rows)


def test_p6_width_suite():
    alike = {"w64": [6.0, 5.0, 4.5, 4.2], "w128": [6.0, 4.9, 4.4, 4.15]}
    v = R.p6_width_suite(_suite(alike, {"w64": DETOUR, "w128": DIRECT}))
    assert v.verdict == SUPPORTED and v.ci_high < R.P6_MAX_LOSS_SPREAD
    apart = {"w64": [6.0, 5.0, 4.5, 4.2], "w128": [6.0, 3.0, 2.5, 2.0]}
    v = R.p6_width_suite(_suite(apart, {"w64": DETOUR, "w128": DIRECT}))
    assert v.verdict == CONTRADICTED
    same_geo = R.p6_width_suite(_suite(alike, {"w64": DIRECT, "w128": DIRECT}))
    assert same_geo.verdict == CONTRADICTED and "direct" in same_geo.reason
    v = R.p6_width_suite(None, [NARROW])
    assert v.verdict == NOT_TESTABLE and "--suite" in v.reason


def _conv(readout: float, full: float, z: float, n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        common = dict(model="a", layer=str(i), layer_index=i, setting=f"vs=b;layer_b={i};ccr=1")
        rows += [table.row(metric="conv_full", value=full + 0.01 * rng.standard_normal(), **common),
                 table.row(metric="conv_readout", value=readout + 0.01 * rng.standard_normal(),
                           **common),
                 table.row(metric="conv_z", value=z + 0.3 * rng.standard_normal(), **common)]
    return table.frame(rows)


def test_p7_convergence():
    two = [NARROW, MID]
    v = R.p7_convergence(_conv(0.6, 0.4, 6.0), two, seed=3)
    assert v.verdict == SUPPORTED and v.estimate == pytest.approx(0.2, abs=0.02)
    assert R.p7_convergence(_conv(0.3, 0.5, 0.2), two).verdict == CONTRADICTED
    # above the full space but not above random frames: one half fails
    assert R.p7_convergence(_conv(0.6, 0.4, 0.0), two).verdict == CONTRADICTED
    assert R.p7_convergence(None, [NARROW]).verdict == NOT_TESTABLE


def test_p8_probes_in_zone_and_wide_tracking():
    acc_hi = [0.9, 0.95, 0.96, 0.95, 0.94, 0.93, 0.95, 0.95, 0.95, 0.95]
    rows = profile_rows("narrow", DETOUR) + per_layer("narrow", "probe_acc", acc_hi, ci=0.01)
    p8, wide = R.p8_probes(table.frame(rows), [NARROW])
    assert p8.claim == "P8" and p8.verdict == SUPPORTED
    assert p8.threshold == pytest.approx(0.9 * 0.96)
    assert wide.claim == "P8.wide" and wide.verdict == NOT_TESTABLE
    acc_lo = acc_hi[:4] + [0.3, 0.25, 0.3] + acc_hi[7:]
    rows = profile_rows("narrow", DETOUR) + per_layer("narrow", "probe_acc", acc_lo, ci=0.01)
    assert R.p8_probes(table.frame(rows), [NARROW])[0].verdict == CONTRADICTED
    # wide: accuracy that follows z (and one that runs against it)
    z = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0, 17.0, 18.0]
    follow = [0.5 + 0.02 * v for v in z]
    rows = profile_rows("wide", z) + per_layer("wide", "probe_acc", follow, ci=0.01)
    assert R.p8_probes(table.frame(rows), [WIDE])[1].verdict == SUPPORTED
    rows = profile_rows("wide", z) + per_layer("wide", "probe_acc", follow[::-1], ci=0.01)
    assert R.p8_probes(table.frame(rows), [WIDE])[1].verdict == CONTRADICTED
    # no probes at all: not testable, saying why
    p8, _ = R.p8_probes(table.frame(profile_rows("narrow", DETOUR)), [NARROW])
    assert p8.verdict == NOT_TESTABLE and "labelled" in p8.reason


def test_combinators_and_bootstrap():
    assert P.all_of([SUPPORTED, SUPPORTED]) == SUPPORTED
    assert P.all_of([SUPPORTED, CONTRADICTED]) == CONTRADICTED
    assert P.all_of([SUPPORTED, INCONCLUSIVE]) == INCONCLUSIVE
    assert P.over_models([CONTRADICTED, CONTRADICTED]) == CONTRADICTED
    assert P.over_models([SUPPORTED, CONTRADICTED]) == INCONCLUSIVE
    assert P.over_models([NOT_TESTABLE]) == NOT_TESTABLE
    x = np.arange(20, dtype=float)
    a = P.bootstrap_ci(x, np.mean, seed=5)
    assert a == P.bootstrap_ci(x, np.mean, seed=5)  # seeded: reproducible
    assert a[0] < x.mean() < a[1]
    # one or two points are no interval: [2.34, 2.34] from one layer decided claims (issue 48)
    for few in ([2.0], [2.0, 3.0]):
        lo, hi = P.bootstrap_ci(few, np.mean, seed=0)
        assert math.isnan(lo) and math.isnan(hi)
        assert verdict_from_interval(lo, hi, 0.0, ">") == INCONCLUSIVE
    assert "decides nothing" in P.too_few_points(1) and P.too_few_points(3) == ""
    assert np.isfinite(P.bootstrap_ci([1.0, 2.0, 4.0], np.mean, seed=0)).all()
    from scipy.stats import spearmanr

    u, w = np.random.default_rng(0).random((2, 30))
    w[3] = w[4]
    assert P.spearman(u, w) == pytest.approx(spearmanr(u, w)[0])


def test_z_profile_reads_band_and_skips_points():
    rows = profile_rows("m", DETOUR) + [table.row(model="m", layer="3.attn_out", layer_index=3,
                                                  metric="pga_z", setting="ccr=1", value=99.0)]
    prof = P.z_profile(table.frame(rows), "m")
    assert list(prof["z"]) == DETOUR and (prof["hi"] == 2.0).all()
    assert isinstance(prof, pd.DataFrame)


def test_z_not_meaningful_is_no_evidence():
    """A layer flagged k_rank (k >= the states' rank) neither supports nor contradicts."""
    rows = profile_rows("mid", DIRECT, setting="ccr=5") + profile_rows("mid", DIRECT,
                                                                       setting="ccr=10")
    bad = profile_rows("mid", [-9.0] + DIRECT[1:], setting="ccr=10")
    for r in bad:
        if r["layer"] == "0":
            r["flag"] = "k_rank"
    df = table.frame(rows[: len(rows) // 2] + bad)
    assert R.p4_ccr_restores(df, [MID]).verdict == SUPPORTED
    assert "0" not in set(P.z_profile(df, "mid", "ccr=10")["layer"])


def test_p7_leaves_out_layer_pairs_flagged_not_meaningful():
    df = _conv(0.6, 0.4, 6.0)
    bad = _conv(0.1, 0.9, -5.0, n=3).assign(flag="k_rank")
    v = R.p7_convergence(pd.concat([df, bad], ignore_index=True), [NARROW, MID], seed=3)
    assert v.verdict == SUPPORTED and v.details["n_layer_pairs"] == 12


def test_p2_is_decided_in_two_parts_each_with_its_own_estimate():
    """P2 joins two conditions: P2.zone (the zone's lowest z below its band) and P2.recovery
    (the final z above its band) are decided on their own, each with its estimate and
    interval, and P2's reason names the part that decided it (issue 49)."""
    assert R.PARTS["P2"] == ("P2.zone", "P2.recovery")
    both, zone, rec = R.p2_parts(table.frame(profile_rows("narrow", DETOUR[:-1] + [-9.0])),
                                 [NARROW])
    assert (both.claim, zone.claim, rec.claim) == ("P2", "P2.zone", "P2.recovery")
    assert zone.verdict == SUPPORTED and zone.estimate == -8.0 and zone.direction == "<"
    assert rec.verdict == CONTRADICTED and rec.estimate == -9.0 and rec.direction == ">"
    assert rec.ci_low == pytest.approx(-9.0 - 2.0) and rec.ci_high == pytest.approx(-9.0 + 2.0)
    assert both.verdict == CONTRADICTED and both.estimate == zone.estimate
    assert both.reason.startswith("decided by P2.recovery (P2.zone supported, P2.recovery "
                                  "contradicted)")
    # the whole claim is unchanged by the split
    assert both == R.p2_narrow_collapse(table.frame(profile_rows("narrow", DETOUR[:-1] + [-9.0])),
                                        [NARROW])
    ok = R.p2_parts(table.frame(profile_rows("narrow", DETOUR)), [NARROW])
    assert [v.verdict for v in ok] == [SUPPORTED] * 3 and ok[0].reason.startswith("both parts")
    none = R.p2_parts(table.frame(profile_rows("narrow", DIRECT)), [NARROW])
    assert none[1].verdict == CONTRADICTED and "no collapse zone" in none[1].reason
    assert all(v.verdict == NOT_TESTABLE for v in R.p2_parts(
        table.frame(profile_rows("wide", DIRECT)), [WIDE]))


def test_p7_is_decided_in_two_parts():
    """P7 joins "higher than in the full spaces" and "higher than in random spaces": each part
    has its own estimate and interval; above the full space but not above random frames
    makes P7.full supported, P7.random contradicted and P7 contradicted by P7.random."""
    assert R.PARTS["P7"] == ("P7.full", "P7.random")
    two = [NARROW, MID]
    both, full, rand = R.p7_parts(_conv(0.6, 0.4, 0.0), two, seed=3)
    assert (both.claim, full.claim, rand.claim) == ("P7", "P7.full", "P7.random")
    assert full.verdict == SUPPORTED and full.estimate == pytest.approx(0.2, abs=0.02)
    assert rand.verdict == CONTRADICTED and rand.threshold == pytest.approx(1.96)
    assert rand.estimate == pytest.approx(0.0, abs=0.05) and rand.ci_low <= rand.ci_high
    assert both.verdict == CONTRADICTED and both.reason.startswith("decided by P7.random")
    assert both == R.p7_convergence(_conv(0.6, 0.4, 0.0), two, seed=3)
    ok = R.p7_parts(_conv(0.6, 0.4, 6.0), two, seed=3)
    assert [v.verdict for v in ok] == [SUPPORTED] * 3
    assert all(v.verdict == NOT_TESTABLE for v in R.p7_parts(None, [NARROW]))
