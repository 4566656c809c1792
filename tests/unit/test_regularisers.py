"""The dispersion regulariser family (training/regularisers.py): each variant's value on a case
computed by hand, its gradient's effect on the dispersion (a small step on the states, and a
few optimiser steps on a tiny model), selection by name, and the shared token handling."""

from __future__ import annotations

import math

import pytest
import torch

from lmgeom.errors import ConfigError
from lmgeom.metrics import dispersion
from lmgeom.training import make_aux_loss
from lmgeom.training.regularisers import DIRECTION, REGULARISERS

R2 = math.sqrt(0.5)


#: three states in 2-D: cosines e1·e2 = 0, e1·v = e2·v = 1/√2 (scaled rows: cosines unchanged)
THREE = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]], dtype=torch.float64)


def test_values_on_hand_computed_cases():
    # ordered pairs i≠j: cosines (0, 0, 1/√2 ×4)
    assert float(make_aux_loss("infonce-cos")(THREE)) == pytest.approx(
        math.log((2 + 4 * math.exp(R2)) / 6), rel=1e-12)
    assert float(make_aux_loss("infonce-cos", tau=0.5)(THREE)) == pytest.approx(
        math.log((2 + 4 * math.exp(2 * R2)) / 6), rel=1e-12)
    assert float(make_aux_loss("hinge-cos", margin=0.5)(THREE)) == pytest.approx(
        4 * (R2 - 0.5) ** 2 / 6, rel=1e-12)
    assert float(make_aux_loss("hinge-cos")(THREE)) == pytest.approx(4 * 0.5 / 6, rel=1e-12)
    # raw states (1,0), (2,0), (1,2): squared distances 1, 4, 5, divided by the width 2
    H = torch.tensor([[1.0, 0.0], [2.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    ref = math.log(2 * (math.exp(-0.5) + math.exp(-2.0) + math.exp(-2.5)) / 6)
    assert float(make_aux_loss("infonce-l2")(H)) == pytest.approx(ref, rel=1e-12)
    assert float(make_aux_loss("infonce-l2", tau=2.0)(H)) == pytest.approx(
        math.log(2 * (math.exp(-0.25) + math.exp(-1.0) + math.exp(-1.25)) / 6), rel=1e-12)
    # unit states (1,0), (0,1): centred (±½, ∓½), C = [[½, -½], [-½, ½]]: off-diagonal 2·¼ over
    # the width 2; the scaled rows (2,0), (0,3) give the same (the states are normalised first)
    assert float(make_aux_loss("covariance")(torch.tensor([[2.0, 0.0], [0.0, 3.0]]))) == \
        pytest.approx(0.25, rel=1e-6)
    # e1, e2, -e1, -e2: C = diag(2/3, 2/3), no correlation at all
    assert float(make_aux_loss("covariance")(torch.tensor(
        [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]))) == pytest.approx(0.0, abs=1e-12)
    # push-away / squeeze keep their values: −d and +d
    d = float(dispersion(THREE))
    assert d == pytest.approx(1 - 4 * R2 / 6, rel=1e-12)
    assert float(make_aux_loss("push-away")(THREE)) == pytest.approx(-d, rel=1e-12)
    assert float(make_aux_loss("squeeze")(THREE)) == pytest.approx(d, rel=1e-12)


def _states(seed, off, n, d):
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(n, d, generator=g, dtype=torch.float64)
    return H + off * torch.randn(d, generator=g, dtype=torch.float64).abs()  # a shared direction


def _step_raises(name, H):
    H = H.clone().requires_grad_(True)
    loss = make_aux_loss(name)
    value = loss(H)
    value.backward()
    step = H.detach() - 1e-2 * H.grad / H.grad.norm()
    assert float(loss(step)) < float(value)  # the step lowers the regulariser itself
    return float(dispersion(step)) > float(dispersion(H.detach()))


@pytest.mark.parametrize("name", [k for k in REGULARISERS if k != "none"])
def test_one_small_step_moves_dispersion_the_intended_way(name):
    cases = [_states(seed, off, n, d) for seed in range(20) for off in (0.0, 0.7, 2.0)
             for n, d in ((30, 6), (64, 32))]
    raised = sum(_step_raises(name, H) for H in cases)
    if DIRECTION[name] < 0:
        assert raised == 0
    elif name == "covariance":  # decorrelation, not spread: it lowers d here (module docstring)
        assert raised < 0.25 * len(cases)  # 8 of 120 when measured
    else:
        assert raised == len(cases)


def test_registry_selection_and_errors():
    for name, cls in REGULARISERS.items():
        loss = make_aux_loss(name, lam=0.2, layer="1", max_tokens=50, seed=4)
        assert type(loss) is cls and loss.lam == 0.2 and loss.layer == "1"
        assert loss.kind == name and name in DIRECTION
    with pytest.raises(ConfigError, match="infonce-cos"):
        make_aux_loss("infonce")
    for bad in ({"tau": 0.0}, {"tau": float("nan")}):
        with pytest.raises(ConfigError, match="tau"):
            make_aux_loss("infonce-cos", **bad)
    with pytest.raises(ConfigError, match="margin"):
        make_aux_loss("hinge-cos", margin=1.0)
    with pytest.raises(ConfigError, match="within"):
        make_aux_loss("covariance", mode="cross")


def test_padding_sampling_and_the_dispersion_they_report():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 9, 5, generator=g, dtype=torch.float64) + 0.5
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    valid = torch.cat([h[0], h[1, :6], h[2]])
    for name in ("infonce-l2", "infonce-cos", "hinge-cos", "covariance"):
        loss = make_aux_loss(name)
        hp = h.clone().requires_grad_(True)
        aux, d = loss.terms(hp, mask)
        assert float(aux) == pytest.approx(float(make_aux_loss(name)(valid)), rel=1e-12)
        assert float(d) == pytest.approx(float(dispersion(valid)), rel=1e-12)
        aux.backward()
        assert torch.all(hp.grad[1, 6:] == 0) and hp.grad.abs().sum() > 0  # pads: no gradient
        # a seeded token sample, the same stream as push-away's
        a, b = make_aux_loss(name, max_tokens=7, seed=2), make_aux_loss("push-away", max_tokens=7, seed=2)
        _, da = a.terms(h, mask)
        assert float(da) == pytest.approx(-float(b(h, mask)), rel=1e-12)
        assert a.calls == 1
    one = torch.randn(1, 1, 5, dtype=torch.float64)  # one token: degenerate, zero, counted
    loss = make_aux_loss("hinge-cos")
    assert float(loss(one)) == 0.0 and loss.n_degenerate == 1

