"""Dispersion: O(n d) identity vs the explicit O(n^2) definition, torch autograd, gap, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist, pdist

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError


def explicit_dispersion(H):
    return float(np.mean(pdist(H, "cosine")))  # mean over i<j == mean over i != j


def explicit_between(A, B):
    return float(np.mean(cdist(A, B, "cosine")))


@pytest.mark.parametrize("n,d", [(2, 3), (7, 5), (64, 16), (300, 40)])
def test_dispersion_equals_pairwise_definition(n, d):
    rng = np.random.default_rng(n)
    H = rng.standard_normal((n, d)) + rng.uniform(-2, 2, d)
    assert M.dispersion(H) == pytest.approx(explicit_dispersion(H), abs=1e-12)


def test_dispersion_explicit_loop_small():
    rng = np.random.default_rng(1)
    H = rng.standard_normal((6, 4))
    total, count = 0.0, 0
    for i in range(6):
        for j in range(6):
            if i != j:
                total += 1 - H[i] @ H[j] / np.linalg.norm(H[i]) / np.linalg.norm(H[j])
                count += 1
    assert M.dispersion(H) == pytest.approx(total / count, abs=1e-13)


def test_dispersion_known_values():
    rng = np.random.default_rng(2)
    v = rng.standard_normal(8)
    assert M.dispersion(np.outer(rng.uniform(1, 5, 10), v)) == pytest.approx(0.0, abs=1e-12)
    x = rng.standard_normal((5, 8))
    assert M.dispersion(np.vstack([x, -x])) == pytest.approx(10 / 9, abs=1e-12)
    assert M.dispersion(np.eye(6)) == pytest.approx(1.0, abs=1e-12)


def test_dispersion_between_equals_pairwise_definition():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((13, 7)) + 1.0
    B = rng.standard_normal((29, 7)) - 0.5
    assert M.dispersion_between(A, B) == pytest.approx(explicit_between(A, B), abs=1e-12)
    assert M.dispersion_between(A[:1], B[:1]) == pytest.approx(explicit_between(A[:1], B[:1]))


def test_dispersion_gap_on_constructed_case():
    rng = np.random.default_rng(4)
    W = rng.standard_normal((50, 6))
    dom, gen = [3, 7, 11, 19], [0, 1, 2, 40, 41]
    g = M.dispersion_gap(W, dom, gen)
    assert g.within == pytest.approx(explicit_dispersion(W[dom]), abs=1e-12)
    assert g.between == pytest.approx(explicit_between(W[dom], W[gen]), abs=1e-12)
    assert g.gap == pytest.approx(g.within + g.between) and float(g) == g.gap
    assert (g.n_domain, g.n_general, g.variant) == (4, 5, "W_U")
    # domain rows collinear and orthogonal to the general rows: D(T) = 0, D(T, T̄) = 1
    W2 = np.zeros((6, 4))
    W2[:3, 0] = [1.0, 2.0, 3.0]
    W2[3:, 1:] = rng.standard_normal((3, 3))
    g2 = M.dispersion_gap(W2, [0, 1, 2], [3, 4, 5])
    assert g2.within == pytest.approx(0.0, abs=1e-12) and g2.between == pytest.approx(1.0)
    s = M.dispersion_gap_states(W[dom], W[gen])
    assert s.gap == pytest.approx(g.gap) and s.variant == "states"


def test_dispersion_gap_accepts_torch_weights():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((30, 5))
    a = M.dispersion_gap(torch.tensor(W, dtype=torch.float32), [1, 2, 3], [4, 5])
    b = M.dispersion_gap(W.astype(np.float32), [1, 2, 3], [4, 5])
    assert a.gap == pytest.approx(b.gap, abs=1e-12)


def test_torch_in_torch_out_and_differentiable():
    rng = np.random.default_rng(6)
    H = rng.standard_normal((40, 12))
    t = torch.tensor(H, requires_grad=True)
    D = M.dispersion(t)
    assert isinstance(D, torch.Tensor) and D.dtype == torch.float64 and D.ndim == 0
    assert float(D.detach()) == pytest.approx(M.dispersion(H), abs=1e-12)
    D.backward()
    assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
    # gradient matches a finite difference
    eps = 1e-6
    E = np.zeros_like(H)
    E[3, 4] = eps
    fd = (M.dispersion(H + E) - M.dispersion(H - E)) / (2 * eps)
    assert float(t.grad[3, 4]) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    f32 = torch.tensor(H, dtype=torch.float32)
    assert M.dispersion(f32).dtype == torch.float32
    a = torch.tensor(H[:20], requires_grad=True)
    between = M.dispersion_between(a, torch.tensor(H[20:]))
    between.backward()
    assert float(between.detach()) == pytest.approx(explicit_between(H[:20], H[20:]), abs=1e-12)
    assert torch.isfinite(a.grad).all()


def test_dispersion_errors():
    rng = np.random.default_rng(7)
    with pytest.raises(DataError, match="at least 2"):
        M.dispersion(rng.standard_normal((1, 4)))
    Z = rng.standard_normal((5, 4))
    Z[2] = 0.0
    with pytest.raises(DataError, match=r"1 of 5 rows with zero norm \(rows 2\).*padding"):
        M.dispersion(Z)
    N = rng.standard_normal((5, 4))
    N[1, 1] = np.nan
    with pytest.raises(DataError, match="1 NaN"):
        M.dispersion(N)
    with pytest.raises(DataError, match="zero norm"):
        M.dispersion(torch.tensor(Z))
    with pytest.raises(DataError, match="1 NaN"):
        M.dispersion(torch.tensor(N))
    with pytest.raises(DataError, match="at least 2"):
        M.dispersion(torch.zeros(1, 3) + 1)
    with pytest.raises(DataError, match="d=4"):
        M.dispersion_between(rng.standard_normal((3, 4)), rng.standard_normal((3, 5)))
    W = rng.standard_normal((10, 3))
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        M.dispersion_gap(W, [1, 2, 10], [3])
    with pytest.raises(ConfigError, match="at least 2"):
        M.dispersion_gap(W, [1], [3])
    with pytest.raises(ConfigError, match="integer"):
        M.dispersion_gap(W, [1.5, 2.0], [3])
