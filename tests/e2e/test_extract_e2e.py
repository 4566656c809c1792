"""Extraction: pooling definitions, cache reuse/resume/corruption, round trips (tiny model).

End-to-end half (the unit half is tests/unit/test_extract.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.extract import make_states, tiny  # noqa: F401 (fixtures)

import lmgeom
from conftest import CORPUS
from lmgeom.activations import extract


@pytest.fixture(scope="module")
def gemma_tiny(tiny_dir):  # prepends BOS
    return lmgeom.load_model(str(tiny_dir("gemma3_text")))


def test_mean_pooling_definition(tiny, gemma_tiny):
    for model in (tiny, gemma_tiny):
        acts = extract(model, CORPUS[:4], pooling="mean", layers=[1], cache=False)
        for i, text in enumerate(CORPUS[:4]):
            hs, ids = make_states(model, text)
            start = 1 if model.bos_prepended else 0
            np.testing.assert_allclose(acts.layer("1")[i], hs[1][start:].mean(0), rtol=1e-4, atol=1e-5)
    assert gemma_tiny.bos_prepended and not tiny.bos_prepended


def test_tokens_pooling_is_a_seeded_sample_without_position_0(tiny):
    a = extract(tiny, CORPUS[:8], pooling="tokens", n_tokens=30, seed=3, layers=[2], cache=False)
    b = extract(tiny, CORPUS[:8], pooling="tokens", n_tokens=30, seed=3, layers=[2], cache=False)
    c = extract(tiny, CORPUS[:8], pooling="tokens", n_tokens=30, seed=4, layers=[2], cache=False)
    assert a.states.shape == (1, 30, 32)
    np.testing.assert_array_equal(a.states, b.states)
    assert not np.array_equal(a.row_pos, c.row_pos) or not np.array_equal(a.row_text, c.row_text)
    assert (a.row_pos >= 1).all()
    for r in range(30):  # each row is the state at the recorded (text, position)
        hs, _ = make_states(tiny, CORPUS[a.row_text[r]])
        np.testing.assert_allclose(a.states[0, r], hs[2][a.row_pos[r]], rtol=1e-4, atol=1e-5)

