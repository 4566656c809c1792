"""kNN-LM: the kNN distribution, the interpolation against a slow explicit loop, λ = 0 against
the shared perplexity, the known answer on repeated passages, FAISS indexes, the datastore
cache, the dispersion-based selection and the CLI.

End-to-end half (the unit half is tests/unit/test_knnlm.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from support.knnlm import llama, make_rows  # noqa: F401 (fixtures)

from conftest import CORPUS
from lmgeom.cli import main
from lmgeom.lm import forward_chunks
from lmgeom.lm.datastore import build_datastores
from lmgeom.lm.knn_states import position_states
from lmgeom.lm.knnlm import (
    evaluate,
)

pytest.importorskip("faiss")


# ---------------------------------------------------------------------- on a model
def test_pipeline_matches_brute_force_on_a_tiny_model(llama, tmp_path):
    """Datastore + FAISS + interpolation against an explicit loop: full logits from
    transformers, numpy distances to every key, top-k, aggregation per token."""
    train = make_rows(llama, " ".join(CORPUS[:6]), 16)
    held = make_rows(llama, CORPUS[1] + " " + CORPUS[4], 10)
    point = llama.resolve_points("last.ffn_in")[0]
    store = build_datastores(llama, train, [point], batch_size=3, root=tmp_path)[point]
    q = position_states(llama, held, [point], lm_log_prob=True, batch_size=2)
    k, T, lam = 8, 3.0, 0.3
    res = evaluate(store, q.states[point], q.targets, q.lm_log_prob, k=k, lambdas=[0.0, lam],
                   temperature=T)
    # explicit: keys from hooks on a plain forward, logits of the full model
    keys, vals = [], []
    grab = {}
    mlp = llama.blocks[-1].mlp
    h = mlp.register_forward_pre_hook(lambda m, a: grab.__setitem__("x", a[0]))
    try:
        for row in train:
            with torch.no_grad():
                llama.hf_model(input_ids=torch.from_numpy(row)[None])
            keys.append(grab["x"][0, :-1].double().numpy())
            vals.append(row[1:])
        K, Vv = np.concatenate(keys), np.concatenate(vals)
        nll0 = nll = 0.0
        n = 0
        for row in held:
            with torch.no_grad():
                logits = llama.hf_model(input_ids=torch.from_numpy(row)[None]).logits[0].double()
            x = grab["x"][0].double().numpy()
            lp = torch.log_softmax(logits, -1).numpy()
            for t in range(len(row) - 1):
                dist = ((K - x[t]) ** 2).sum(1)
                nn = np.argsort(dist, kind="stable")[:k]
                w = np.exp(-(dist[nn] - dist[nn].min()) / T)
                p_knn = w[Vv[nn] == row[t + 1]].sum() / w.sum()
                p_lm = math.exp(lp[t, row[t + 1]])
                nll0 -= math.log(p_lm)
                nll -= math.log(lam * p_knn + (1 - lam) * p_lm)
                n += 1
    finally:
        h.remove()
    assert len(store) == len(K) and res.n_queries == n
    assert np.allclose(store.keys, K, atol=1e-5)
    assert np.array_equal(store.values, Vv)
    assert res.perplexity[0.0] == pytest.approx(math.exp(nll0 / n), rel=1e-5)
    assert res.perplexity[lam] == pytest.approx(math.exp(nll / n), rel=1e-4)


def test_lambda_zero_equals_the_base_perplexity_exactly(llama, tmp_path):
    train = make_rows(llama, " ".join(CORPUS[:6]), 16)
    held = make_rows(llama, " ".join(CORPUS[6:12]), 12)
    pts = llama.resolve_points("last.attn_out,final")
    stores = build_datastores(llama, train, pts, batch_size=4, root=tmp_path)
    q = position_states(llama, held, pts, lm_log_prob=True, batch_size=4)
    base = forward_chunks(llama, held, nll=True, batch_size=4)
    ref = math.exp(base.nll_sum.sum() / base.n_predicted.sum())
    assert len(q) == int(base.n_predicted.sum())
    for p in pts:
        r = evaluate(stores[p], q.states[p], q.targets, q.lm_log_prob, k=50)
        assert r.perplexity[0.0] == pytest.approx(ref, rel=1e-12)
        assert set(r.perplexity) == {0.0, 0.1, 0.25, 0.5}
    # a temperature grid from the same retrieval: λ = 0 is the base LM at every T
    r = evaluate(stores[pts[0]], q.states[pts[0]], q.targets, q.lm_log_prob, k=50,
                 temperature=1.0, temperatures=["auto", 10.0])
    assert set(r.temperatures) == {"1", "auto", "10"}
    assert r.temperatures["auto"] == pytest.approx(r.nn_distance)
    for tl in r.temperatures:
        assert r.grid[(tl, 0.0)] == pytest.approx(ref, rel=1e-12)
    assert r.perplexity == {lam: r.grid[("1", lam)] for lam in r.perplexity}


# ---------------------------------------------------------------------- CLI
def test_cli_knnlm_select_end_to_end(tiny_dir, tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("\n".join(CORPUS * 3))
    out = tmp_path / "run"
    rc = main(["knnlm", "--model", str(tiny_dir("llama")), "--train-texts", str(train),
               "--select", "--candidates", "last.attn_out,last.ffn_in,last.ffn_out,last",
               "--chunk-len", "24", "--max-train-tokens", "480", "--max-eval-tokens", "96",
               "--select-tokens", "200", "--k", "64", "--lambdas", "0,0.25,0.5",
               "--datastore-dir", str(tmp_path / "ds"), "--out", str(out), "--quiet"])
    assert rc == 0
    df = pd.read_parquet(out / "knnlm.parquet")
    man = json.loads((out / "manifest.json").read_text())
    assert (out / "report.html").is_file() and (out / "plots" / "knnlm.png").is_file()
    ppl = df[df.metric == "knnlm_perplexity"]
    assert set(ppl.layer) == {"3.attn_out", "3.ffn_in", "3.ffn_out", "3"}
    base = df[df.metric == "perplexity"].value.iloc[0]
    lam0 = ppl[ppl.setting.str.contains("lambda=0;")]
    assert np.allclose(lam0.value, base, rtol=1e-12)
    disp = df[df.metric == "knnlm_dispersion"].set_index("layer").value
    assert man["picked_by_dispersion"] == disp.idxmax()
    at = ppl[ppl.setting.str.contains("lambda=0.25;")].set_index("layer").value
    assert man["best_by_perplexity"] == at.idxmin()
    match = df[df.metric == "knnlm_selection_match"].value.iloc[0]
    assert match == float(man["picked_by_dispersion"] == man["best_by_perplexity"])
    assert "squared L2" in man["distance"]
    # a different run into the same folder is refused
    rc = main(["knnlm", "--model", str(tiny_dir("llama")), "--train-texts", str(train),
               "--chunk-len", "24", "--max-train-tokens", "480", "--max-eval-tokens", "96",
               "--k", "8", "--out", str(out), "--quiet"])
    assert rc == 2

