"""Helpers and fixtures shared by tests/unit/test_models_arch.py and tests/e2e/test_models_arch_e2e.py."""

from __future__ import annotations

import pytest
import torch

import lmgeom
from conftest import CORPUS, FAMILIES

TEXTS = CORPUS[:6]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tiny_dir):
    return lmgeom.load_model(str(tiny_dir(request.param)))


def make_capture(model, points, text):
    got = {}
    x = model.tokenizer([text], return_tensors="pt")
    with model.capture(points, lambda p, h: got.__setitem__(p, h[0].clone()), stop_early=False):
        with torch.no_grad():
            model.base_model(**x, use_cache=False)
    return got

