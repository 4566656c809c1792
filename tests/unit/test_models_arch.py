"""Every supported family, on a tiny random model: structure, points, extraction identity."""

from __future__ import annotations

import pytest
import torch
from support.models_arch import TEXTS, make_capture, tiny  # noqa: F401 (fixtures)

from lmgeom.errors import ConfigError


def test_structure(tiny):
    L = tiny.n_blocks
    assert L == 3 and tiny.width == 32 and tiny.vocab_size == 256
    assert tiny.layer_labels == ("0", "1", "2", "3", "final")
    assert len(tiny.points) == 5 + 3 * 3
    assert tiny.W_U.shape == (256, 32)


def test_ffn_in_is_normed_input(tiny):
    """For sequential pre-norm blocks ffn_in = pre-FFN-norm(residual after attention)."""
    if tiny.model_type not in ("llama", "mistral", "qwen2", "qwen3", "olmo", "phi3"):
        pytest.skip("architecture without a sequential pre-FFN norm")
    got = make_capture(tiny, ["0", "1.attn_out", "1.ffn_in"], TEXTS[2])
    norm = tiny.blocks[0].post_attention_layernorm
    with torch.no_grad():
        torch.testing.assert_close(norm(got["0"] + got["1.attn_out"]), got["1.ffn_in"], rtol=1e-5, atol=1e-5)


def test_resolve_points_errors(tiny):
    with pytest.raises(ConfigError, match="out of range"):
        tiny.resolve_points(7)
    with pytest.raises(ConfigError, match="unknown measurement point"):
        tiny.resolve_points("2.foo")
    assert tiny.resolve_points(-1) == ("3",)
    assert tiny.resolve_points("1-2,final") == ("1", "2", "final")
    assert tiny.resolve_points("last.attn_out") == ("3.attn_out",)

