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
    DEFAULT_Z_GROWTH,
    INCONCLUSIVE,
    NOT_TESTABLE,
    REFERENCE_N,
    REFERENCE_Z,
    SUPPORTED,
    UNDERPOWERED,
    Z_SAMPLING_C,
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


# a shallow detour: the zone's z (-2.6) clears the null band (±2) but not the text-sampling
# error at 64 texts; the shape is the same at every n (z barely grows with n)
SHALLOW = np.array([3.0, 6.0, 9.0, 5.0, -2.4, -2.6, -2.4, 2.5, 4.0, 4.0])


# --------------------------------------------------------------------------- z_call


def test_z_call_decides_outside_the_band_and_says_underpowered_inside():
    # the null band alone (no text-sampling error), |z| growing as n^1
    p = Power(256, growth=1.0, source="assumed", sampling_c=0.0)
    assert z_call(-6.0, -2.0, 2.0, "<", p)[0] == SUPPORTED
    assert z_call(6.0, -2.0, 2.0, "<", p)[0] == CONTRADICTED
    v, note, nums = z_call(-1.0, -2.0, 2.0, "<", p)
    assert v == UNDERPOWERED
    # |z| = 1 grows as n^1: it is past the band half-width 2 from n = 513 on
    assert nums["n_needed"] == 513 and "needs n ≈ 513" in note
    assert nums["band_half_width"] == 2.0
    # with a square-root growth it takes four times the texts
    assert z_call(-1.0, -2.0, 2.0, "<", Power(256, growth=0.5, sampling_c=0.0))[2][
        "n_needed"] == 1025
    # z = 0 shows no trend: no n to extrapolate to
    v, note, nums = z_call(0.0, -2.0, 2.0, ">", p)
    assert v == UNDERPOWERED and math.isinf(nums["n_needed"]) and "no trend" in note


def test_the_text_sampling_error_widens_what_must_be_cleared():
    """z = -2.5 is outside a ±2 null band, but at 64 texts another sample of texts could move
    it by about ±2 (sd sqrt(C / n)): underpowered at 64, decided at 128."""
    p = Power(64)
    assert p.sampling_sd() == pytest.approx(math.sqrt(Z_SAMPLING_C / 64))
    total = math.hypot(2.0, 1.96 * p.sampling_sd())
    v, note, nums = z_call(-2.5, -2.0, 2.0, "<", p)
    assert v == UNDERPOWERED and "inside the text-sampling error" in note
    assert nums["decision_half_width"] == pytest.approx(total)
    need = nums["n_needed"]
    assert 64 < need < 128
    # at that n the effect (grown as n^a) is decided, one text fewer it is not
    for m, want in ((int(need), SUPPORTED), (int(need) - 1, UNDERPOWERED)):
        assert z_call(-p.scale(2.5, m), -2.0, 2.0, "<", Power(m))[0] == want


def test_z_call_refuses_a_decision_the_band_would_hide_at_this_n():
    # at n = 8 an effect of the papers' size (|z| 10 at n = 256, grown as n^0.2) is about 5.0,
    # inside the null band with the text-sampling error (about ±6.1): even z = -9 is no
    # evidence at this n
    v, note, nums = z_call(-9.0, -2.0, 2.0, "<", Power(8))
    assert v == UNDERPOWERED and "papers' size" in note
    need = nums["n_needed"]
    assert 8 < need < 64 and f"needs n ≥ {need:.0f}" in note
    # the smallest resolvable effect, as the |z| it would have at the reference n
    assert nums["min_effect_z"] == pytest.approx(
        nums["decision_half_width"] * (REFERENCE_N / 8) ** DEFAULT_Z_GROWTH)
    # a growth measured on a ladder moves the needed n, never the verdict at this n
    v2, _, nums2 = z_call(-9.0, -2.0, 2.0, "<", Power(8, growth=1.0, source="measured"))
    assert v2 == UNDERPOWERED and nums2["n_needed"] != need
    assert z_call(-9.0, -2.0, 2.0, "<", Power(math.ceil(need)))[0] == SUPPORTED


