"""Helpers and fixtures shared by tests/unit/test_extract.py and tests/e2e/test_extract_e2e.py."""

from __future__ import annotations

import pytest
import torch

import lmgeom


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))


def make_states(model, text):
    x = model.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = model.hf_model(**x, output_hidden_states=True)
    return [h[0].numpy() for h in out.hidden_states], x["input_ids"][0]

