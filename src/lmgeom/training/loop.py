"""The training loop of lmgeom's fine-tuning (``lmgeom train``): one optimisation step after
another with the push-away / squeeze objective, resumable through :mod:`.checkpoint`.

The loop knows nothing about evaluation or result rows: after every step it hands the step's
log entry to ``on_step``, which evaluates, checkpoints or stops (returns ``True``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigError


def optimisation_step(model, optimizer, params: Iterable[Any], batch: dict[str, Any], aux, *,
                      lr: float, grad_clip: float = 0.0,
                      autocast: Callable[[], Any] = contextlib.nullcontext,
                      what: str = "training", step: int = 0) -> dict[str, float]:
    """One step: set the learning rate, forward with the auxiliary loss
    (:func:`~lmgeom.training.losses.forward_with_aux`), check the loss is finite, backward,
    clip the gradient norm (``grad_clip > 0``), step, zero the gradients. Returns the log
    entry (lm_loss, dispersion, aux, total, lr, grad_norm)."""
    import torch

    from .losses import forward_with_aux

    params = list(params)
    for g in optimizer.param_groups:
        g["lr"] = lr
    with autocast():
        out = forward_with_aux(model, batch, aux)
    if not torch.isfinite(out.total):
        raise ConfigError(f"{what}: the loss became non-finite at step {step + 1}; lower "
                          "--lr or --lambda")
    out.total.backward()
    gnorm = (float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
             if grad_clip > 0 else float("nan"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"lm_loss": float(out.lm_loss.detach()), "dispersion": float(out.dispersion),
            "aux": float(out.aux.detach()), "total": float(out.total.detach()), "lr": lr,
            "grad_norm": gnorm}


def train_steps(model, optimizer, params: Iterable[Any], aux, *, start: int, steps: int,
                batch_at: Callable[[int], dict[str, Any]], lr_at: Callable[[int], float],
                grad_clip: float = 0.0, autocast: Callable[[], Any] = contextlib.nullcontext,
                on_step: Callable[[int, dict[str, float]], bool | None] | None = None,
                what: str = "training") -> int:
    """Steps ``start .. steps - 1`` of :func:`optimisation_step`; after each, ``on_step(s,
    entry)`` with ``s`` = steps done and the entry (plus ``step`` and ``seconds``); a true
    return value stops the loop. Returns the number of steps run."""
    params = list(params)
    ran = 0
    for step in range(start, steps):
        t0 = time.perf_counter()
        entry = optimisation_step(model, optimizer, params, batch_at(step), aux,
                                  lr=lr_at(step), grad_clip=grad_clip, autocast=autocast,
                                  what=what, step=step)
        entry = {"step": step + 1, **entry, "seconds": time.perf_counter() - t0}
        ran += 1
        if on_step is not None and on_step(step + 1, entry):
            break
    return ran


__all__ = ["optimisation_step", "train_steps"]
