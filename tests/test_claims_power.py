"""The power rule of the PGA claims (lmgeom.metrics.claims.z_call / Power): a z decision that
the n cannot make is ``underpowered`` with the n it needs, never supported or contradicted;
a profile with no usable z gives ``not testable here`` for that model, and the rules go on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmgeom.metrics import claims_pga as R
from lmgeom.metrics import claims_profile as P
from lmgeom.metrics.claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
    REFERENCE_N,
    REFERENCE_Z,
    SUPPORTED,
    UNDERPOWERED,
    ModelInfo,
    Power,
    z_call,
)
from lmgeom.results import table

NARROW = ModelInfo("narrow", d=576, family="llama", tuned="instruct", n_layers=8)
OTHER = ModelInfo("other", d=640, family="gemma3_text", tuned="instruct", n_layers=8)
WIDE = ModelInfo("wide", d=2048, family="llama", tuned="base", n_layers=8)

# the shape of a detour at the papers' setting (n = 256): peak at layer 2, a zone 4-6 down to
# -6, recovery at the final point
DETOUR_256 = np.array([3.0, 6.0, 9.0, 5.0, -4.0, -6.0, -4.5, 2.5, 4.0, 7.0])


def rows_at(model: str, z, n: int, *, band: float = 2.0, flag: str = "",
            setting: str = "ccr=1"):
    """A model's table at n texts: pga_z with its null band, and pc1 rows carrying n."""
    L = len(z) - 2
    labels = [str(i) for i in range(L + 1)] + ["final"]
    out = []
    for i, (lab, v) in enumerate(zip(labels, z)):
        common = dict(model=model, layer=lab, layer_index=i, depth=i / (L + 1))
        f = {"flag": flag} if flag else {}
        out += [table.row(metric="pga_z", value=float(v), setting=setting, n=n * (n - 1) / 2,
                          **common, **f),
                table.row(metric="null_z_low", value=-band, setting=setting, **common, **f),
                table.row(metric="null_z_high", value=band, setting=setting, **common, **f),
                table.row(metric="pc1_share", value=0.01, n=n, **common),
                table.row(metric="pc1_baseline", value=0.1, n=n, **common)]
    return out


def planted(n: int, growth: float = 1.0):
    """The detour's z at n texts, when |z| of the effect grows as n^growth."""
    return DETOUR_256 * (n / REFERENCE_N) ** growth


# --------------------------------------------------------------------------- z_call


def test_z_call_decides_outside_the_band_and_says_underpowered_inside():
    p = Power(256, growth=1.0, source="assumed")
    assert z_call(-6.0, -2.0, 2.0, "<", p)[0] == SUPPORTED
    assert z_call(6.0, -2.0, 2.0, "<", p)[0] == CONTRADICTED
    v, note, nums = z_call(-1.0, -2.0, 2.0, "<", p)
    assert v == UNDERPOWERED
    # |z| = 1 grows as n^1: it clears the band half-width 2 at n = 512
    assert nums["n_needed"] == 512 and "needs n ≈ 512" in note
    assert nums["band_half_width"] == 2.0
    # with a square-root growth it takes four times the texts
    assert z_call(-1.0, -2.0, 2.0, "<", Power(256, growth=0.5))[2]["n_needed"] == 1024
    # z = 0 shows no trend: no n to extrapolate to
    v, note, nums = z_call(0.0, -2.0, 2.0, ">", p)
    assert v == UNDERPOWERED and math.isinf(nums["n_needed"]) and "no trend" in note


def test_z_call_refuses_a_decision_the_band_would_hide_at_this_n():
    # at n = 32 an effect of the papers' size (|z| 10 at n = 256) is about 1.25: inside ±2,
    # so even a z far outside the band is no evidence about the claim at this n
    p = Power(32, growth=1.0)
    v, note, nums = z_call(-9.0, -2.0, 2.0, "<", p)
    assert v == UNDERPOWERED
    need = math.ceil(REFERENCE_N * 2.0 / REFERENCE_Z)
    assert nums["n_needed"] == need and f"needs n ≥ {need}" in note
    assert "papers' size" in note
    # the smallest resolvable effect, as the |z| it would have at the reference n
    assert nums["min_effect_z"] == pytest.approx(2.0 * REFERENCE_N / 32)
    assert z_call(-9.0, -2.0, 2.0, "<", Power(need, growth=1.0))[0] == SUPPORTED


def test_without_a_power_the_interval_rule_alone():
    assert z_call(-1.0, -2.0, 2.0, "<", None)[0] == INCONCLUSIVE
    assert z_call(-6.0, -2.0, 2.0, "<", None)[0] == SUPPORTED


# --------------------------------------------------------------------------- planted effect


