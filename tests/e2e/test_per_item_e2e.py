"""Per-item outputs: ``--log-samples`` writes one row per text, and every column agrees with an
explicit computation (the perplexity with ``lmgeom.lm.perplexity``, the readout share with a
plain projection, truncation with the tokenizer).

End-to-end half (the unit half is tests/unit/test_per_item.py).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from support.per_item import corpus

import lmgeom
from lmgeom.cli import main


def test_analyze_log_samples_one_row_per_text(tiny_dir, tmp_path, capsys):
    texts = corpus(tmp_path)
    model_dir = tiny_dir("llama")
    out = tmp_path / "run"
    argv = ["analyze", "--model", str(model_dir), "--texts", str(texts), "--k", "4",
            "--n-null", "5", "--ccr", "1", "--max-length", "32", "--quiet", "--out", str(out)]
    assert main(argv + ["--log-samples"]) == 0
    assert "samples.parquet" in capsys.readouterr().out
    s = pd.read_parquet(out / "samples.parquet")
    ts = lmgeom.load_texts(str(texts), limit=512, seed=0)
    assert list(s["id"]) == list(ts.ids) and list(s["label"]) == list(ts.labels)
    model = lmgeom.load_model(str(model_dir))
    full = [len(x) for x in model.tokenizer(list(ts.texts))["input_ids"]]
    assert list(s["n_tokens_full"]) == full
    assert list(s["truncated"]) == [n > 32 for n in full] and s["truncated"].any()
    assert list(s["n_tokens"]) == [min(n, 32) for n in full]
    ppl = lmgeom.lm.perplexity(model, ts, max_length=32)
    np.testing.assert_allclose(s["perplexity"], ppl.perplexities, rtol=1e-9)
    np.testing.assert_allclose(np.log(s["perplexity"]), s["nll"], rtol=1e-12)
    # readout share, explicitly: ||V_k^T (x - mean)||^2 / ||x - mean||^2 per text
    acts = lmgeom.extract(model, ts, max_length=32)
    W = model.W_U.detach().float().numpy().astype(np.float64)
    V = np.linalg.svd(W, full_matrices=False)[2][:4].T
    for layer in ("0", "final"):
        X = acts.layer(layer).astype(np.float64)
        Xc = X - X.mean(0)
        want = ((Xc @ V) ** 2).sum(1) / (Xc**2).sum(1)
        np.testing.assert_allclose(s[f"readout_share@{layer}"], want, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(s[f"norm@{layer}"], np.linalg.norm(X, axis=1), rtol=1e-9)
    assert s[[c for c in s.columns if c.startswith("readout_share@")]].stack().between(0, 1).all()
    # the samples add a file and change no number: same signature, same table
    layers = pd.read_parquet(out / "layers.parquet")
    assert main(argv + ["--out", str(tmp_path / "plain")]) == 0
    pd.testing.assert_frame_equal(layers, pd.read_parquet(tmp_path / "plain" / "layers.parquet"))
    sig = json.loads((out / "manifest.json").read_text())["signature"]
    assert sig == json.loads((tmp_path / "plain" / "manifest.json").read_text())["signature"]


def test_model_args_reach_the_loader(tiny_dir, tmp_path, capsys):
    """``--model-args dtype=bfloat16`` gives the same activations as ``--dtype bfloat16``."""
    texts = corpus(tmp_path, n=8)
    base = ["extract", "--model", str(tiny_dir("llama")), "--texts", str(texts), "--layers",
            "final", "--quiet", "--no-cache"]
    assert main(base + ["--dtype", "bfloat16", "--out", str(tmp_path / "a")]) == 0
    assert main(base + ["--model-args", "dtype=bfloat16", "--out", str(tmp_path / "b")]) == 0
    assert main(base + ["--out", str(tmp_path / "c")]) == 0
    a, b, c = (lmgeom.load_activations(tmp_path / x) for x in "abc")
    assert a.settings["dtype"] == b.settings["dtype"] == "bfloat16" != c.settings["dtype"]
    np.testing.assert_array_equal(a.states, b.states)


def test_per_token_nll_streams_and_sums_to_the_text_nll(tiny_dir, tmp_path):
    """Token rows sum to each text's NLL, cover positions 1..n-1 exactly once (also with a
    sliding window), and are written one row group per batch (streamed)."""
    import pyarrow.parquet as pq

    from lmgeom.lm.perplexity import TokenNLLWriter

    model = lmgeom.load_model(str(tiny_dir("llama")))
    ts = lmgeom.load_texts(str(corpus(tmp_path, n=12)), limit=None)
    for kw in ({"max_length": 24}, {"max_length": 16, "stride": 5}):
        path = tmp_path / f"tok-{len(kw)}.parquet"
        with TokenNLLWriter(path, model.tokenizer, ts.ids) as w:
            res = lmgeom.lm.perplexity(model, ts, batch_size=4, token_nll=w, **kw)
        t = pd.read_parquet(path)
        # one row group per batch of 4 model inputs (texts, or windows with a stride)
        assert pq.ParquetFile(path).num_row_groups == -(-res.n_windows // 4) > 1
        assert len(t) == w.n_rows == sum(x.n_predicted for x in res)
        for x in res:
            g = t[t["id"] == x.id]
            assert sorted(g["position"]) == list(range(1, x.n_predicted + 1))
            assert g["nll"].sum() == pytest.approx(x.nll_sum, rel=1e-12, abs=1e-12)
        ids = model.tokenizer(list(ts.texts))["input_ids"]
        row = t.iloc[5]
        assert row["token_id"] == ids[list(ts.ids).index(row["id"])][row["position"]]


def test_hardness_and_dispersion_log_samples(tiny_dir, tmp_path):
    texts = corpus(tmp_path, n=24)
    model = str(tiny_dir("llama"))
    out = tmp_path / "h"
    assert main(["hardness", "--model", model, "--texts", str(texts), "--max-length", "32",
                 "--n-boot", "50", "--n-perm", "50", "--quantile", "0.25", "--show", "0",
                 "--log-samples", "--quiet", "--out", str(out)]) == 0
    s = pd.read_parquet(out / "samples.parquet")
    ranking = pd.read_csv(out / "hardness.csv", dtype={"id": str}).set_index("id")
    assert len(s) == 24 and list(s["id"]) == list(lmgeom.load_texts(str(texts), limit=500).ids)
    np.testing.assert_allclose(s["dispersion@final"], ranking.loc[s["id"], "dispersion"],
                               rtol=1e-6)
    np.testing.assert_array_equal(s["rank"], ranking.loc[s["id"], "rank"])
    np.testing.assert_allclose(np.exp(s["nll"]), s["perplexity"], rtol=1e-9)
    out = tmp_path / "d"
    assert main(["dispersion", "--model", model, "--texts", str(texts), "--chunk-len", "16",
                 "--layers", "1,final", "--group-size", "2", "--max-groups", "4", "--n-boot",
                 "50", "--log-samples", "--quiet", "--out", str(out)]) == 0
    s = pd.read_parquet(out / "samples.parquet")
    c = pd.read_parquet(out / "chunks.parquet")
    assert len(s) == c["chunk"].nunique() and (s["n_tokens"] == 16).all()
    for layer in ("1", "final"):
        want = c[c["layer"] == layer].set_index("chunk").loc[s["chunk"], "dispersion"]
        np.testing.assert_allclose(s[f"dispersion@{layer}"], want, rtol=1e-7)


def test_analyze_token_pooling_probes_use_each_rows_text_label(tiny_dir, tmp_path):
    """With ``--pooling tokens`` every sampled row is probed with the label of its text (this
    used to fail: one label per text against one row per token)."""
    texts = corpus(tmp_path, n=12)
    out = tmp_path / "tok"
    assert main(["analyze", "--model", str(tiny_dir("llama")), "--texts", str(texts), "--k", "4",
                 "--n-null", "5", "--ccr", "1", "--pooling", "tokens", "--layers", "1,final",
                 "--folds", "2", "--quiet", "--out", str(out)]) == 0
    df = pd.read_parquet(out / "layers.parquet")
    acc = df[df.metric == "probe_acc"]
    assert set(acc.layer) == {"1", "final"} and acc["n"].min() > 12  # rows are tokens

