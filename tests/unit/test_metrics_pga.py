"""Subspace PGA against a slow, obviously-correct scipy reference, plus planted geometry,
invariances, determinism and typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from support.pga import anisotropic, reference_pga

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError

# ---------------------------------------------------------------- reference ---------------


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    n, d, k = 120, 30, 6
    X = anisotropic(rng, n, d)
    W = rng.standard_normal((400, d)) * np.geomspace(0.3, 3.0, d)
    return X, M.readout_basis(W, k)


# ---------------------------------------------------------------- agreement ---------------


@pytest.mark.parametrize("m", [0, 1, 4])
def test_exact_mode_matches_scipy_reference(data, m):
    X, V = data
    res = M.subspace_pga(X, V, n_null=15, ccr=m, seed=5)
    z, rho, null = reference_pga(X, V, n_null=15, ccr=m, seed=5)
    assert res.exact and res.pairs == X.shape[0] * (X.shape[0] - 1) // 2
    assert res.rho_readout == pytest.approx(rho, abs=1e-12)
    np.testing.assert_allclose(res.null, null, rtol=0, atol=1e-12)
    assert res.z == pytest.approx(z, abs=1e-9)
    assert res.null_std == pytest.approx(null.std(ddof=1), abs=1e-12)
    assert res.p_value == pytest.approx((1 + np.sum(null >= rho)) / (1 + null.size))


@pytest.mark.parametrize("pairs", [300, 2500])
def test_sampled_mode_matches_scipy_reference(data, pairs):
    X, V = data
    res = M.subspace_pga(X, V, n_null=12, ccr=1, pairs=pairs, seed=2, precision="float64")
    z, _rho, null = reference_pga(X, V, n_null=12, ccr=1, seed=2, pairs=pairs)
    assert not res.exact and res.pairs == pairs and res.precision == "float64"
    np.testing.assert_allclose(res.null, null, rtol=0, atol=1e-12)
    assert res.z == pytest.approx(z, abs=1e-9)


def test_every_sampled_distance_path_agrees(data, monkeypatch):
    from lmgeom.metrics import _pairs

    X, V = data
    Xd = X.copy()
    Xd[5] = Xd[9]
    ref = reference_pga(Xd, V, n_null=4, ccr=1, seed=6, pairs=400)
    got = {}
    for path in ("sddmm", "rowdot"):
        if path == "rowdot":
            monkeypatch.setattr(_pairs, "_sddmm_available", lambda: False)
        plan = _pairs.make_plan(120, 400, 6)
        assert _pairs.build_layout(plan, None, 120).kind == path
        got[path] = M.subspace_pga(Xd, V, n_null=4, ccr=1, seed=6, pairs=400, precision="float64")
        assert got[path].z == pytest.approx(ref[0], abs=1e-9)
    monkeypatch.setattr(_pairs, "_GRAM_FACTOR", 10_000)  # force Gram blocks
    gram = M.subspace_pga(Xd, V, n_null=4, ccr=1, seed=6, pairs=400, precision="float64")
    assert gram.z == pytest.approx(ref[0], abs=1e-9)


def test_ties_from_duplicate_rows_match_reference():
    rng = np.random.default_rng(3)
    X = anisotropic(rng, 60, 12)
    X[10] = X[3]
    X[20] = X[3]
    X[41] = X[40]
    X[59] = X[0]
    V = np.linalg.qr(rng.standard_normal((12, 4)))[0]
    for pairs in (None, 700):
        res = M.subspace_pga(X, V, n_null=10, ccr=1, seed=1, pairs=pairs, precision="float64")
        z, rho, _null = reference_pga(X, V, n_null=10, ccr=1, seed=1, pairs=pairs)
        assert res.n_unique == 56
        assert res.rho_readout == pytest.approx(rho, abs=1e-12)
        assert res.z == pytest.approx(z, abs=1e-9)


def test_heavy_ties_in_projection_match_reference():
    # Rows differing only outside the readout coordinates project onto the same point.
    rng = np.random.default_rng(8)
    base = rng.standard_normal((12, 3))
    X = np.zeros((48, 10))
    X[:, :3] = np.repeat(base, 4, axis=0)
    X[:, 3:] = rng.standard_normal((48, 7)) * 0.5
    V = np.eye(10)[:, :3]
    res = M.subspace_pga(X, V, n_null=8, ccr=0, seed=4)
    z, rho, _null = reference_pga(X, V, n_null=8, ccr=0, seed=4)
    assert res.rho_readout == pytest.approx(rho, abs=1e-10)
    assert res.z == pytest.approx(z, abs=1e-8)


def test_sampled_mode_agrees_with_exact_mode():
    rng = np.random.default_rng(21)
    n, d, k = 300, 40, 8
    V = np.eye(d)[:, :k]
    Z = rng.standard_normal((n, k)) * 3.0
    X = np.hstack([Z, rng.standard_normal((n, d - k))])
    exact = M.subspace_pga(X, V, n_null=30, ccr=0, seed=0)
    sampled = M.subspace_pga(X, V, n_null=30, ccr=0, seed=0, pairs=20_000)
    assert exact.z > 10
    assert sampled.z == pytest.approx(exact.z, rel=0.15)
    assert sampled.rho_readout == pytest.approx(exact.rho_readout, abs=0.02)


def test_sampled_float32_frames_agree_with_float64(data):
    X, V = data
    fast = M.subspace_pga(X, V, n_null=20, seed=0, pairs=3000)
    slow = M.subspace_pga(X, V, n_null=20, seed=0, pairs=3000, precision="float64")
    assert fast.precision == "float32" and slow.precision == "float64"
    np.testing.assert_allclose(fast.null, slow.null, atol=1e-4)
    assert fast.z == pytest.approx(slow.z, abs=1e-2)
    assert M.subspace_pga(X, V, n_null=3).precision == "float64"  # exact mode
    with pytest.raises(ConfigError, match="precision"):
        M.subspace_pga(X, V, n_null=3, precision="float16")


def test_pairs_at_least_all_pairs_means_exact(data):
    X, V = data
    P = X.shape[0] * (X.shape[0] - 1) // 2
    a = M.subspace_pga(X, V, n_null=4, pairs=P + 10)
    b = M.subspace_pga(X, V, n_null=4)
    assert a.exact and a.pairs == P
    np.testing.assert_array_equal(a.null, b.null)


# ---------------------------------------------------------------- planted geometry --------


def test_states_in_readout_subspace_give_large_positive_z():
    rng = np.random.default_rng(100)
    n, d, k = 200, 48, 8
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    X = rng.standard_normal((n, k)) @ V.T * 5.0 + 0.3 * rng.standard_normal((n, d))
    res = M.subspace_pga(X, V, n_null=20, ccr=0, seed=0)
    assert res.rho_readout > 0.99 > res.null.max()
    assert res.z > 3
    assert res.p_value == pytest.approx(1 / 21)
    assert res.null_z_low < 0 < res.null_z_high


def test_ccr_restores_alignment_hidden_by_dominant_orthogonal_directions():
    rng = np.random.default_rng(1)
    n, d, k, m = 240, 40, 8, 3
    V = np.eye(d)[:, :k]
    centres = rng.standard_normal((6, k)) * 3.0
    X = np.zeros((n, d))
    X[:, :k] = centres[rng.integers(0, 6, n)] + 0.5 * rng.standard_normal((n, k))
    X[:, k:k + m] = rng.standard_normal((n, m)) * np.array([40.0, 30.0, 25.0])  # dominant, orthogonal
    X[:, k + m:] = 0.3 * rng.standard_normal((n, d - k - m))
    r0 = M.subspace_pga(X, V, n_null=20, ccr=0, seed=0)
    rm = M.subspace_pga(X, V, n_null=20, ccr=m, seed=0)
    assert r0.z < -5.0  # random frames catch the dominant directions, the readout cannot
    assert rm.z > 2.0 and rm.rho_readout > rm.null.max()


def test_random_basis_gives_z_near_zero():
    rng = np.random.default_rng(5)
    X = anisotropic(rng, 150, 30)
    zs = [
        M.subspace_pga(X, np.linalg.qr(rng.standard_normal((30, 5)))[0], n_null=25, seed=s).z
        for s in range(4)
    ]
    assert abs(float(np.mean(zs))) < 2.0


# ---------------------------------------------------------------- invariances ----------


def test_rotating_states_and_basis_together(data):
    X, V = data
    rng = np.random.default_rng(9)
    R = np.linalg.qr(rng.standard_normal((X.shape[1], X.shape[1])))[0]
    a = M.subspace_pga(X, V, n_null=30, seed=3)
    b = M.subspace_pga(X @ R, R.T @ V, n_null=30, seed=3)
    # distances in the full and readout spaces are unchanged -> rho_readout exactly;
    # the null frames are fixed matrices, so the null differs only by sampling.
    assert b.rho_readout == pytest.approx(a.rho_readout, abs=1e-10)
    assert abs(b.z - a.z) < 4 * max(1.0, 0.2 * abs(a.z))


@pytest.mark.parametrize("factor", [1e-3, 7.0, 1e4])
def test_scaling_and_translating_states_leaves_z_unchanged(data, factor):
    X, V = data
    a = M.subspace_pga(X, V, n_null=10, seed=1)
    b = M.subspace_pga(X * factor + 123.0, V, n_null=10, seed=1)
    assert b.z == pytest.approx(a.z, abs=1e-7)


def test_permuting_texts_leaves_z_unchanged(data):
    X, V = data
    perm = np.random.default_rng(0).permutation(X.shape[0])
    a = M.subspace_pga(X, V, n_null=10, seed=1)
    b = M.subspace_pga(X[perm], V, n_null=10, seed=1)
    assert b.z == pytest.approx(a.z, abs=1e-9)


# ---------------------------------------------------------------- determinism ----------


def test_same_seed_bit_identical_and_seed_changes_null_only_statistically(data):
    X, V = data
    a = M.subspace_pga(X, V, n_null=20, seed=7, pairs=3000)
    b = M.subspace_pga(X, V, n_null=20, seed=7, pairs=3000)
    assert a.z == b.z and np.array_equal(a.null, b.null)
    c = M.subspace_pga(X, V, n_null=20, seed=8, pairs=3000)
    assert not np.array_equal(a.null, c.null)
    assert abs(c.z - a.z) < 5 * max(1.0, 0.25 * abs(a.z))


def test_worker_threads_do_not_change_results():
    rng = np.random.default_rng(2)
    X = anisotropic(rng, 200, 20)
    V = np.linalg.qr(rng.standard_normal((20, 4)))[0]
    one = M.subspace_pga(X, V, n_null=6, workers=1)
    two = M.subspace_pga(X, V, n_null=6, workers=2)
    np.testing.assert_allclose(two.null, one.null, rtol=0, atol=1e-13)


def test_torch_engine_matches_numpy_engine(data):
    import torch
    X, V = data
    Xd = X.copy()
    Xd[7] = Xd[2]
    for pairs in (None, 900, 3000):  # exact with duplicates, per-pair dots, Gram blocks
        a = M.subspace_pga(Xd, V, n_null=6, seed=3, pairs=pairs, precision="float64")
        b = M.subspace_pga(torch.tensor(Xd), torch.tensor(V), n_null=6, seed=3, pairs=pairs,
                           device=torch.device("cpu"))
        assert b.precision == "float64"
        np.testing.assert_allclose(b.null, a.null, rtol=0, atol=1e-12)
        assert b.z == pytest.approx(a.z, abs=1e-9)


def test_device_and_worker_options(data):
    import torch
    X, V = data
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda"):
            M.subspace_pga(X, V, n_null=3, device="cuda")
    with pytest.raises(ConfigError, match="device"):
        M.subspace_pga(X, V, n_null=3, device="no-such-device")
    with pytest.raises(ConfigError, match="workers"):
        M.subspace_pga(X, V, n_null=3, workers=0)
    a = M.cross_model_alignment(X, X[:, ::-1], V, V[::-1], n_null=4, seed=1)
    b = M.cross_model_alignment(X, X[:, ::-1], V, V[::-1], n_null=4, seed=1,
                                device=torch.device("cpu"))
    assert b.z == pytest.approx(a.z, abs=1e-9)
    assert a.rho_full == pytest.approx(1.0) and a.rho_readout == pytest.approx(1.0)


def test_accepts_torch_half_precision_input(data):
    import torch
    X, V = data
    res = M.subspace_pga(torch.tensor(X, dtype=torch.bfloat16), V, n_null=4)
    assert np.isfinite(res.z)


def test_result_is_frozen_and_reports_settings(data):
    X, V = data
    res = M.subspace_pga(X, V, n_null=5, ccr=2, seed=4, pairs=1000)
    assert (res.k, res.n_null, res.ccr, res.seed, res.n, res.d) == (6, 5, 2, 4, 120, 30)
    assert res.null.shape == (5,) and not res.null.flags.writeable
    with pytest.raises(AttributeError):
        res.z = 0.0  # type: ignore[misc]
    row = res.to_dict()
    assert "null" not in row and row["pairs"] == 1000 and row["exact"] is False


# ---------------------------------------------------------------- errors ---------------


def test_option_errors(data):
    X, V = data
    with pytest.raises(ConfigError, match="n_null"):
        M.subspace_pga(X, V, n_null=1)
    for bad in (0, -3):
        with pytest.raises(ConfigError, match="pairs"):
            M.subspace_pga(X, V, pairs=bad)
    with pytest.raises(ConfigError, match="k=30"):
        M.subspace_pga(X, np.eye(30), n_null=3)
    with pytest.raises(ConfigError, match="k=0"):
        M.subspace_pga(X, np.zeros((30, 0)), n_null=3)
    with pytest.raises(ConfigError, match="orthonormal"):
        M.subspace_pga(X, V * 2.0, n_null=3)
    with pytest.raises(ConfigError, match="rows"):
        M.subspace_pga(X, V[:-1], n_null=3)
    with pytest.raises(ConfigError, match="CCR-30"):
        M.subspace_pga(X, V, ccr=30, n_null=3)
    with pytest.raises(ConfigError, match="ccr"):
        M.subspace_pga(X, V, ccr=-1, n_null=3)
    with pytest.raises(ConfigError, match="seed"):
        M.subspace_pga(X, V, seed=-1, n_null=3)


def test_ccr_beyond_numerical_rank_is_a_config_error():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 2)) @ rng.standard_normal((2, 12))  # rank 2 after centring
    V = np.linalg.qr(rng.standard_normal((12, 3)))[0]
    with pytest.raises(ConfigError, match="numerical rank 2"):
        M.subspace_pga(X, V, ccr=2, n_null=3)


def test_data_errors_are_actionable(data):
    X, V = data
    with pytest.raises(DataError, match="at least 4"):
        M.subspace_pga(X[:3], V, n_null=3)
    Xn = X.copy()
    Xn[4, 2] = np.nan
    Xn[9, :3] = np.inf
    with pytest.raises(DataError, match=r"1 NaN and 3 Inf.*2 of 120 rows.*float16 overflow"):
        M.subspace_pga(Xn, V, n_null=3, label="layer 12")
    with pytest.raises(DataError, match="^layer 12: "):
        M.subspace_pga(Xn, V, n_null=3, label="layer 12")
    with pytest.raises(DataError, match="identical texts"):
        M.subspace_pga(np.tile(X[:1], (10, 1)), V, n_null=3)  # identical texts
    a, b = X[0] - X.mean(0), X[1] - X.mean(0)
    sym = np.stack([a, -a, b, -b, np.zeros_like(a)]) + 5.0  # last row is the mean
    with pytest.raises(DataError, match=r"1 of 5 rows have zero norm.*rows 4"):
        M.subspace_pga(sym, V, ccr=0, n_null=3)
    with pytest.raises(DataError, match="2-D"):
        M.subspace_pga(X[0], V, n_null=3)


def test_state_orthogonal_to_readout_is_a_data_error():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 6))
    R = rng.standard_normal((20, 2))
    R[5] = 0.0
    R[6] = -(R.sum(0) - R[6])  # columns sum to zero, so centring leaves row 5 at 0 there
    X[:, :2] = R
    V = np.eye(6)[:, :2]
    with pytest.raises(DataError, match=r"1 of 20 rows have zero norm in the readout.*rows 5"):
        M.subspace_pga(X, V, ccr=0, n_null=3)


# ---------------------------------------------------------------- building blocks ------


def test_null_frames_are_sign_fixed_qr_of_gaussians():
    frames = M.null_frames(9, 4, n_null=3, seed=12)
    rng = np.random.default_rng(12)
    for Q in frames:
        G = rng.standard_normal((9, 4))
        R = Q.T @ G  # = R of the sign-fixed QR
        np.testing.assert_allclose(Q.T @ Q, np.eye(4), atol=1e-12)
        np.testing.assert_allclose(np.tril(R, -1), 0, atol=1e-12)
        assert np.all(np.diag(R) > 0)
        np.testing.assert_allclose(Q @ R, G, atol=1e-12)
    np.testing.assert_array_equal(frames, M.null_frames(9, 4, n_null=3, seed=12))


def test_sample_pairs_distinct_lower_triangle_and_reproducible():
    i, j = M.sample_pairs(50, 400, seed=3)
    assert i.size == 400 and np.all(j < i) and np.all(j >= 0) and np.all(i < 50)
    p = i * (i - 1) // 2 + j
    assert np.unique(p).size == 400 and np.all(np.diff(p) > 0)
    i2, j2 = M.sample_pairs(50, 400, seed=3)
    assert np.array_equal(i, i2) and np.array_equal(j, j2)
    ia, ja = M.sample_pairs(2000, 5000, seed=0)
    assert np.all(ja < ia) and np.all(ia < 2000)


def test_ccr_matches_its_formula_and_keeps_duplicates_identical():
    rng = np.random.default_rng(4)
    X = anisotropic(rng, 40, 15)
    X[7] = X[1]
    Xc = X - X.mean(0)
    _, _, Vt = np.linalg.svd(Xc, full_matrices=False)
    for m in (0, 1, 3):
        P = Vt[:m]
        np.testing.assert_allclose(M.ccr(X, m), Xc - Xc @ P.T @ P, atol=1e-10)
        out = M.ccr(X, m)
        assert np.array_equal(out[7], out[1])
    wide = rng.standard_normal((6, 30))  # N < d: the N x N Gram path
    Wc = wide - wide.mean(0)
    _, _, Vt = np.linalg.svd(Wc, full_matrices=False)
    np.testing.assert_allclose(M.ccr(wide, 2), Wc - Wc @ Vt[:2].T @ Vt[:2], atol=1e-10)


def test_readout_basis_matches_svd():
    rng = np.random.default_rng(6)
    W = rng.standard_normal((300, 20)) * np.geomspace(5, 0.5, 20)
    B = M.readout_basis(W, 5)
    _, _, Vt = np.linalg.svd(W, full_matrices=False)
    np.testing.assert_allclose(B @ B.T, Vt[:5].T @ Vt[:5], atol=1e-10)
    np.testing.assert_allclose(np.abs(B), np.abs(Vt[:5].T), atol=1e-10)
    assert np.all(B[np.argmax(np.abs(B), axis=0), np.arange(5)] > 0)
    g = rng.uniform(0.5, 2.0, 20)
    Bg = M.readout_basis(W, 5, gain=g)
    _, _, Vg = np.linalg.svd(W * g, full_matrices=False)
    np.testing.assert_allclose(Bg @ Bg.T, Vg[:5].T @ Vg[:5], atol=1e-10)
    with pytest.raises(ConfigError, match="k=20"):
        M.readout_basis(W, 20)
    with pytest.raises(ConfigError):
        M.readout_basis(W, 0)


def test_readout_basis_accepts_torch_bfloat16():
    import torch
    rng = np.random.default_rng(6)
    W = rng.standard_normal((100, 16))
    Wt = torch.tensor(W, dtype=torch.bfloat16)
    B = M.readout_basis(Wt, 4)
    ref = M.readout_basis(Wt.float().numpy(), 4)
    np.testing.assert_allclose(B, ref, atol=1e-10)


def test_pc1_readout_share():
    rng = np.random.default_rng(3)
    n, d, k = 300, 20, 4
    V = np.eye(d)[:, :k]
    X = 0.1 * rng.standard_normal((n, d))
    X[:, 1] += 10 * rng.standard_normal(n)  # PC1 inside the readout
    r = M.pc1_readout_share(X, V)
    assert r.share > 0.99 and r.baseline == k / d and r.evr > 0.9
    X2 = 0.1 * rng.standard_normal((n, d))
    X2[:, 10] += 10 * rng.standard_normal(n)  # PC1 orthogonal to it
    r2 = M.pc1_readout_share(X2, V)
    assert r2.share < 0.01
    with pytest.raises(DataError, match="zero variance"):
        M.pc1_readout_share(np.ones((5, d)), V)


def test_memoised_null_frames_are_bit_identical_to_fresh_ones(data, monkeypatch):
    """The frame cache (one QR set reused across layers and CCR levels) changes no bit: a cache
    hit, a miss and a run with the cache off (LMGEOM_FRAME_CACHE_MB=0) give identical nulls."""
    from lmgeom.metrics import geometry as G

    X, V = data
    G.clear_frame_cache()
    miss = M.subspace_pga(X, V, n_null=12, ccr=1, seed=5)
    assert (X.shape[1], V.shape[1], 12, 5) in G._FRAME_CACHE
    hit = M.subspace_pga(X, V, n_null=12, ccr=1, seed=5)
    monkeypatch.setenv("LMGEOM_FRAME_CACHE_MB", "0")
    G.clear_frame_cache()
    off = M.subspace_pga(X, V, n_null=12, ccr=1, seed=5)
    assert not G._FRAME_CACHE
    np.testing.assert_array_equal(miss.null, hit.null)
    np.testing.assert_array_equal(miss.null, off.null)
    monkeypatch.delenv("LMGEOM_FRAME_CACHE_MB")
    # a cached prefix of another length is not confused with this one, and frames match the
    # documented generator order
    rng = np.random.default_rng(5)
    fresh = np.stack([G.random_frame(rng, X.shape[1], V.shape[1]) for _ in range(3)])
    np.testing.assert_array_equal(M.null_frames(X.shape[1], V.shape[1], n_null=3, seed=5), fresh)
    with pytest.raises(ValueError):
        next(iter(G.cached_frames(X.shape[1], V.shape[1], 3, 5)))[0, 0] = 1.0  # read-only
