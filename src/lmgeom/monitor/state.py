"""What a measurement during training must leave exactly as it found it: the model's train / eval
mode (per module) and every random number generator training draws from.

:func:`preserved` wraps one monitor call: it records the ``training`` flag of every module of the
model and the states of the CPU torch generator, of every initialised CUDA device's generator,
of Python's ``random`` and of NumPy's global generator, and restores all of them on the way
out (also after an error), so a training run with the monitor is bit-identical to one without.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np


def rng_states() -> dict[str, Any]:
    """The states of torch (CPU and every initialised CUDA device), ``random`` and NumPy's
    global generator."""
    import torch

    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                           "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned."""
    import torch

    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def preserved(model: Any) -> Iterator[None]:
    """Run the body with ``model`` in eval mode, without gradients; restore every module's
    ``training`` flag and every generator's state afterwards.

    Args:
        model: a ``torch.nn.Module`` (the modules whose mode is saved and restored).
    """
    import torch

    modes = [(m, m.training) for m in model.modules()]
    states = rng_states()
    try:
        model.eval()
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training
        set_rng_states(states)


__all__ = ["preserved", "rng_states", "set_rng_states"]
