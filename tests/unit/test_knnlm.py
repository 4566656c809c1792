"""kNN-LM: the kNN distribution, the interpolation against a slow explicit loop, λ = 0 against
the shared perplexity, the known answer on repeated passages, FAISS indexes, the datastore
cache, the dispersion-based selection and the CLI."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from support.knnlm import llama, make_rows  # noqa: F401 (fixtures)

import lmgeom
from conftest import CORPUS
from lmgeom.errors import ConfigError, DataError
from lmgeom.experiments.knnlm import KnnConfig, pooled_dispersion, run_knnlm, split_corpus, unit_sum
from lmgeom.lm.datastore import Datastore, IndexSpec, build_datastores, require_faiss
from lmgeom.lm.knn_states import position_states
from lmgeom.lm.knnlm import (
    evaluate,
    interpolate,
    knn_distribution,
    knn_log_prob,
    perplexity_of,
    resolve_temperature,
)

pytest.importorskip("faiss")


TEXT_A = (
    "The lighthouse keeper counted seven ships before dawn, then wrote their names in a "
    "green ledger and climbed the stairs again to trim the lamp. "
) * 3


# ---------------------------------------------------------------------- distribution
def test_knn_distribution_sums_to_one_and_gives_the_target_probability():
    rng = np.random.default_rng(0)
    Q, k, V = 7, 12, 9
    d = rng.uniform(0, 5, size=(Q, k)).astype(np.float32)
    d[3] += 1e6  # huge distances must not underflow to 0/0
    v = rng.integers(0, V, size=(Q, k))
    valid = np.ones((Q, k), dtype=bool)
    valid[1, 5:] = False  # unfilled FAISS slots
    for T, dist in [(1.0, "sqeuclidean"), (2.5, "sqeuclidean"), (1.0, "euclidean")]:
        P = knn_distribution(d, v, V, temperature=T, distance=dist, valid=valid)
        assert np.allclose(P.sum(1), 1.0, atol=1e-12)
        assert (P >= 0).all()
        for t in range(V):
            lp = knn_log_prob(d, v, np.full(Q, t), temperature=T, distance=dist, valid=valid)
            with np.errstate(divide="ignore"):
                assert np.allclose(np.exp(lp), P[:, t], atol=1e-12)
    # a target carried by no valid neighbour has probability 0
    tgt = np.full(Q, V + 5)
    assert np.isneginf(knn_log_prob(d, v, tgt)).all()
    # no valid neighbour at all: probability 0 everywhere, no NaN
    none = np.zeros((Q, k), dtype=bool)
    assert np.isneginf(knn_log_prob(d, v, v[:, 0], valid=none)).all()
    assert (knn_distribution(d, v, V, valid=none) == 0).all()


def test_knn_options_are_checked():
    d = np.zeros((2, 3))
    v = np.zeros((2, 3), dtype=int)
    with pytest.raises(ConfigError, match="temperature"):
        knn_log_prob(d, v, np.zeros(2), temperature=0)
    with pytest.raises(ConfigError, match="distance"):
        knn_log_prob(d, v, np.zeros(2), distance="cosine")
    with pytest.raises(DataError):
        knn_log_prob(d, v[:, :2], np.zeros(2))
    with pytest.raises(ConfigError, match="lambda"):
        interpolate(np.zeros(2), np.zeros(2), 1.5)


def test_interpolation_matches_a_slow_explicit_loop():
    rng = np.random.default_rng(1)
    Q, k, V = 20, 6, 5
    d = rng.uniform(0, 3, size=(Q, k))
    v = rng.integers(0, V, size=(Q, k))
    t = rng.integers(0, V, size=Q)
    p_lm = rng.dirichlet(np.ones(V), size=Q)
    lm_lp = np.log(p_lm[np.arange(Q), t])
    T = 0.7
    kl = knn_log_prob(d, v, t, temperature=T)
    for lam in (0.0, 0.1, 0.25, 0.5, 1.0):
        nll = 0.0
        for q in range(Q):
            w = {}
            for j in range(k):
                w[int(v[q, j])] = w.get(int(v[q, j]), 0.0) + math.exp(-d[q, j] / T)
            z = sum(w.values())
            p = lam * w.get(int(t[q]), 0.0) / z + (1 - lam) * p_lm[q, t[q]]
            nll -= math.log(p) if p > 0 else -math.inf
        ref = math.exp(nll / Q)
        got = perplexity_of(interpolate(lm_lp, kl, lam))
        if math.isinf(ref):
            assert math.isinf(got)
        else:
            assert got == pytest.approx(ref, rel=1e-10), lam
    assert np.array_equal(interpolate(lm_lp, kl, 0.0), lm_lp)


def test_auto_temperature_is_the_median_nearest_distance():
    d = np.array([[4.0, 9.0], [1.0, 2.0], [16.0, 20.0]])
    ok = np.ones_like(d, dtype=bool)
    assert resolve_temperature("auto", d, ok) == 4.0
    assert resolve_temperature("auto", d, ok, "euclidean") == 2.0
    ok[0, 0] = False  # an invalid slot is not a neighbour
    assert resolve_temperature("auto", d, ok) == 9.0
    assert resolve_temperature(2.5, d, ok) == 2.5 and resolve_temperature("3", d, ok) == 3.0
    with pytest.raises(ConfigError):
        resolve_temperature("warm", d, ok)
    with pytest.raises(DataError, match="all 0"):
        resolve_temperature("auto", np.zeros((2, 2)), np.ones((2, 2), dtype=bool))
    # scale-free: multiplying every distance by c leaves p_kNN under T=auto unchanged
    rng = np.random.default_rng(2)
    D = rng.uniform(1, 5, size=(6, 8))
    v = rng.integers(0, 4, size=(6, 8))
    t = v[:, 0]
    ok = np.ones_like(D, dtype=bool)
    a = knn_log_prob(D, v, t, temperature=resolve_temperature("auto", D, ok))
    b = knn_log_prob(1e3 * D, v, t, temperature=resolve_temperature("auto", 1e3 * D, ok))
    assert np.allclose(a, b)


def test_datastore_of_a_text_makes_its_repeats_easy(llama, tmp_path):
    """Known answer: every held-out context is in the store with its true next token."""
    rows = make_rows(llama, TEXT_A, 24)
    other = make_rows(llama, " ".join(CORPUS[:6]), 24)
    point = llama.resolve_points("final")[0]
    store = build_datastores(llama, rows, [point], root=tmp_path)[point]
    q = position_states(llama, rows, [point], lm_log_prob=True)
    r = evaluate(store, q.states[point], q.targets, q.lm_log_prob, k=16,
                 lambdas=[0.0, 0.25, 0.5], temperature=0.05)
    assert r.target_recall == 1.0
    base = r.perplexity[0.0]
    assert base > 100  # a random tiny model: about uniform over 256 tokens
    assert r.perplexity[0.5] < 0.05 * base
    # p = 0.5 p_kNN + 0.5 p_LM with p_kNN ≈ 1 (the exact context is stored): perplexity ≈ 2
    assert r.perplexity[0.5] < 2.2
    qo = position_states(llama, other, [point], lm_log_prob=True)
    ro = evaluate(store, qo.states[point], qo.targets, qo.lm_log_prob, k=16, lambdas=[0.0, 0.5],
                  temperature=0.05)
    assert ro.perplexity[0.5] > 10 * r.perplexity[0.5]  # unrelated text gains far less


def test_datastore_cache_roundtrip_and_reuse(llama, tmp_path, monkeypatch):
    rows = make_rows(llama, TEXT_A, 20)
    pts = llama.resolve_points("last.ffn_out,2")
    stores = build_datastores(llama, rows, pts, batch_size=2, root=tmp_path)
    for p in pts:
        s = stores[p]
        assert isinstance(s.keys, np.memmap)
        assert s.keys.shape == (rows.size - len(rows), llama.width)
        again = Datastore.open(s.folder)
        assert np.array_equal(again.keys, s.keys) and np.array_equal(again.values, s.values)
    assert not list(tmp_path.glob("*.tmp*"))
    import lmgeom.lm.datastore as K

    def boom(*a, **k):
        raise AssertionError("the model ran although every datastore was cached")

    monkeypatch.setattr(K, "iter_position_states", boom)
    cached = build_datastores(llama, rows, pts, batch_size=2, root=tmp_path)
    assert {p: s.folder for p, s in cached.items()} == {p: s.folder for p, s in stores.items()}
    # other tokens -> another key
    with pytest.raises(AssertionError, match="cached"):
        build_datastores(llama, rows[:-1], pts, batch_size=2, root=tmp_path)


def test_ivf_indexes(llama, tmp_path):
    rows = make_rows(llama, " ".join(CORPUS), 32)
    point = llama.resolve_points("final")[0]
    store = build_datastores(llama, rows, [point], root=tmp_path)[point]
    q = np.ascontiguousarray(store.keys[::7][:40])
    Df, _ = store.search(q, 10)
    assert np.allclose(Df[:, 0], 0, atol=1e-4)  # every query is a stored key
    # IVF probing every list is exact
    spec = IndexSpec(kind="ivf", nlist=4, nprobe=4)
    Di, _ = store.search(q, 10, spec)
    assert np.allclose(Di, Df, rtol=1e-4, atol=1e-4)
    assert list(store.folder.glob("index-*.faiss"))  # trained index kept on disk
    store2 = Datastore.open(store.folder)
    Di2, _ = store2.search(q, 10, spec)
    assert np.allclose(Di2, Di)
    # IVF-PQ: approximate; with recompute the distances are exact for the ids returned
    pq = IndexSpec(kind="ivfpq", nlist=2, nprobe=2, pq_m=8)
    Dp, Ip = store.search(q, 10, pq, recompute=True)
    K = np.asarray(store.keys, dtype=np.float64)
    exact = ((K[Ip] - q[:, None, :].astype(np.float64)) ** 2).sum(-1)
    assert np.allclose(Dp, exact, rtol=1e-5, atol=1e-5)
    assert (np.diff(Dp, axis=1) >= 0).all()
    with pytest.raises(ConfigError, match="divide"):
        store.search(q, 5, IndexSpec(kind="ivfpq", pq_m=7))


def test_missing_faiss_has_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ConfigError, match="pip install faiss-cpu"):
        require_faiss()


# ---------------------------------------------------------------------- selection
def test_unit_sum_reducer_gives_the_pooled_dispersion():
    torch.manual_seed(0)
    h = torch.randn(3, 7, 5) + 0.5
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[:, 0] = False
    sums = unit_sum(h, mask)
    pooled, n = pooled_dispersion(sums)
    rows = torch.cat([h[b][mask[b]] for b in range(3)]).double().numpy()
    assert n == len(rows)
    assert pooled == pytest.approx(lmgeom.metrics.dispersion(rows), abs=1e-12)


def test_split_corpus_is_disjoint_and_seeded():
    texts = [f"text number {i} " * 3 for i in range(40)]
    tr, ev, _ = split_corpus(texts, None, fraction=0.25, seed=3)
    assert len(ev) == 10 and len(tr) == 30
    assert not set(tr.texts) & set(ev.texts)
    _, ev2, _ = split_corpus(texts, texts, fraction=0.25, seed=3)  # same spec: split too
    assert ev2.texts == ev.texts
    assert split_corpus(texts, None, fraction=0.25, seed=4)[1].texts != ev.texts
    _, ev3, how3 = split_corpus(texts, texts[:5], fraction=0.25)
    assert how3 == "given" and len(ev3) == 5


def test_run_knnlm_selection_is_consistent(llama, tmp_path):
    texts = CORPUS * 3
    cfg = KnnConfig(select=True, candidates="last.attn_out,last.ffn_in,final", chunk_len=24,
                    max_train_tokens=600, max_eval_tokens=96, select_tokens=200, k=32,
                    eval_fraction=0.25)
    run = run_knnlm(llama, texts, None, cfg, datastore_root=tmp_path, cache=False)
    assert run.evaluated == run.points
    disp = {p: run.dispersion[p].pooled for p in run.points}
    assert run.picked == max(disp, key=disp.get)
    ppl = {p: run.evals[p].perplexity[0.25] for p in run.points}
    assert run.best == min(ppl, key=ppl.get)
    assert run.match == (run.picked == run.best)
    assert run.base_perplexity == pytest.approx(run.base_perplexity_lambda0, rel=1e-12)
    top = run_knnlm(llama, texts, None, KnnConfig(**{**cfg.__dict__, "top": 1}),
                    datastore_root=tmp_path, cache=False)
    assert top.evaluated == (run.picked,)


def test_split_corpus_is_textset_split_with_the_old_rule():
    """kNN-LM's held-out part comes from TextSet.split (the one splitter) and equals the rule
    it used before: the first round(f·N) of default_rng(seed).permutation(N), both parts sorted."""
    from lmgeom.experiments.knnlm import split_corpus

    texts = [f"text number {i}" for i in range(37)]
    for seed, f in ((0, 0.1), (3, 0.25), (11, 0.5)):
        tr, ev, how = split_corpus(texts, fraction=f, seed=seed)
        perm = np.random.default_rng(seed).permutation(37)
        k = int(min(36, max(1, round(f * 37))))
        assert list(ev.texts) == [texts[i] for i in np.sort(perm[:k])]
        assert list(tr.texts) == [texts[i] for i in np.sort(perm[k:])]
        assert how == f"held-out {k} of 37 texts (seed {seed})"

