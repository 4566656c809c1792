"""The verdict rules of claims D1-D8 (lmgeom.metrics.claims_dispersion): each on a planted case
that must come out supported and one that must come out contradicted; the building blocks
against slow references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from lmgeom.metrics import claims_dispersion as cd
from lmgeom.metrics import dispersion
from lmgeom.metrics.claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_TESTABLE,
    SUPPORTED,
    ModelInfo,
    not_testable,
)
from lmgeom.metrics.dispersion import group_means

M = (ModelInfo("m", 64, "llama", "base"),)


def _planted(sign: float, n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.2, 0.8, n)
    ppl = np.exp(2.0 + sign * 3.0 * d + 0.2 * rng.normal(size=n))
    return d, ppl


# ---------------------------------------------------------------------- building blocks
def test_group_members_are_the_groups_of_group_means():
    rng = np.random.default_rng(1)
    d, ppl = rng.uniform(size=(3, 103)), rng.lognormal(size=103)
    for g, mg in ((10, 100), (7, 5), (4, 3)):
        members = cd.group_members(ppl, g, mg)
        gd, gp, _ = group_means(d, ppl, g, mg)
        np.testing.assert_allclose(d[:, members].mean(-1), gd)
        np.testing.assert_allclose(ppl[members].mean(-1), gp)


def test_segment_distance_per_chunk_matches_pairwise_loop_and_dispersion():
    V = np.random.default_rng(2).normal(size=(9, 5)) + 0.5
    per = cd.segment_distance_per_chunk(V)
    U = V / np.linalg.norm(V, axis=1, keepdims=True)
    C = U @ U.T
    ref = np.array([1 - (C[i].sum() - 1) / 8 for i in range(9)])
    np.testing.assert_allclose(per, ref, rtol=1e-12)
    assert per.mean() == pytest.approx(dispersion(V), rel=1e-12)
    members = np.array([[0, 1, 2], [3, 4, 5]])
    np.testing.assert_allclose(cd.group_dispersions(V, members),
                               [dispersion(V[[0, 1, 2]]), dispersion(V[[3, 4, 5]])])


def test_spearman_rows_matches_scipy_with_ties():
    rng = np.random.default_rng(3)
    X = rng.integers(0, 5, size=(4, 30)).astype(float)
    y = rng.integers(0, 7, size=30).astype(float)
    got = cd.spearman_rows(X, y)
    for i in range(4):
        assert got[i] == pytest.approx(scipy.stats.spearmanr(X[i], y)[0], rel=1e-12)


# ---------------------------------------------------------------------- D1 / D5
@pytest.mark.parametrize(("sign", "want"), [(-1.0, SUPPORTED), (+1.0, CONTRADICTED)])
def test_d1_correlation_rule(sign, want):
    d, ppl = _planted(sign)
    v = cd.correlation_verdict("D1.token", d, ppl, level="segments", models=M, n_boot=200)
    assert v.verdict == want
    assert v.direction == "<" and v.threshold == 0.0
    assert (v.estimate < 0) == (sign < 0)
    assert v.ci_low <= v.estimate <= v.ci_high
    assert "segments" in v.quantity and v.seed == 0


def test_d1_independent_data_is_inconclusive():
    rng = np.random.default_rng(5)
    v = cd.correlation_verdict("D1", rng.uniform(size=40), rng.uniform(size=40),
                               level="segments", n_boot=200)
    assert v.verdict == INCONCLUSIVE


@pytest.mark.parametrize(("sign", "want"), [(-1.0, SUPPORTED), (+1.0, CONTRADICTED)])
def test_d5_hardness_rule(sign, want):
    d, ppl = _planted(sign, n=120)
    v = cd.hardness_verdict("D5", d, ppl, models=M, n_boot=200, n_perm=200)
    assert v.verdict == want
    # the hardest decile is found among the least dispersed texts only when the claim holds
    assert (v.details["overlap"] > 0.5) == (sign < 0)
    assert 0 < v.details["overlap_p"] <= 1


# ---------------------------------------------------------------------- D2
def _layers(deep_sign: float, n: int = 150, seed: int = 0):
    rng = np.random.default_rng(seed)
    ppl = rng.lognormal(2.0, 0.5, n)
    z = (np.log(ppl) - np.log(ppl).mean()) / np.log(ppl).std()
    depth = np.linspace(0.1, 1.0, 8)
    strength = np.where(depth > np.median(depth), 1.0, 0.1)  # deep layers follow ppl closely
    X = deep_sign * strength[:, None] * z[None, :] + 0.3 * rng.normal(size=(8, n))
    return X, ppl, depth


@pytest.mark.parametrize(("sign", "want"), [(-1.0, SUPPORTED), (+1.0, CONTRADICTED)])
def test_d2_depth_rule(sign, want):
    X, ppl, depth = _layers(sign)
    v = cd.depth_verdict("D2.token", X, ppl, depth, level="segments", models=M, n_boot=200)
    assert v.verdict == want
    rho = np.array(v.details["rho"])
    deep = np.array(v.details["deep"])
    assert v.estimate == pytest.approx(rho[deep].mean() - rho[~deep].mean())
    for i in (0, 7):
        assert rho[i] == pytest.approx(scipy.stats.spearmanr(X[i], ppl)[0])


def test_depth_contrast_needs_two_depths():
    X, ppl, _ = _layers(-1.0)
    est, lo, hi, _ = cd.depth_contrast(X, ppl, np.ones(8))
    assert math.isnan(est) and math.isnan(lo) and math.isnan(hi)


# ---------------------------------------------------------------------- D3 / D4 / D7 / D8
@pytest.mark.parametrize(("shift", "want"), [(+0.05, SUPPORTED), (-0.05, CONTRADICTED)])
def test_paired_increase_rule_d3_d4_d7(shift, want):
    rng = np.random.default_rng(7)
    before = rng.uniform(0.3, 0.7, 64)
    after = before + shift + 0.01 * rng.normal(size=64)
    w = rng.integers(2, 9, 64).astype(float)
    for weights in (None, w):
        est, lo, hi = cd.paired_difference(after, before, weights=weights, n_boot=200)
        ww = np.ones(64) if weights is None else w
        assert est == pytest.approx(((after - before) * ww).sum() / ww.sum())
        v = cd.interval_verdict("D3.lora", "dispersion after - before", est, lo, hi,
                                threshold=0.0, direction=">", models=M)
        assert v.verdict == want


@pytest.mark.parametrize(("gain", "want"), [(-0.1, SUPPORTED), (+0.1, CONTRADICTED)])
def test_ratio_rule_d7_d8(gain, want):
    rng = np.random.default_rng(8)
    n = rng.integers(50, 60, 40).astype(float)
    b = n * (3.0 + 0.2 * rng.normal(size=40))
    a = b + n * (gain + 0.02 * rng.normal(size=40))
    est, lo, hi = cd.ratio_difference(a, b, n, n_boot=200)
    assert est == pytest.approx((a.sum() - b.sum()) / n.sum())
    v = cd.interval_verdict("D8.lora", "log ppl(push-away) - log ppl(none)", est, lo, hi,
                            threshold=0.0, direction="<", models=M)
    assert v.verdict == want


# ---------------------------------------------------------------------- D6
def test_d6_ranking_rule():
    models = tuple(ModelInfo(f"m{i}", 64 * (i + 1), "llama") for i in range(4))
    gap = np.array([0.1, 0.2, 0.3, 0.4])
    assert cd.ranking_verdict("D6.code", gap, gap * 2 + 1, models=models).verdict == SUPPORTED
    v = cd.ranking_verdict("D6.code", gap, -gap, models=models)
    assert v.verdict == CONTRADICTED
    assert v.details["p_less"] == pytest.approx(1 / 24)
    # one swap of four: rho = 0.8, p = 4/24 > 0.05
    assert cd.ranking_verdict("D6.code", gap, [1, 2, 4, 3]).verdict == INCONCLUSIVE
    two = cd.ranking_verdict("D6.math", gap[:2], gap[:2])
    assert two.verdict == INCONCLUSIVE and "at least 3" in two.reason


def test_exact_rank_test_against_brute_force():
    x = np.array([0.3, 0.1, 0.5, 0.2, 0.9])
    y = np.array([1.0, 0.5, 0.7, 0.2, 0.8])
    t = cd.exact_rank_test(x, y)
    rho = scipy.stats.spearmanr(x, y)[0]
    import itertools

    null = [scipy.stats.spearmanr(x, y[list(p)])[0] for p in itertools.permutations(range(5))]
    assert t["rho"] == pytest.approx(rho)
    assert t["tau"] == pytest.approx(scipy.stats.kendalltau(x, y)[0])
    assert t["p_greater"] == pytest.approx(np.mean(np.array(null) >= rho - 1e-12))


# ---------------------------------------------------------------------- combining
def _v(claim, verdict):
    lo, hi = {SUPPORTED: (-0.5, -0.1), CONTRADICTED: (0.1, 0.5),
              INCONCLUSIVE: (-0.1, 0.1)}[verdict]
    return cd.interval_verdict(claim, "q", (lo + hi) / 2, lo, hi, threshold=0.0, direction="<",
                               models=M)


def test_combine_and_conjunction():
    s, c, i = SUPPORTED, CONTRADICTED, INCONCLUSIVE
    assert cd.combine("D1", [_v("D1.a", s), _v("D1.b", s)]).verdict == s
    assert cd.combine("D1", [_v("D1.a", c), _v("D1.b", c)]).verdict == c
    split = cd.combine("D1", [_v("D1.a", s), _v("D1.b", c)])
    assert split.verdict == i and "1 supported, 1 contradicted" in split.reason
    assert split.ci_low == 0.1  # the least favourable part's interval is shown
    nt = not_testable("D4.x", "s", "needs checkpoints")
    assert cd.combine("D4", [nt]).verdict == NOT_TESTABLE
    assert cd.combine("D1", [_v("D1.a", s), nt]).verdict == s
    assert cd.conjunction("D7", [_v("D7.a", s), _v("D7.b", s)]).verdict == s
    assert cd.conjunction("D7", [_v("D7.a", s), _v("D7.b", c)]).verdict == c
    assert cd.conjunction("D7", [_v("D7.a", s), _v("D7.b", i)]).verdict == i
    assert cd.conjunction("D7", [_v("D7.a", s), nt]).verdict == NOT_TESTABLE


def test_statements_cover_every_claim_and_variant():
    for k in range(1, 9):
        assert cd.statement(f"D{k}")
    assert "inside a segment" in cd.statement("D1.token")
    assert "across segments" in cd.statement("D2.segment")
    assert cd.statement("D3.lora").endswith("(lora)")


@pytest.mark.parametrize("bad", [["P1"], ["D9"]])
def test_only_names_dispersion_claims(bad):
    from lmgeom.errors import ConfigError
    from lmgeom.experiments.claims.dispersion_base import selected

    with pytest.raises(ConfigError, match="D1..D8"):
        selected(bad)
    assert selected(["d3", "D1.token"]) == ("D1", "D3")
    assert selected(None)[0] == "D1" and len(selected(None)) == 8


def test_dispersion_from_unit_sums_matches_token_dispersion():
    import torch

    from lmgeom.experiments.knnlm import unit_sum
    from lmgeom.metrics.dispersion import token_dispersion

    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 12, 16, generator=g) + 0.3
    mask = torch.ones(5, 12, dtype=torch.bool)
    mask[1, 7:] = False
    mask[3, 1:] = False  # one token: undefined
    sums = np.asarray(unit_sum(h, mask), dtype=np.float32)  # what forward_chunks keeps
    got = cd.dispersion_from_unit_sums(sums)
    ref = token_dispersion(h, mask)
    assert np.isnan(got[3]) and np.isnan(ref[3])
    np.testing.assert_allclose(got[[0, 1, 2, 4]], ref[[0, 1, 2, 4]], atol=2e-6)
