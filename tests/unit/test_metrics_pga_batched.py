"""The batched null loop: ``subspace_pga_levels`` against per-level ``subspace_pga`` and the
explicit scipy loop, the torch path against the CPU kernel, the float32 tolerance, and the
CPU worker's two layouts (one Gram matrix, weighted or not; blocked distance vectors)."""

from __future__ import annotations

import numpy as np
import pytest
from support.metrics_pga_batched import layer  # noqa: F401 (fixtures)
from support.pga import anisotropic, reference_pga

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError


@pytest.mark.parametrize("pairs", [None, 2500, 700])
@pytest.mark.parametrize("precision", ["auto", "float64"])
def test_levels_equal_per_level_subspace_pga(layer, pairs, precision):
    X, V = layer
    if precision == "auto" and pairs is not None:
        pytest.skip("float32 frames: see test_float32_levels_within_documented_tolerance")
    got = M.subspace_pga_levels(X, V, ccr=(5, 0, 1, 3), n_null=14, pairs=pairs, seed=3,
                                precision=precision)
    assert list(got) == [0, 1, 3, 5]
    for m, r in got.items():
        one = M.subspace_pga(X, V, ccr=m, n_null=14, pairs=pairs, seed=3, precision=precision)
        assert (r.ccr, r.pairs, r.exact, r.n_unique, r.precision) == (
            m, one.pairs, one.exact, one.n_unique, one.precision)
        assert r.rho_readout == pytest.approx(one.rho_readout, abs=1e-12)
        np.testing.assert_allclose(r.null, one.null, rtol=0, atol=1e-12)
        assert r.z == pytest.approx(one.z, abs=1e-9)
        assert r.p_value == one.p_value


@pytest.mark.parametrize("pairs", [None, 900])
def test_levels_match_the_explicit_scipy_loop(layer, pairs):
    X, V = layer
    got = M.subspace_pga_levels(X, V, ccr=(0, 2, 4), n_null=10, pairs=pairs, seed=8,
                                precision="float64")
    for m, r in got.items():
        z, rho, null = reference_pga(X, V, n_null=10, ccr=m, seed=8, pairs=pairs)
        assert r.rho_readout == pytest.approx(rho, abs=1e-12)
        np.testing.assert_allclose(r.null, null, rtol=0, atol=1e-12)
        assert r.z == pytest.approx(z, abs=1e-9)


def test_single_level_and_int_ccr(layer):
    X, V = layer
    a = M.subspace_pga_levels(X, V, ccr=2, n_null=6, seed=1)
    b = M.subspace_pga(X, V, ccr=2, n_null=6, seed=1)
    assert list(a) == [2]
    np.testing.assert_array_equal(a[2].null, b.null)


def test_torch_cpu_path_matches_the_kernel(layer):
    import torch

    X, V = layer
    for pairs in (None, 900, 3000):
        a = M.subspace_pga_levels(X, V, ccr=(0, 1, 4), n_null=8, seed=2, pairs=pairs,
                                  precision="float64")
        b = M.subspace_pga_levels(torch.tensor(X), torch.tensor(V), ccr=(0, 1, 4), n_null=8,
                                  seed=2, pairs=pairs, device=torch.device("cpu"))
        for m in a:
            assert b[m].precision == "float64"
            np.testing.assert_allclose(b[m].null, a[m].null, rtol=0, atol=1e-12)
            assert b[m].z == pytest.approx(a[m].z, abs=1e-9)


def test_batch_size_does_not_change_results(layer, monkeypatch):
    from lmgeom.metrics import pga

    X, V = layer
    a = M.subspace_pga_levels(X, V, n_null=7, seed=4)
    monkeypatch.setattr(pga, "_BATCH_FRAMES", 3)
    b = M.subspace_pga_levels(X, V, n_null=7, seed=4, workers=2)
    for m in a:
        np.testing.assert_allclose(b[m].null, a[m].null, rtol=0, atol=1e-13)


def test_levels_errors(layer):
    X, V = layer
    with pytest.raises(ConfigError, match="at least one CCR level"):
        M.subspace_pga_levels(X, V, ccr=())
    with pytest.raises(ConfigError, match="ccr"):
        M.subspace_pga_levels(X, V, ccr=(0, -1))
    with pytest.raises(ConfigError, match="iterable"):
        M.subspace_pga_levels(X, V, ccr=1.5)
    with pytest.raises(ConfigError, match="CCR-40"):
        M.subspace_pga_levels(X, V, ccr=(0, 40), n_null=3)
    with pytest.raises(ConfigError, match="n_null"):
        M.subspace_pga_levels(X, V, n_null=1)
    with pytest.raises(DataError, match="^layer 3: "):
        M.subspace_pga_levels(X[:3], V, n_null=3, label="layer 3")


