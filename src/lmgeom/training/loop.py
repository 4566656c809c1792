"""The one training loop of lmgeom: the width suite (:mod:`lmgeom.training.suite`) and the
push-away / squeeze fine-tuning (:mod:`lmgeom.experiments.finetune`) both run
:func:`train_loop`.

One step (:func:`optimisation_step`): set the learning rate, forward under ``autocast`` through
an *objective* (``objective(model, batch) -> {"total": loss, ...}``: :func:`lm_objective` for
plain next-token cross-entropy, :func:`aux_objective` for the push-away / squeeze term), check
the loss is finite (before it can touch the weights), backward, clip the gradient norm, step the
optimiser, zero the gradients.

The loop knows nothing about evaluation, checkpoints or result rows: after every optimiser step
it calls its **hooks** with the step count and the step's log entry. A hook is either a callable
``hook(step, entry) -> bool | None`` or an object with a ``step(step)`` method (e.g. a geometry
monitor that looks at the model every N steps); a true return value from any hook stops the
loop after that step (every hook still runs for it). Evaluation, checkpoints, progress bars and
"stop after N steps" are hooks of the caller.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError

#: a step hook: ``hook(step, entry) -> bool | None`` or an object with ``.step(step)``
Hook = Any


def show_progress(progress: bool | None) -> bool:
    """Whether a training progress bar shows: ``progress`` when given, else when stderr is a
    terminal and ``LMGEOM_QUIET`` is not set."""
    if progress is None:
        return sys.stderr.isatty() and not os.environ.get("LMGEOM_QUIET")
    return bool(progress)


def lm_objective(model, batch: Mapping[str, Any]) -> dict[str, Any]:
    """Plain causal-LM cross-entropy on ``batch["input_ids"]`` (the labels are the inputs):
    ``{"total": loss, "lm_loss": loss}``."""
    x = batch["input_ids"]
    loss = model(input_ids=x, labels=x).loss
    return {"total": loss, "lm_loss": loss}


def aux_objective(aux) -> Callable[[Any, Mapping[str, Any]], dict[str, Any]]:
    """The objective ``L_CE + λ · L_aux`` of a :class:`~lmgeom.training.losses.DispersionLoss`
    (:func:`~lmgeom.training.losses.forward_with_aux`): ``{"total", "lm_loss", "dispersion",
    "aux"}``."""

    def objective(model, batch: Mapping[str, Any]) -> dict[str, Any]:
        from .losses import forward_with_aux

        out = forward_with_aux(model, batch, aux)
        return {"lm_loss": out.lm_loss, "dispersion": out.dispersion, "aux": out.aux,
                "total": out.total}

    return objective


def _value(v: Any) -> float:
    return float(v.detach().float()) if hasattr(v, "detach") else float(v)


def optimisation_step(model, optimizer, params: Sequence[Any], batch: Mapping[str, Any],
                      objective: Callable[[Any, Mapping[str, Any]], dict[str, Any]], *,
                      lr: float, grad_clip: float = 0.0,
                      autocast: Callable[[], Any] = contextlib.nullcontext,
                      what: str = "training", hint: str = "lower --lr",
                      step: int = 0) -> dict[str, float]:
    """One step (see the module docstring). Returns the log entry: every value the objective
    returned (as floats), then ``lr`` and ``grad_norm`` (``nan`` without clipping).

    Raises:
        ConfigError: the loss is not finite (``what`` and ``hint`` name the run and the fix).
    """
    import torch

    for g in optimizer.param_groups:
        g["lr"] = lr
    with autocast():
        parts = objective(model, batch)
    total = parts["total"]
    if not torch.isfinite(total):
        raise ConfigError(f"{what}: the loss became non-finite ({_value(total)}) at step "
                          f"{step + 1}; {hint}")
    total.backward()
    gnorm = (float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
             if grad_clip > 0 else float("nan"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {**{k: _value(v) for k, v in parts.items()}, "lr": lr, "grad_norm": gnorm}


def call_hooks(hooks: Iterable[Hook], step: int, entry: dict[str, float]) -> bool:
    """Run every hook for ``step``; true when a callable hook returns true (asks the loop to
    stop). An object hook's ``.step(step)`` only observes: what it returns (e.g. the rows of
    :meth:`lmgeom.monitor.GeometryMonitor.step`) never stops training."""
    stop = False
    for hook in hooks:
        fn = getattr(hook, "step", None)
        if callable(fn):
            fn(step)
        else:
            stop = bool(hook(step, entry)) or stop
    return stop


def train_loop(model, optimizer, params: Iterable[Any], *, start: int, steps: int,
               batch_at: Callable[[int], Mapping[str, Any]], lr_at: Callable[[int], float],
               objective: Callable[[Any, Mapping[str, Any]], dict[str, Any]] = lm_objective,
               grad_clip: float = 0.0, autocast: Callable[[], Any] = contextlib.nullcontext,
               hooks: Sequence[Hook] = (), what: str = "training",
               hint: str = "lower --lr") -> int:
    """Optimiser steps ``start .. steps − 1`` (0-based) of :func:`optimisation_step`.

    Args:
        model: the module to train (a ``transformers`` model or a PEFT wrapper).
        optimizer: its optimiser.
        params: the parameters whose gradient norm is clipped (in a fixed order).
        start: the first step to run (a resumed run's step count).
        steps: run until this many steps are done.
        batch_at: ``batch_at(step)`` → the batch (a dict with ``input_ids``...) of 0-based
            ``step``; must be a pure function of the step for a resumed run to continue
            exactly (:class:`~lmgeom.training.schedule.BatchSchedule`).
        lr_at: ``lr_at(step)`` → the learning rate of 0-based ``step``.
        objective: ``objective(model, batch) → {"total": loss, ...}`` (:func:`lm_objective`,
            :func:`aux_objective`).
        grad_clip: max global gradient norm (0: no clipping).
        autocast: a context-manager factory around the forward (e.g. bf16 autocast).
        hooks: called **after each optimiser step** (the weights are already updated), in
            order, each with ``(s, entry)`` where ``s`` is the number of steps done (``step +
            1``) and ``entry`` the step's log entry plus ``step`` (= ``s``) and ``seconds``
            (the step's wall time); or, for an object with a ``step`` method (a monitor),
            ``hook.step(s)``. Any true return value stops the loop after this step.
        what, hint: name of the run and the fix suggested when the loss becomes non-finite.

    Returns:
        The number of steps run by this call.
    """
    params = list(params)
    hooks = list(hooks)
    ran = 0
    for step in range(start, steps):
        t0 = time.perf_counter()
        entry = optimisation_step(model, optimizer, params, batch_at(step), objective,
                                  lr=lr_at(step), grad_clip=grad_clip, autocast=autocast,
                                  what=what, hint=hint, step=step)
        entry = {"step": step + 1, **entry, "seconds": time.perf_counter() - t0}
        ran += 1
        if call_hooks(hooks, step + 1, entry):
            break
    return ran


__all__ = ["Hook", "aux_objective", "call_hooks", "lm_objective", "optimisation_step",
           "show_progress", "train_loop"]
