"""The dispersion regulariser family (training/regularisers.py): each variant's value on a case
computed by hand, its gradient's effect on the dispersion (a small step on the states, and a
few optimiser steps on a tiny model), selection by name, and the shared token handling.

End-to-end half (the unit half is tests/unit/test_regularisers.py).
"""

from __future__ import annotations

import numpy as np
import torch

from lmgeom.training import forward_with_aux, make_aux_loss
from lmgeom.training.regularisers import DIRECTION, REGULARISERS


def _trained_dispersion(tiny_dir, name, lam=1.0, steps=8):
    from lmgeom.models import load_model

    model = load_model(tiny_dir("llama"), device="cpu").hf_model
    model.train()
    g = torch.Generator().manual_seed(1)  # test_losses' batch: two rows padded
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    batch = {"input_ids": torch.randint(4, 256, (4, 16), generator=g), "attention_mask": mask}
    loss = make_aux_loss(name, lam=lam)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        out = forward_with_aux(model, batch, loss)
        assert np.isfinite(float(out.total))
        out.total.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return float(forward_with_aux(model, batch, loss).dispersion)


def test_training_steps_on_a_tiny_model_move_dispersion(tiny_dir):
    """8 Adam steps of L_CE + L_aux: the dispersion ends above (below, for squeeze) where the
    same steps of L_CE alone leave it."""
    plain = _trained_dispersion(tiny_dir, "none")
    for name in REGULARISERS:
        if name == "none":
            continue
        got = _trained_dispersion(tiny_dir, name)
        if DIRECTION[name]:
            assert (got - plain) * DIRECTION[name] > 0.01, (name, plain, got)
        else:  # covariance: decorrelation barely moves d (module docstring: +0.01 measured)
            assert abs(got - plain) < 0.05, (name, plain, got)

