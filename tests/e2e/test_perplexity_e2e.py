"""Perplexity and the shared forward pass: agreement with a direct transformers computation,
padding invariance, the sliding window, the logits-memory bound, the cache and the CLI.

End-to-end half (the unit half is tests/unit/test_perplexity.py).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from support.perplexity import TEXTS, explicit_nll, llama  # noqa: F401 (fixtures)

import lmgeom
from lmgeom.cli import main
from lmgeom.lm import forward_chunks, perplexity


def _hf_ppl(model, text: str) -> tuple[float, int]:
    """Perplexity of one text from the full model's own loss (labels = input ids)."""
    ids = model.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = model.hf_model(input_ids=ids, labels=ids).loss.item()
    return math.exp(loss), ids.shape[1]


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt2", "olmo2"])
def test_matches_transformers_loss(tiny_dir, family):
    model = lmgeom.load_model(str(tiny_dir(family)))
    res = perplexity(model, TEXTS, batch_size=3, position_chunk=5)
    for text, tp in zip(TEXTS, res.texts):
        ref, n = _hf_ppl(model, text)
        assert tp.n_tokens == n and tp.n_predicted == n - 1
        assert abs(tp.perplexity / ref - 1) <= 1e-4, (family, tp.perplexity, ref)
    total = sum(t.nll_sum for t in res.texts) / sum(t.n_predicted for t in res.texts)
    assert res.corpus_perplexity == pytest.approx(math.exp(total), rel=1e-12)
    df = res.to_frame()
    assert list(df.columns) == ["id", "n_tokens", "nll_sum", "n_predicted", "perplexity"]
    assert df.perplexity.tolist() == pytest.approx(res.perplexities.tolist())


def test_nll_sum_matches_explicit_log_softmax(llama):
    res = perplexity(llama, TEXTS, batch_size=4)
    for text, tp in zip(TEXTS, res.texts):
        ids = llama.tokenizer(text)["input_ids"]
        assert tp.nll_sum == pytest.approx(explicit_nll(llama, ids), rel=1e-5)


def test_padding_and_chunking_do_not_change_values(llama):
    alone = [perplexity(llama, [t], batch_size=1).texts[0].perplexity for t in TEXTS]
    batched = perplexity(llama, TEXTS, batch_size=4, position_chunk=3).perplexities
    other = perplexity(llama, TEXTS[::-1], batch_size=2, position_chunk=1000).perplexities[::-1]
    np.testing.assert_allclose(batched, alone, rtol=1e-5)
    np.testing.assert_allclose(other, alone, rtol=1e-5)


def test_sliding_window_matches_hf_recipe(llama):
    """The Hugging Face 'perplexity of fixed-length models' loop, written out."""
    text = TEXTS[2]
    ids = llama.tokenizer(text, return_tensors="pt")["input_ids"]
    N, max_len, stride = ids.shape[1], 12, 5
    nll_sum, n_scored, prev_end = 0.0, 0, 0
    for begin in range(0, N, stride):
        end = min(begin + max_len, N)
        trg = end - prev_end
        x = ids[:, begin:end]
        labels = x.clone()
        labels[:, :-trg] = -100
        with torch.no_grad():
            loss = llama.hf_model(input_ids=x, labels=labels).loss.item()
        k = int((labels[:, 1:] != -100).sum())  # the model shifts labels internally
        nll_sum += loss * k
        n_scored += k
        prev_end = end
        if end == N:
            break
    assert n_scored == N - 1  # every token after the first exactly once
    res = perplexity(llama, [text], max_length=max_len, stride=stride, batch_size=3)
    tp = res.texts[0]
    assert tp.n_predicted == N - 1 and res.n_truncated == 0
    assert tp.nll_sum == pytest.approx(nll_sum, rel=1e-5)


