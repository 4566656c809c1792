"""Helpers and fixtures shared by tests/unit/test_perplexity.py and tests/e2e/test_perplexity_e2e.py."""

from __future__ import annotations

import pytest
import torch

import lmgeom

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b",
    ("Prices rose sharply in the third quarter, analysts said on Monday. Language models map "
     "contexts to next-token distributions."),
    "Let x be a real number such that x^2 = 4.",
]


def explicit_nll(model, ids: list[int], score_from: int = 1) -> float:
    """Summed NLL of positions score_from.. from an explicit log_softmax of all logits."""
    x = torch.tensor([ids])
    with torch.no_grad():
        lp = torch.log_softmax(model.hf_model(input_ids=x).logits[0].double(), -1)
    return float(-sum(lp[t - 1, ids[t]] for t in range(score_from, len(ids))))


@pytest.fixture(scope="module")
def llama(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))

