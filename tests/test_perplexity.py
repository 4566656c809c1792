"""Perplexity and the shared forward pass: agreement with a direct transformers computation,
padding invariance, the sliding window, the logits-memory bound, the cache and the CLI."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import lmgeom
from lmgeom.cli import main
from lmgeom.errors import ConfigError, DataError, TextsError
from lmgeom.lm import forward_chunks, perplexity, sliding_windows

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b",
    ("Prices rose sharply in the third quarter, analysts said on Monday. Language models map "
     "contexts to next-token distributions."),
    "Let x be a real number such that x^2 = 4.",
]


def _hf_ppl(model, text: str) -> tuple[float, int]:
    """Perplexity of one text from the full model's own loss (labels = input ids)."""
    ids = model.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        loss = model.hf_model(input_ids=ids, labels=ids).loss.item()
    return math.exp(loss), ids.shape[1]


def _explicit_nll(model, ids: list[int], score_from: int = 1) -> float:
    """Summed NLL of positions score_from.. from an explicit log_softmax of all logits."""
    x = torch.tensor([ids])
    with torch.no_grad():
        lp = torch.log_softmax(model.hf_model(input_ids=x).logits[0].double(), -1)
    return float(-sum(lp[t - 1, ids[t]] for t in range(score_from, len(ids))))


@pytest.fixture(scope="module")
def llama(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))


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
        assert tp.nll_sum == pytest.approx(_explicit_nll(llama, ids), rel=1e-5)


def test_padding_and_chunking_do_not_change_values(llama):
    alone = [perplexity(llama, [t], batch_size=1).texts[0].perplexity for t in TEXTS]
    batched = perplexity(llama, TEXTS, batch_size=4, position_chunk=3).perplexities
    other = perplexity(llama, TEXTS[::-1], batch_size=2, position_chunk=1000).perplexities[::-1]
    np.testing.assert_allclose(batched, alone, rtol=1e-5)
    np.testing.assert_allclose(other, alone, rtol=1e-5)


def test_truncation_is_counted(llama):
    res = perplexity(llama, TEXTS, max_length=8)
    assert res.n_truncated == sum(len(llama.tokenizer(t)["input_ids"]) > 8 for t in TEXTS)
    assert all(t.n_tokens <= 8 for t in res.texts)
    ids = llama.tokenizer(TEXTS[2])["input_ids"][:8]
    assert res.texts[2].nll_sum == pytest.approx(_explicit_nll(llama, ids), rel=1e-5)


def test_max_length_is_clamped_to_the_model_context(tiny_dir):
    model = lmgeom.load_model(str(tiny_dir("gpt2")))  # 128 positions
    long = " ".join(TEXTS) * 3
    res = perplexity(model, [long], max_length=512)
    assert res.texts[0].n_tokens == 128 and res.n_truncated == 1
    with pytest.raises(ConfigError, match="at most 128"):
        forward_chunks(model, [np.ones(200, dtype=np.int64)])


def test_sliding_window_equals_plain_when_text_fits(llama):
    plain = perplexity(llama, TEXTS, max_length=128)
    slid = perplexity(llama, TEXTS, max_length=128, stride=16)
    assert slid.n_windows == len(TEXTS)
    np.testing.assert_allclose(slid.perplexities, plain.perplexities, rtol=1e-6)


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


def test_sliding_windows_cover_each_token_once():
    for n, L, s in [(1, 4, 1), (10, 4, 1), (37, 8, 3), (100, 16, 15), (16, 16, 5)]:
        scored = []
        for b, e, f in sliding_windows(n, L, s):
            assert 0 < e - b <= L and f >= 1
            scored += list(range(b + f, e))
        assert scored == list(range(1, n))


def test_readout_never_sees_more_than_position_chunk(llama, monkeypatch):
    seen = []
    orig = type(llama).readout

    def spy(self, h):
        seen.append(tuple(h.shape))
        return orig(self, h)

    monkeypatch.setattr(type(llama), "readout", spy)
    perplexity(llama, TEXTS, batch_size=4, position_chunk=7)
    assert seen and all(len(s) == 2 and s[0] <= 7 for s in seen)
    n_scored = sum(len(llama.tokenizer(t)["input_ids"]) - 1 for t in TEXTS)
    assert sum(s[0] for s in seen) == n_scored  # pads are never scored


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


def test_forward_chunks_without_nll_stops_early(llama):
    rows = [np.asarray(llama.tokenizer(t)["input_ids"]) for t in TEXTS]
    calls = []
    orig = llama.final_norm.forward

    def spy(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    llama.final_norm.forward = spy
    try:
        res = forward_chunks(llama, rows, ("1",), {"n": lambda h, m: m.sum(1)}, nll=False)
    finally:
        del llama.final_norm.forward
    assert not calls  # the forward stopped after block 1
    assert res.reduced["n"]["1"].tolist() == [len(r) for r in rows]
    assert (res.n_predicted == 0).all()


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


def test_input_errors(llama):
    with pytest.raises(ConfigError, match="stride"):
        perplexity(llama, TEXTS, max_length=16, stride=16)
    with pytest.raises(ConfigError, match="max_length"):
        perplexity(llama, TEXTS, max_length=1)
    with pytest.raises(TextsError):
        perplexity(llama, [])
    with pytest.raises(DataError, match="out of range"):
        forward_chunks(llama, [np.array([1, 2, 10_000])])
    with pytest.raises(ConfigError, match="nothing to compute"):
        forward_chunks(llama, [np.array([1, 2, 3])], nll=False)
    with pytest.raises(ConfigError, match="score_from"):
        forward_chunks(llama, [np.array([1, 2, 3])], score_from=0)


def test_single_token_text_is_nan_and_left_out(llama):
    res = forward_chunks(llama, [np.array([5]), np.array([5, 6, 7])])
    assert res.n_predicted.tolist() == [0, 2]
    assert math.isnan(res.perplexity[0]) and np.isfinite(res.perplexity[1])


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
