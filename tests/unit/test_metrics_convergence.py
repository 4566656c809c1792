"""Cross-model alignment: identities, rotated copies, planted shared readout structure, and
agreement with a pdist + spearmanr reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

import lmgeom.metrics as M
from lmgeom.errors import ConfigError, DataError


def model(rng, n, d, k):
    X = rng.standard_normal((n, d)) * np.geomspace(3, 0.3, d) + rng.standard_normal(d)
    V = np.linalg.qr(rng.standard_normal((d, k)))[0]
    return X, V


def test_identical_models_agree_perfectly_in_every_space():
    rng = np.random.default_rng(0)
    X, V = model(rng, 80, 20, 5)
    r = M.cross_model_alignment(X, X, V, V, n_null=8, seed=1)
    assert r.rho_full == pytest.approx(1.0, abs=1e-12)
    assert r.rho_readout == pytest.approx(1.0, abs=1e-12)
    assert np.all(r.null < 1.0)  # independent frames per model
    assert r.z > 0 and r.p_value == pytest.approx(1 / 9)


def test_rotated_copy_gives_the_same_readout_result():
    rng = np.random.default_rng(1)
    Xa, Va = model(rng, 70, 16, 4)
    Xb, Vb = model(rng, 70, 24, 6)
    R = np.linalg.qr(rng.standard_normal((24, 24)))[0]
    base = M.cross_model_alignment(Xa, Xb, Va, Vb, n_null=10, seed=2)
    rot = M.cross_model_alignment(Xa, Xb @ R, Va, R.T @ Vb, n_null=10, seed=2)
    assert rot.rho_full == pytest.approx(base.rho_full, abs=1e-10)
    assert rot.rho_readout == pytest.approx(base.rho_readout, abs=1e-10)
    self_rot = M.cross_model_alignment(Xb, Xb @ R, Vb, R.T @ Vb, n_null=6, seed=2)
    assert self_rot.rho_full == pytest.approx(1.0, abs=1e-10)
    assert self_rot.rho_readout == pytest.approx(1.0, abs=1e-10)


def test_shared_structure_only_inside_readout_spaces():
    rng = np.random.default_rng(2)
    n, ka, kb, da, db = 150, 6, 6, 30, 40
    S = rng.standard_normal((n, 6)) * 2.0  # the shared structure
    Va = np.linalg.qr(rng.standard_normal((da, ka)))[0]
    Vb = np.linalg.qr(rng.standard_normal((db, kb)))[0]
    Pa = np.linalg.qr(np.hstack([Va, rng.standard_normal((da, da - ka))]))[0][:, ka:]
    Pb = np.linalg.qr(np.hstack([Vb, rng.standard_normal((db, db - kb))]))[0][:, kb:]
    Xa = S @ Va.T + 1.5 * rng.standard_normal((n, da - ka)) @ Pa.T  # private, outside readout
    Xb = S @ rng.standard_normal((6, 6)) @ Vb.T + 1.5 * rng.standard_normal((n, db - kb)) @ Pb.T
    r = M.cross_model_alignment(Xa, Xb, Va, Vb, n_null=20, ccr=0, seed=0)
    assert r.rho_readout > r.rho_full + 0.2
    assert r.rho_readout > r.null.max()
    assert r.z > 3


def test_matches_pdist_spearman_reference():
    rng = np.random.default_rng(3)
    Xa, Va = model(rng, 50, 12, 3)
    Xb, Vb = model(rng, 50, 9, 4)
    for pairs in (None, 400):
        r = M.cross_model_alignment(Xa, Xb, Va, Vb, n_null=5, ccr=1, seed=4, pairs=pairs,
                                    precision="float64")
        A, B = M.ccr(Xa, 1), M.ccr(Xb, 1)
        if pairs is None:
            sel = slice(None)
        else:
            i, j = M.sample_pairs(50, pairs, 4)
            # pdist order is (i<j) row-major; map the sampled (i, j), j < i, into it
            sel = (50 * j - j * (j + 1) // 2 + (i - j - 1))

        def d(Y, sel=sel):
            return pdist(Y, "cosine")[sel]

        assert r.rho_full == pytest.approx(spearmanr(d(A), d(B))[0], abs=1e-12)
        assert r.rho_readout == pytest.approx(spearmanr(d(A @ Va), d(B @ Vb))[0], abs=1e-12)
        rng_f = np.random.default_rng(4)
        null = []
        for _ in range(5):
            Qa = M.random_frame(rng_f, 12, 3)
            Qb = M.random_frame(rng_f, 9, 4)
            null.append(spearmanr(d(A @ Qa), d(B @ Qb))[0])
        np.testing.assert_allclose(r.null, null, atol=1e-12)
        assert r.z == pytest.approx((r.rho_readout - np.mean(null)) / np.std(null, ddof=1),
                                    abs=1e-9)


def test_errors():
    rng = np.random.default_rng(4)
    Xa, Va = model(rng, 30, 10, 3)
    Xb, Vb = model(rng, 31, 10, 3)
    with pytest.raises(DataError, match="same texts"):
        M.cross_model_alignment(Xa, Xb, Va, Vb, n_null=3)
    with pytest.raises(ConfigError, match="basis_b"):
        M.cross_model_alignment(Xa, Xa, Va, np.eye(10)[:, :11 - 1], n_null=3)
    with pytest.raises(ConfigError, match="n_null"):
        M.cross_model_alignment(Xa, Xa, Va, Va, n_null=0)
    bad = Xa.copy()
    bad[0, 0] = np.nan
    with pytest.raises(DataError, match="^pair 3: X_b contains 1 NaN"):
        M.cross_model_alignment(Xa, bad, Va, Va, n_null=3, label="pair 3")
