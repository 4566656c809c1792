"""Every supported family, on a tiny random model: structure, points, extraction identity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CORPUS, FAMILIES

import lmgeom
from lmgeom.errors import ConfigError

TEXTS = CORPUS[:6]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tiny_dir):
    return lmgeom.load_model(str(tiny_dir(request.param)))


def _capture(model, points, text):
    got = {}
    x = model.tokenizer([text], return_tensors="pt")
    with model.capture(points, lambda p, h: got.__setitem__(p, h[0].clone()), stop_early=False):
        with torch.no_grad():
            model.base_model(**x, use_cache=False)
    return got


def test_structure(tiny):
    L = tiny.n_blocks
    assert L == 3 and tiny.width == 32 and tiny.vocab_size == 256
    assert tiny.layer_labels == ("0", "1", "2", "3", "final")
    assert len(tiny.points) == 5 + 3 * 3
    assert tiny.W_U.shape == (256, 32)


def test_residual_points_match_hidden_states(tiny):
    """`0..L-1` and `final` equal transformers' hidden_states; `L` is the final norm's input."""
    text = TEXTS[0]
    got = _capture(tiny, tiny.layer_labels, text)
    x = tiny.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = tiny.hf_model(**x, output_hidden_states=True)
    hs = out.hidden_states
    for i in range(tiny.n_blocks):
        torch.testing.assert_close(got[str(i)], hs[i][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["final"], hs[-1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tiny.apply_final_norm(got[str(tiny.n_blocks)]), got["final"])
    # the readout of `final` gives the model's logits
    torch.testing.assert_close(tiny.readout(got["final"]), out.logits[0], rtol=1e-4, atol=1e-4)


def test_sublayer_points_sum_to_block_update(tiny):
    """block_out − block_in == attn_out + ffn_out, for every block and family."""
    pts = tiny.resolve_points(["all", "sublayers"])
    got = _capture(tiny, pts, TEXTS[1])
    for i in range(1, tiny.n_blocks + 1):
        delta = got[str(i)] - got[str(i - 1)]
        torch.testing.assert_close(delta, got[f"{i}.attn_out"] + got[f"{i}.ffn_out"], rtol=1e-4, atol=1e-5)
        assert got[f"{i}.ffn_in"].shape == got[str(i)].shape


def test_ffn_in_is_normed_input(tiny):
    """For sequential pre-norm blocks ffn_in = pre-FFN-norm(residual after attention)."""
    if tiny.model_type not in ("llama", "mistral", "qwen2", "qwen3", "olmo", "phi3"):
        pytest.skip("architecture without a sequential pre-FFN norm")
    got = _capture(tiny, ["0", "1.attn_out", "1.ffn_in"], TEXTS[2])
    norm = tiny.blocks[0].post_attention_layernorm
    with torch.no_grad():
        torch.testing.assert_close(norm(got["0"] + got["1.attn_out"]), got["1.ffn_in"], rtol=1e-5, atol=1e-5)


def test_padding_never_leaks(tiny):
    """The same text alone and in a padded batch gives the same pooled vector."""
    short = "Hi."
    alone = {p: lmgeom.extract(tiny, [short], pooling=p, cache=False) for p in ("last", "mean")}
    batch = {p: lmgeom.extract(tiny, [TEXTS[0], short, TEXTS[3]], pooling=p, cache=False, batch_size=3)
             for p in ("last", "mean")}
    for p in ("last", "mean"):
        np.testing.assert_allclose(alone[p].states[:, 0], batch[p].states[:, 1], rtol=1e-4, atol=1e-5)


def test_resolve_points_errors(tiny):
    with pytest.raises(ConfigError, match="out of range"):
        tiny.resolve_points(7)
    with pytest.raises(ConfigError, match="unknown measurement point"):
        tiny.resolve_points("2.foo")
    assert tiny.resolve_points(-1) == ("3",)
    assert tiny.resolve_points("1-2,final") == ("1", "2", "final")
    assert tiny.resolve_points("last.attn_out") == ("3.attn_out",)