def test_without_a_power_the_interval_rule_alone():
    assert z_call(-1.0, -2.0, 2.0, "<", None)[0] == INCONCLUSIVE
    assert z_call(-6.0, -2.0, 2.0, "<", None)[0] == SUPPORTED


# --------------------------------------------------------------------------- planted effect


def test_planted_zone_underpowered_at_64_decided_at_256():
    """The same effect, measured at two n: at 64 texts its zone is within what a different
    sample of texts could give (underpowered, with the n it needs), at 256 it is decided."""
    small = R.p2_narrow_collapse(table.frame(rows_at("narrow", SHALLOW, 64)), [NARROW])
    assert small.verdict == UNDERPOWERED, small.reason
    assert small.n == 64 and small.band_half_width == 2.0
    assert small.n_needed == Power(64).n_to_clear(2.6, 2.0) and 64 < small.n_needed <= 256
    assert "needs n ≈" in small.reason
    big = R.p2_narrow_collapse(table.frame(rows_at("narrow", SHALLOW, 256)), [NARROW])
    assert big.verdict == SUPPORTED, big.reason
    assert big.n == 256 and math.isnan(big.n_needed)
    # P3 rests on the zone: unresolved at 64 (underpowered), measured at 256
    assert R.p3_pc1_leaves_readout(table.frame(rows_at("narrow", SHALLOW, 64)),
                                   [NARROW]).verdict == UNDERPOWERED
    assert R.p3_pc1_leaves_readout(table.frame(rows_at("narrow", SHALLOW, 256)),
                                   [NARROW]).verdict == SUPPORTED


def test_sixteen_texts_do_not_contradict_the_zone():
    """Issue 36: "no collapse zone" from 16 texts was a contradiction. At 16 texts z moves by
    about ±4 from one sample of texts to the next, so a direct profile whose z after the peak
    stays near 3.5 is underpowered there and contradicts the claim only at 256."""
    direct = np.array([3.0, 6.0, 9.0, 4.5, 4.2, 4.0, 3.8, 3.5, 3.6, 7.0])
    v = R.p2_narrow_collapse(table.frame(rows_at("narrow", direct, 16)), [NARROW])
    assert v.verdict == UNDERPOWERED and "text-sampling error" in v.reason
    v = R.p2_narrow_collapse(table.frame(rows_at("narrow", direct, 256)), [NARROW])
    assert v.verdict == CONTRADICTED and "no collapse zone" in v.reason


def test_every_layer_claims_take_the_undecided_layer():
    # P1: all intermediate layers positive, one inside the band → underpowered from that layer
    z = np.array([3.0, 6.0, 9.0, 8.5, 1.0, 7.5, 7.0, 6.5, 6.0, 7.0])
    v = R.p1_wide_stay_positive(table.frame(rows_at("wide", z, 256)), [WIDE])
    assert v.verdict == UNDERPOWERED and "layer 4" in v.reason
    assert v.n_needed == Power(256).n_to_clear(1.0, 2.0) > 256
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
    df = table.frame(rows_at("narrow", DETOUR_256, 256)
                     + rows_at("other", DETOUR_256, 40, flag="k_rank"))
    v = R.p2_narrow_collapse(df, [NARROW, OTHER])
    assert v.verdict == SUPPORTED
    assert v.details["other"]["verdict"] == NOT_TESTABLE
    assert "every layer is flagged k_rank" in v.details["other"]["note"]
    assert "n=40" in v.details["other"]["note"]
    # every rule runs on the all-flagged model alone: not testable, no exception
    only = table.frame(rows_at("other", DETOUR_256, 40, flag="k_rank")
                       + rows_at("other", DETOUR_256, 40, flag="k_rank", setting="ccr=5")
                       + rows_at("other", DETOUR_256, 40, flag="k_rank", setting="ccr=10"))
    for rule in (R.p2_narrow_collapse, R.p3_pc1_leaves_readout, R.p4_ccr_restores,
                 R.p5_spectral_flat):
        got = rule(only, [ModelInfo("other", d=896, family="qwen2", n_layers=8)])
        assert got.verdict == NOT_TESTABLE, (rule.__name__, got.reason)
    assert all(x.verdict == NOT_TESTABLE
               for x in R.p8_probes(only, [ModelInfo("other", d=896, family="qwen2")]))
