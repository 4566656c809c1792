"""Helpers and fixtures shared by tests/unit/test_knnlm.py and tests/e2e/test_knnlm_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest

import lmgeom


@pytest.fixture(scope="module")
def llama(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))


def make_rows(model, text: str, T: int) -> np.ndarray:
    ids = np.asarray(model.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    n = len(ids) // T
    return ids[: n * T].reshape(n, T)

