"""Every supported family, on a tiny random model: structure, points, extraction identity.

End-to-end half (the unit half is tests/unit/test_models_arch.py).
"""

from __future__ import annotations

import numpy as np
import torch
from support.models_arch import TEXTS, make_capture, tiny  # noqa: F401 (fixtures)

import lmgeom


def test_residual_points_match_hidden_states(tiny):
    """`0..L-1` and `final` equal transformers' hidden_states; `L` is the final norm's input."""
    text = TEXTS[0]
    got = make_capture(tiny, tiny.layer_labels, text)
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
    got = make_capture(tiny, pts, TEXTS[1])
    for i in range(1, tiny.n_blocks + 1):
        delta = got[str(i)] - got[str(i - 1)]
        torch.testing.assert_close(delta, got[f"{i}.attn_out"] + got[f"{i}.ffn_out"], rtol=1e-4, atol=1e-5)
        assert got[f"{i}.ffn_in"].shape == got[str(i)].shape


def test_padding_never_leaks(tiny):
    """The same text alone and in a padded batch gives the same pooled vector."""
    short = "Hi."
    alone = {p: lmgeom.extract(tiny, [short], pooling=p, cache=False) for p in ("last", "mean")}
    batch = {p: lmgeom.extract(tiny, [TEXTS[0], short, TEXTS[3]], pooling=p, cache=False, batch_size=3)
             for p in ("last", "mean")}
    for p in ("last", "mean"):
        np.testing.assert_allclose(alone[p].states[:, 0], batch[p].states[:, 1], rtol=1e-4, atol=1e-5)

