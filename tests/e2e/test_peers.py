"""Agreement with the peers users trust.

* per-layer states of :func:`lmgeom.extract_tokens` / :func:`lmgeom.extract` (batched,
  right-padded, hooked) equal ``transformers``' ``output_hidden_states`` of each text run alone:
  entry ``i < L`` is lmgeom's layer ``"i"``, and the last entry (after the final norm, see
  ../shared/OFFLINE.md) is ``"final"``; lmgeom's ``"L"`` is the final norm's input, which
  transformers does not return, so it is checked as ``final_norm("L") == "final"``;
* perplexity from :mod:`lmgeom.lm` equals ``exp`` of a plain ``transformers`` loss
  ``model(input_ids, labels=input_ids).loss`` on the same token rows;
* RankMe / α-ReQ against ``reptrix`` 0.1.0 (``reptrix.rankme.get_rankme``,
  ``reptrix.alpha.get_alpha``) on the same matrices. The definitions differ, and the
  differences are pinned here rather than hidden:

  - RankMe: lmgeom follows Garrido et al. (2023) — entropy of the normalised **singular
    values** σ_i/Σσ (+1e-7). reptrix normalises the PCA explained-variance ratios
    λ_i/Σλ = σ_i²/Σσ² instead. Same formula otherwise (eps 1e-7, natural log, every one of the
    min(N, d) components), so ``reptrix.rankme.get_rank(σ) == lmgeom.rankme(X)`` and
    ``reptrix.get_rankme(X) == get_rank(σ²)``; reptrix's value is smaller (squaring sharpens
    the distribution).
  - α-ReQ: both fit ``log λ_i = -α log i + c`` on the centred covariance spectrum. reptrix
    (after Stringer & Pachitariu) fits a **weighted** least squares with weights ``1/i`` over
    0-based indices ``fit_range`` (default ``arange(10, 100)`` = ranks 11..100); lmgeom fits
    unweighted over 1-based inclusive ranks ``rank_range``. On an exact power law both return
    the exponent; on real states they differ by the weighting (measured below). Note:
    ``reptrix.alpha.get_powerlaw`` adds 1 to the ``fit_range`` array it is given, in place.

``reptrix`` declares ``torchvision`` as a requirement (never imported), which would pull a
CUDA torch; install it with ``pip install --no-deps reptrix==0.1.0`` (the Makefile does). The
reptrix comparisons are skipped where it is missing; the explicit definitions always run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lmgeom
from conftest import CORPUS, FAMILIES
from lmgeom.lm import forward_chunks, perplexity
from lmgeom.metrics.spectral import alpha_req, rankme, singular_values

TEXTS = CORPUS[:5]
#: max |lmgeom - transformers| per architecture, filled by the tests (printed with -s).
DEVIATIONS: dict[str, dict[str, float]] = {}


def _record(arch: str, what: str, value: float) -> None:
    DEVIATIONS.setdefault(arch, {})[what] = max(value, DEVIATIONS.get(arch, {}).get(what, 0.0))


def _show(arch: str) -> None:
    d = DEVIATIONS.get(arch, {})
    print(f"\npeer deviation {arch:14s} " + "  ".join(f"{k}={v:.2e}" for k, v in d.items()))


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tiny_dir):
    return lmgeom.load_model(str(tiny_dir(request.param)), device="cpu")


def _hf_alone(model, ids: np.ndarray):
    x = torch.from_numpy(ids)[None]
    with torch.no_grad():
        out = model.hf_model(input_ids=x, labels=x, output_hidden_states=True, use_cache=False)
    return out


def _check_states(model, texts, arch: str, atol: float, rtol: float) -> None:
    L = model.n_blocks
    labels = model.layer_labels
    toks = lmgeom.extract_tokens(model, texts, layers="all", cache=False, batch_size=3)
    last = lmgeom.extract(model, texts, layers="all", pooling="last", cache=False, batch_size=3)
    enc = lmgeom.activations.encode_texts(model, texts, 512)
    for i, ids in enumerate(enc.ids):
        hs = [h[0].numpy() for h in _hf_alone(model, ids).hidden_states]
        assert len(hs) == L + 1
        want = {str(j): hs[j] for j in range(L)} | {"final": hs[L]}
        for lb, w in want.items():
            got = toks.get(i, lb)
            _record(arch, "tokens", float(np.abs(got - w).max()))
            _record(arch, "tokens_rel", float(np.abs(got - w).max() / np.abs(w).max()))
            _record(arch, "last", float(np.abs(last.layer(lb)[i] - w[-1]).max()))
            np.testing.assert_allclose(got, w, rtol=rtol, atol=atol, err_msg=f"{arch} {lb}")
            np.testing.assert_allclose(last.layer(lb)[i], w[-1], rtol=rtol, atol=atol)
        with torch.no_grad():
            normed = model.apply_final_norm(torch.from_numpy(toks.get(i, str(L)))).numpy()
        np.testing.assert_allclose(normed, toks.get(i, "final"), rtol=rtol, atol=atol)
    assert set(labels) == set(want) | {str(L)}
    _show(arch)


def _check_perplexity(model, texts, arch: str, tol: float) -> None:
    enc = lmgeom.activations.encode_texts(model, texts, 512)
    res = perplexity(model, list(texts), batch_size=3)
    chunks = forward_chunks(model, list(enc.ids), nll=True, batch_size=2)
    for i, ids in enumerate(enc.ids):
        loss = float(_hf_alone(model, ids).loss)  # mean NLL of tokens 2..T
        want = math.exp(loss)
        got = res.texts[i].perplexity
        _record(arch, "ppl_rel", abs(got - want) / want)
        _record(arch, "nll", abs(chunks.mean_nll[i] - loss))
        assert res.texts[i].n_predicted == len(ids) - 1
        assert got == pytest.approx(want, rel=tol)
        assert chunks.mean_nll[i] == pytest.approx(loss, abs=tol)
    _show(arch)


def _arch(model) -> str:
    if model.model_type == "gpt_neox":
        return "gpt_neox-" + ("par" if model.hf_model.config.use_parallel_residual else "seq")
    return model.model_type


def test_states_equal_transformers_hidden_states(tiny):
    _check_states(tiny, TEXTS, _arch(tiny), atol=1e-5, rtol=1e-5)


def test_perplexity_equals_transformers_loss(tiny):
    _check_perplexity(tiny, TEXTS, _arch(tiny), tol=1e-5)


@pytest.mark.slow
def test_bundled_smollm_agrees_with_transformers(smollm):
    texts = CORPUS[:3]
    _check_states(smollm, texts, "smollm2-135m", atol=1e-3, rtol=1e-4)  # |h| reaches ~300
    _check_perplexity(smollm, texts, "smollm2-135m", tol=1e-4)


# ---------------------------------------------------------------------- spectral peers
def _matrices():
    rng = np.random.default_rng(0)
    n, d = 300, 64
    # an exact power-law covariance spectrum lambda_i ∝ i^-1.5, rotated
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    Z = rng.standard_normal((n, d))
    Z = (Z - Z.mean(0)) / Z.std(0)
    U, _, Vt = np.linalg.svd(Z, full_matrices=False)
    sig = np.arange(1, d + 1, dtype=np.float64) ** -0.75
    power = (U * sig) @ Vt @ Q
    states = rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) * 3 + 1
    return {"power_law": power, "gaussian_mixed": states}


def _rank_of(values: np.ndarray, eps: float = 1e-7) -> float:
    """Effective rank exp(H(p)), p = v / Σ|v| + eps (reptrix's get_rank, written out)."""
    p = values / np.sum(np.abs(values)) + eps
    return float(np.exp(-np.sum(p * np.log(p))))


def _weighted_alpha(lam: np.ndarray, fit_range: np.ndarray) -> float:
    """reptrix's power-law fit written out: weights 1/i over ranks i = fit_range + 1."""
    y = np.log(np.abs(lam[fit_range]))
    i = fit_range + 1.0
    x = np.stack([-np.log(i), np.ones_like(i)], 1)
    w = 1.0 / i
    return float(np.linalg.solve(x.T @ (x * w[:, None]), (x * w[:, None]).T @ y)[0])


@pytest.mark.parametrize("name", ["power_law", "gaussian_mixed"])
def test_rankme_definitions(name):
    X = _matrices()[name]
    s = singular_values(X)
    assert rankme(X) == pytest.approx(_rank_of(s), rel=1e-12)  # Garrido et al.: σ-based
    lam = s ** 2
    assert _rank_of(lam) < _rank_of(s)  # the λ-based variant is always the smaller
    reptrix = pytest.importorskip("reptrix.rankme")
    theirs = float(reptrix.get_rankme(torch.from_numpy(X)))
    assert theirs == pytest.approx(_rank_of(lam), rel=1e-6)
    assert float(reptrix.get_rank(s)) == pytest.approx(rankme(X), rel=1e-12)
    print(f"rankme {name}: lmgeom {rankme(X):.4f}  reptrix {theirs:.4f}")


@pytest.mark.parametrize("name", ["power_law", "gaussian_mixed"])
def test_alpha_req_definitions(name):
    X = _matrices()[name]
    lam = singular_values(X) ** 2
    fit = np.arange(10, 40)  # 0-based, as reptrix takes it: ranks 11..40
    ours = alpha_req(X, rank_range=(11, 40))
    ols = -np.polyfit(np.log(np.arange(11, 41)), np.log(lam[10:40]), 1)[0]
    assert ours == pytest.approx(ols, rel=1e-10)
    weighted = _weighted_alpha(lam, fit)
    if name == "power_law":  # an exact power law: both fits give the exponent 1.5
        assert ours == pytest.approx(1.5, abs=1e-6) and weighted == pytest.approx(1.5, abs=1e-6)
    reptrix = pytest.importorskip("reptrix.alpha")
    given = fit.copy()
    theirs = float(reptrix.get_alpha(torch.from_numpy(X), fit_range=given)[0])
    assert np.array_equal(given, fit + 1)  # reptrix shifts the caller's array in place
    assert theirs == pytest.approx(weighted, rel=1e-6)
    print(f"alpha {name}: lmgeom {ours:.6f}  reptrix {theirs:.6f}  diff {abs(ours - theirs):.2e}")
