"""Helpers and fixtures shared by tests/unit/test_losses.py and tests/e2e/test_losses_e2e.py."""

from __future__ import annotations


# ---------------------------------------------------------------------- on a model
def make_tiny(tiny_dir, family="llama"):
    from lmgeom.models import load_model

    return load_model(tiny_dir(family), device="cpu")