def test_ccr_levels_match_ccr(layer):
    X, _ = layer
    lv = M.geometry.ccr_levels(X, (0, 1, 3))
    for m in (0, 1, 3):
        np.testing.assert_allclose(lv.residuals[m], M.ccr(X, m), atol=1e-12)
    np.testing.assert_array_equal(M.geometry.ccr_levels(X, (3,)).residuals[3], M.ccr(X, 3))
    np.testing.assert_allclose(lv.residuals[0] - lv.residuals[3],
                               np.ldexp(lv.coefficients @ lv.directions, lv.exponent), atol=1e-10)


@pytest.mark.parametrize("gram", ["syrk", "gemm"])
@pytest.mark.parametrize("dups", [False, True, "heavy"])
def test_gram_layout_equals_distance_vectors_and_the_scipy_loop(dups, gram, monkeypatch):
    """n > 256: the Gram matrix is computed in row blocks (GEMM) or by one SYRK; with
    duplicate rows, of the unique rows ("heavy": 280 of 300 rows copies of 20, so the distinct
    Gram entries are ranked with their multiplicities). The Gram layout and the blocked
    distance vectors (GRAM_BYTES = 0) give the same nulls, bit for bit, and both equal the
    explicit scipy loop."""
    from lmgeom.metrics import _cpu_worker as cw

    if gram == "gemm":
        monkeypatch.setattr(cw, "_syrk_functions", lambda: None)
    else:
        assert cw._syrk_functions() is not None
    rng = np.random.default_rng(23)
    n, d, k = 300, 20, 4
    X = anisotropic(rng, n, d)
    X[:, 0] += 25.0 * rng.standard_normal(n)
    if dups == "heavy":
        X[20:] = X[rng.integers(0, 20, n - 20)]
    elif dups:
        X[250:270] = X[10:30]
        X[299] = X[0]
    V = M.readout_basis(rng.standard_normal((200, d)), k)
    calls, weighted = [], []
    real, real_w = cw.CpuWorker._gram_rho, cw.SpearmanKernel.weighted
    monkeypatch.setattr(cw.CpuWorker, "_gram_rho",
                        lambda self, *a: calls.append(1) or real(self, *a))
    monkeypatch.setattr(cw.SpearmanKernel, "weighted",
                        lambda self, *a: weighted.append(1) or real_w(self, *a))
    kw = {"ccr": (0, 1, 3), "n_null": 6, "seed": 4, "precision": "float64"}
    got = M.subspace_pga_levels(X, V, **kw)
    assert len(calls) == 18  # every level of every frame through the Gram layout
    assert len(weighted) == (18 if dups == "heavy" else 0)
    monkeypatch.setattr(cw, "GRAM_BYTES", 0)
    vec = M.subspace_pga_levels(X, V, **kw)
    assert len(calls) == 18
    for m in (0, 1, 3):
        np.testing.assert_allclose(got[m].null, vec[m].null, rtol=0, atol=2e-16)
        assert got[m].rho_readout == vec[m].rho_readout
    z, rho, null = reference_pga(X, V, n_null=6, ccr=1, seed=4)
    assert got[1].rho_readout == pytest.approx(rho, abs=1e-12)
    np.testing.assert_allclose(got[1].null, null, rtol=0, atol=1e-12)
    assert got[1].z == pytest.approx(z, abs=1e-9)


def test_float32_near_duplicate_rows_stay_on_the_kernel(monkeypatch):
    """float32 unit rows of near-duplicates can have cos = 1 + 1 ulp (distance -1.2e-7): the
    kernel clamps such keys instead of declining, so every level of every frame is ranked
    by it; z stays within the float32 tolerance of the float64 result."""
    from lmgeom.metrics import _cpu_worker as cw

    rng = np.random.default_rng(41)
    n, d, k = 300, 24, 5
    X = rng.standard_normal((n, d)) * np.linspace(3, 0.2, d)
    X[150:] = X[:150] + 1e-5 * rng.standard_normal((150, d))
    V = M.readout_basis(rng.standard_normal((100, d)), k)
    got = []
    real = cw.SpearmanKernel.numerator
    monkeypatch.setattr(cw.SpearmanKernel, "numerator",
                        lambda self, *a: got.append(real(self, *a)) or got[-1])
    f32 = M.subspace_pga_levels(X, V, ccr=(0, 1, 3), n_null=6, seed=4, precision="float32")
    assert len(got) >= 6 * 3 and all(isinstance(r, tuple) for r in got)
    f64 = M.subspace_pga_levels(X, V, ccr=(0, 1, 3), n_null=6, seed=4, precision="float64")
    for m in (0, 1, 3):
        np.testing.assert_allclose(f32[m].null, f64[m].null, rtol=0, atol=1e-4)