def test_planted_zone_underpowered_at_64_decided_at_256():
    """The same effect, measured at two n: at 64 texts its zone sits inside the null band
    (underpowered, with the n it needs), at 256 it is decided."""
    small = R.p2_narrow_collapse(table.frame(rows_at("narrow", planted(64), 64)), [NARROW])
    assert small.verdict == UNDERPOWERED, small.reason
    assert small.n == 64 and small.band_half_width == 2.0
    # the zone's lowest z (-6 at 256, -1.5 at 64) clears ±2 at n = 64 × 2 / 1.5 → 86
    assert small.n_needed == math.ceil(64 * 2.0 / 1.5)
    assert "needs n ≈" in small.reason
    big = R.p2_narrow_collapse(table.frame(rows_at("narrow", planted(256), 256)), [NARROW])
    assert big.verdict == SUPPORTED, big.reason
    assert big.n == 256 and math.isnan(big.n_needed)
    # P3 rests on the zone: unresolved at 64 (underpowered), measured at 256
    assert R.p3_pc1_leaves_readout(table.frame(rows_at("narrow", planted(64), 64)),
                                   [NARROW]).verdict == UNDERPOWERED
    assert R.p3_pc1_leaves_readout(table.frame(rows_at("narrow", planted(256), 256)),
                                   [NARROW]).verdict == SUPPORTED


def test_sixteen_texts_never_contradict_the_zone():
    """Issue 36: "no collapse zone" from 16 texts was a contradiction; the band at that n
    hides an effect of the papers' size, so it is underpowered."""
    direct = np.array([3.0, 6.0, 9.0, 8.5, 8.0, 7.5, 7.0, 6.5, 6.0, 7.0])
    v = R.p2_narrow_collapse(table.frame(rows_at("narrow", direct, 16)), [NARROW])
    assert v.verdict == UNDERPOWERED and "papers' size" in v.reason
    # at the papers' n the same profile does contradict the claim (z stays above the band)
    v = R.p2_narrow_collapse(table.frame(rows_at("narrow", direct, 256)), [NARROW])
    assert v.verdict == CONTRADICTED and "no collapse zone" in v.reason


def test_every_layer_claims_take_the_undecided_layer():
    # P1: all intermediate layers positive, one inside the band → underpowered from that layer
    z = np.array([3.0, 6.0, 9.0, 8.5, 1.0, 7.5, 7.0, 6.5, 6.0, 7.0])
    v = R.p1_wide_stay_positive(table.frame(rows_at("wide", z, 256)), [WIDE])
    assert v.verdict == UNDERPOWERED and "layer 4" in v.reason
    assert v.n_needed == 512
    # a layer decided below the band contradicts, whatever the others
    z[5] = -5.0
    v = R.p1_wide_stay_positive(table.frame(rows_at("wide", z, 256)), [WIDE])
    assert v.verdict == CONTRADICTED and v.estimate == -5.0


def test_over_models_underpowered_when_the_decided_agree():
    assert P.over_models([SUPPORTED, UNDERPOWERED]) == UNDERPOWERED
    assert P.over_models([SUPPORTED, CONTRADICTED, UNDERPOWERED]) == INCONCLUSIVE
    assert P.over_models([UNDERPOWERED, NOT_TESTABLE]) == UNDERPOWERED
    assert P.all_of([SUPPORTED, UNDERPOWERED]) == UNDERPOWERED
    assert P.all_of([CONTRADICTED, UNDERPOWERED]) == CONTRADICTED


# --------------------------------------------------------------------------- all flagged


def test_an_all_flagged_model_is_not_testable_and_the_other_decides():
    """Issue 36: every layer flagged k_rank (k >= the rank of the states) crashed claims
    ("a z profile needs at least one finite value"); now that model is not testable here,
    with the reason, and the good model beside it gives the verdict."""
    df = table.frame(rows_at("narrow", planted(256), 256)
                     + rows_at("other", planted(256), 40, flag="k_rank"))
    v = R.p2_narrow_collapse(df, [NARROW, OTHER])
    assert v.verdict == SUPPORTED
    assert v.details["other"]["verdict"] == NOT_TESTABLE
    assert "every layer is flagged k_rank" in v.details["other"]["note"]
    assert "n=40" in v.details["other"]["note"]
    # every rule runs on the all-flagged model alone: not testable, no exception
    only = table.frame(rows_at("other", planted(256), 40, flag="k_rank")
                       + rows_at("other", planted(256), 40, flag="k_rank", setting="ccr=5")
                       + rows_at("other", planted(256), 40, flag="k_rank", setting="ccr=10"))
    for rule in (R.p2_narrow_collapse, R.p3_pc1_leaves_readout, R.p4_ccr_restores,
                 R.p5_spectral_flat):
        got = rule(only, [ModelInfo("other", d=896, family="qwen2", n_layers=8)])
        assert got.verdict == NOT_TESTABLE, (rule.__name__, got.reason)
    assert all(x.verdict == NOT_TESTABLE
               for x in R.p8_probes(only, [ModelInfo("other", d=896, family="qwen2")]))