def test_forward_chunks_reducers_match_hidden_states(llama):
    from lmgeom.metrics import dispersion

    rows = [np.asarray(llama.tokenizer(t)["input_ids"]) for t in TEXTS]

    def last(h, mask):
        idx = mask.sum(1)  # positions 1..len-1 are counted, so this is len-1
        return h[torch.arange(h.shape[0]), idx].float()

    def disp(h, mask):
        return np.array([dispersion(h[b][mask[b]].double()) for b in range(h.shape[0])])

    res = forward_chunks(llama, rows, ("1", "3", "final"), {"last": last, "disp": disp},
                         reduce_from=1, batch_size=3)
    for i, r in enumerate(rows):
        with torch.no_grad():
            out = llama.hf_model(input_ids=torch.tensor([r]), output_hidden_states=True)
        hs = out.hidden_states
        for label, h in (("1", hs[1]), ("final", hs[-1])):
            np.testing.assert_allclose(res.reduced["last"][label][i], h[0, -1].numpy(), rtol=1e-4,
                                       atol=1e-5)
            H = h[0, 1:].double().numpy()  # reduce_from=1 leaves position 0 out
            U = H / np.linalg.norm(H, axis=1, keepdims=True)
            C = U @ U.T
            ref = 1 - (C.sum() - np.trace(C)) / (len(U) * (len(U) - 1))
            assert res.reduced["disp"][label][i] == pytest.approx(ref, rel=1e-5)
        lp = torch.log_softmax(out.logits[0].double(), -1)
        want = -sum(float(lp[t - 1, r[t]]) for t in range(1, len(r)))
        assert res.nll_sum[i] == pytest.approx(want, rel=1e-5)
        assert res.n_predicted[i] == len(r) - 1
    assert res.perplexity == pytest.approx(np.exp(res.nll_sum / res.n_predicted))


def test_forward_cache_resumes_after_a_crash(llama, tmp_path):
    rows = [np.asarray(llama.tokenizer(t)["input_ids"]) for t in TEXTS * 2]
    n_calls = []

    def flaky(h, mask):
        n_calls.append(1)
        if len(n_calls) == 3:
            raise KeyboardInterrupt  # killed during the third batch
        return mask.sum(1)

    kw = {"batch_size": 2, "cache": True, "cache_root": tmp_path}
    with pytest.raises(KeyboardInterrupt):
        forward_chunks(llama, rows, ("2",), {"count": flaky}, **kw)
    n_calls.clear()
    res = forward_chunks(llama, rows, ("2",), {"count": lambda h, m: m.sum(1)}, **kw)
    assert res.batches_cached == 2 and res.batches_computed == 2
    fresh = forward_chunks(llama, rows, ("2",), {"count": lambda h, m: m.sum(1)}, batch_size=2)
    np.testing.assert_allclose(res.nll_sum, fresh.nll_sum, rtol=1e-12)
    np.testing.assert_array_equal(res.reduced["count"]["2"], fresh.reduced["count"]["2"])
    again = forward_chunks(llama, rows, ("2",), {"count": lambda h, m: m.sum(1)}, **kw)
    assert again.batches_cached == 4 and again.batches_computed == 0


def test_cli_ppl_writes_table(tiny_dir, tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("\n".join(t.replace("\n", " ") for t in TEXTS) + "\n")
    out = tmp_path / "ppl.csv"
    model = str(tiny_dir("llama"))
    assert main(["ppl", "--model", model, "--texts", str(path), "--out", str(out), "--quiet",
                 "--max-length", "16", "--stride", "6"]) == 0
    text = capsys.readouterr().out
    df = pd.read_csv(out)
    ref = perplexity(lmgeom.load_model(model), [t.replace("\n", " ") for t in TEXTS],
                     max_length=16, stride=6)
    np.testing.assert_allclose(df.perplexity, ref.perplexities, rtol=1e-6)
    assert f"corpus perplexity {ref.corpus_perplexity:.4g}" in text
    assert main(["ppl", "--model", model, "--texts", str(path), "--out", str(tmp_path / "x.txt"),
                 "--quiet"]) == 2


@pytest.mark.slow
def test_smollm_matches_transformers_and_reads_english(smollm):
    english = ("The history of the city goes back to the Roman period, when a small settlement "
               "grew up around the river crossing.")
    words = english.split()
    shuffled = " ".join(np.random.default_rng(0).permutation(words))
    res = perplexity(smollm, [english, shuffled], batch_size=2)
    for text, tp in zip([english, shuffled], res.texts):
        ref, _ = _hf_ppl(smollm, text)
        assert abs(tp.perplexity / ref - 1) <= 1e-4
    assert res.texts[0].perplexity * 10 < res.texts[1].perplexity

