"""Padding correctness (issue 18): a text's pooled states are the same alone and inside a batch
with longer texts, with right and with left padding, for every architecture in the registry
(tiny random models) and for the bundled smollm2-135m; and position ids must come from the
attention mask (with ``0..T-1`` a left-padded row is shifted).

The max deviation per architecture is printed (``pytest -s``) and is in every failure
message."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lmgeom
from conftest import CORPUS, FAMILIES
from lmgeom.activations.core import encode_texts
from lmgeom.activations.forward import Batch, forward_batch, pad_batch, position_ids_from_mask
from lmgeom.lm.scoring import forward_chunks

SHORT = "Hi there."
LONG = [CORPUS[0] + " " + CORPUS[3], CORPUS[1]]
TOL = 1e-5
DEVIATIONS: dict[tuple[str, str], float] = {}


def _deviation(model, texts, short_at: int, side: str) -> tuple[float, float]:
    """Max |alone - in batch| over last and mean pooling and every layer, absolute and relative
    to the layer's largest |state| (residual streams of real models reach norms in the
    hundreds, so an absolute float32 rounding error scales with them)."""
    dev = rel = 0.0
    for pooling in ("last", "mean"):
        alone = lmgeom.extract(model, [texts[short_at]], pooling=pooling, cache=False,
                               padding_side=side)
        batch = lmgeom.extract(model, texts, pooling=pooling, cache=False, padding_side=side,
                               batch_size=len(texts))
        assert np.isfinite(batch.states).all()
        diff = np.abs(batch.states[:, short_at] - alone.states[:, 0]).max(1)  # per layer
        scale = np.abs(alone.states[:, 0]).max(1)
        dev = max(dev, float(diff.max()))
        rel = max(rel, float((diff / np.maximum(scale, 1e-30)).max()))
    return dev, rel


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tiny_dir):
    return request.param, lmgeom.load_model(str(tiny_dir(request.param)))


@pytest.mark.parametrize("side", ["right", "left"])
def test_pooled_states_do_not_depend_on_the_batch(tiny, side):
    family, model = tiny
    texts = [LONG[0], SHORT, LONG[1]]
    dev, rel = _deviation(model, texts, 1, side)
    DEVIATIONS[(family, side)] = dev
    print(f"\npadding {side:5s} {family:13s} max deviation {dev:.3g} (relative {rel:.3g})")
    assert dev < TOL, f"{family}, {side} padding: max deviation {dev:.3g} >= {TOL}"


def test_left_and_right_padding_agree(tiny):
    family, model = tiny
    texts = [LONG[0], SHORT, LONG[1]]
    for pooling in ("last", "mean"):
        r = lmgeom.extract(model, texts, pooling=pooling, cache=False, batch_size=3)
        l_ = lmgeom.extract(model, texts, pooling=pooling, cache=False, batch_size=3,
                            padding_side="left")
        dev = float(np.abs(r.states - l_.states).max())
        assert dev < TOL, f"{family} {pooling}: left vs right padding differ by {dev:.3g}"


def test_perplexity_and_reductions_do_not_depend_on_padding(tiny_dir):
    model = lmgeom.load_model(str(tiny_dir("gpt2")))
    rows = list(encode_texts(model, [LONG[0], SHORT, LONG[1]], 64).ids)

    def mean_state(h, mask):
        w = mask[..., None].to(torch.float32)
        return (h.float().masked_fill(~mask[..., None], 0) * w).sum(1) / w.sum(1)

    r = forward_chunks(model, rows, ("2",), {"m": mean_state}, reduce_from=1, batch_size=3)
    l_ = forward_chunks(model, rows, ("2",), {"m": mean_state}, reduce_from=1, batch_size=3,
                        padding_side="left")
    np.testing.assert_array_equal(r.n_predicted, l_.n_predicted)
    np.testing.assert_allclose(l_.nll_sum, r.nll_sum, rtol=1e-5)
    np.testing.assert_allclose(l_.reduced["m"]["2"], r.reduced["m"]["2"], atol=TOL)


def test_position_ids_must_come_from_the_mask(tiny_dir):
    """GPT-2 has absolute position embeddings: under left padding, position ids ``0..T-1``
    (what a forward without explicit position ids uses) shift the short row and change its
    states; the primitive's mask-derived ids give the states it has alone."""
    model = lmgeom.load_model(str(tiny_dir("gpt2")))
    rows = list(encode_texts(model, [LONG[0], SHORT], 64).ids)
    assert len(rows[1]) < len(rows[0])

    def last(label, h, batch):
        return h[torch.arange(h.shape[0]), batch.last].float().numpy()

    alone = forward_batch(model, pad_batch(model, rows, [1]), ["2"], last)["2"][0]
    good = pad_batch(model, rows, [0, 1], padding_side="left")
    naive = Batch(good.index, good.input_ids, good.attention_mask,
                  torch.arange(good.input_ids.shape[1])[None].expand_as(good.input_ids),
                  padding_side="left")
    ok = forward_batch(model, good, ["2"], last)["2"][1]
    bad = forward_batch(model, naive, ["2"], last)["2"][1]
    assert np.abs(ok - alone).max() < TOL
    assert np.abs(bad - alone).max() > 1e-2, "position ids 0..T-1 should shift a left-padded row"


def test_position_ids_from_mask():
    m = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(m).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2],
                                                 [0, 1, 2, 3, 4]]


@pytest.mark.slow
@pytest.mark.parametrize("side", ["right", "left"])
def test_bundled_model_pooled_states_do_not_depend_on_the_batch(smollm, side):
    texts = [LONG[0], SHORT, LONG[1]]
    dev, rel = _deviation(smollm, texts, 1, side)
    DEVIATIONS[("smollm2-135m", side)] = dev
    print(f"\npadding {side:5s} smollm2-135m  max deviation {dev:.3g} (relative {rel:.3g})")
    # float32 through 30 blocks: batched matmuls of different shapes round differently, and
    # the residual stream reaches |h| in the hundreds, so the bound is relative
    assert rel < 1e-4, (f"smollm2-135m, {side} padding: max deviation {dev:.3g} "
                        f"(relative {rel:.3g})")
