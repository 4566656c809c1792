"""Perplexity and the shared forward pass: agreement with a direct transformers computation,
padding invariance, the sliding window, the logits-memory bound, the cache and the CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.perplexity import TEXTS, explicit_nll, llama  # noqa: F401 (fixtures)

import lmgeom
from lmgeom.errors import ConfigError, DataError, TextsError
from lmgeom.lm import forward_chunks, perplexity, sliding_windows


def test_truncation_is_counted(llama):
    res = perplexity(llama, TEXTS, max_length=8)
    assert res.n_truncated == sum(len(llama.tokenizer(t)["input_ids"]) > 8 for t in TEXTS)
    assert all(t.n_tokens <= 8 for t in res.texts)
    ids = llama.tokenizer(TEXTS[2])["input_ids"][:8]
    assert res.texts[2].nll_sum == pytest.approx(explicit_nll(llama, ids), rel=1e-5)


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

