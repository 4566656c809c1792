"""Helpers and fixtures shared by tests/unit/test_select.py and tests/e2e/test_select_e2e.py."""

from __future__ import annotations

import math

import pytest
import torch

ALPHAS = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def suite(tiny_dir, tmp_path_factory):
    """A fake 'suite': one tiny llama whose digit rows of W_U move from one shared direction
    (alpha = 0: D(T) = 0) to independent random directions (alpha = 1), saved as
    <root>/w32/step0, step100, step200 — a known, increasing dispersion gap."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tiny_dir("llama")
    tok = AutoTokenizer.from_pretrained(src)
    digits = [tok(str(i), add_special_tokens=False)["input_ids"][0] for i in range(10)]
    root = tmp_path_factory.mktemp("suite")
    g = torch.Generator().manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(src)
    W0 = base.lm_head.weight.detach().clone()
    d = W0.shape[1]
    others = torch.ones(W0.shape[0], dtype=torch.bool)
    others[digits] = False
    m = W0[others].mean(0)
    c = torch.randn(d, generator=g)
    c -= (c @ m) / (m @ m) * m  # shared direction orthogonal to the other rows' mean
    c = c / c.norm() * W0[others].norm(dim=1).mean()
    R = torch.randn(len(digits), d, generator=g) * W0[others].norm(dim=1).mean() / math.sqrt(d)
    for step, a in zip((0, 100, 200), ALPHAS):
        model = AutoModelForCausalLM.from_pretrained(src)
        with torch.no_grad():
            model.lm_head.weight[digits] = (1 - a) * c + a * R
        out = root / "w32" / f"step{step}"
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return root

