"""``GeometryCallback``: the :class:`~lmgeom.monitor.GeometryMonitor` inside a
``transformers.Trainer``.

Every ``every`` optimiser steps (and at step 0 and the last step) it measures the model and

* logs ``geometry/<metric>/<layer>`` through the Trainer's own ``log()``, so every reporter the
  Trainer was given (TensorBoard, W&B, MLflow, CSV...) receives the numbers, at the training
  step, next to the loss (TensorBoard and W&B show them as ``train/geometry/...``: their
  own prefix for training-time keys);
* rewrites ``<output_dir>/geometry.parquet`` (lmgeom's tidy table, ``revision = "step<N>"``;
  :meth:`~lmgeom.monitor.GeometryMonitor.rows`) through lmgeom's atomic writer, so a killed run
  keeps every measurement made so far and ``lmgeom sweep``'s figures read it.

A callback does not see the Trainer, so attach it to the one it should log through::

    trainer = Trainer(model=model, args=args, train_dataset=train, processing_class=tok)
    GeometryCallback(every=100).attach(trainer)
    trainer.train()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .._io import check_replaceable
from ..errors import ConfigError
from .core import DEFAULT_EVERY, GeometryMonitor

#: the parquet's file name inside the Trainer's output_dir (unless ``path`` is given)
TABLE_NAME = "geometry.parquet"


class GeometryCallback(TrainerCallback):
    """A ``TrainerCallback`` that measures the geometry every ``every`` steps.

    Args:
        monitor: a ready :class:`GeometryMonitor`; ``None`` builds one at the start of training
            from the Trainer's model and tokenizer (``processing_class``) with ``probe_texts``,
            ``every`` and ``monitor_kwargs``.
        probe_texts: see :class:`GeometryMonitor` (default: 256 texts of ``builtin:domains``).
        every: steps between measurements (default :data:`~lmgeom.monitor.core.DEFAULT_EVERY`).
        path: where the parquet goes (default: ``<output_dir>/geometry.parquet``).
        **monitor_kwargs: more :class:`GeometryMonitor` arguments (``layers``, ``seed``, ...).
    """

    def __init__(self, monitor: GeometryMonitor | None = None, *, probe_texts: Any = None,
                 every: int | None = None, path: str | Path | None = None,
                 **monitor_kwargs: Any) -> None:
        if monitor is not None and (probe_texts is not None or every is not None
                                    or monitor_kwargs):
            raise ConfigError("give either a GeometryMonitor or its arguments, not both")
        self.monitor = monitor
        self._kwargs = {"probe_texts": probe_texts, "every": every or DEFAULT_EVERY,
                        **monitor_kwargs}
        self.path = None if path is None else Path(path)
        self.trainer: Any = None

    def attach(self, trainer: Any) -> GeometryCallback:
        """Log through ``trainer`` (and add this callback to it once). Returns ``self``."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.trainer is None:
            raise ConfigError("GeometryCallback logs through the Trainer: add it with "
                              "GeometryCallback(...).attach(trainer), not callbacks=[...]")
        if self.path is None:
            self.path = Path(args.output_dir) / TABLE_NAME
        check_replaceable(self.path, what="the geometry table")  # before the first step
        if self.monitor is None:
            self.monitor = GeometryMonitor(model, tokenizer=processing_class, **self._kwargs)
        self._record(state, control, force=True)

    def on_step_end(self, args, state, control, **kwargs):
        self._record(state, control, force=state.global_step >= state.max_steps > 0)

    def on_train_end(self, args, state, control, **kwargs):
        self._record(state, control, force=True)

    def _record(self, state, control, *, force: bool) -> None:
        assert self.monitor is not None
        rows = self.monitor.step(state.global_step, force=force)
        if not rows:
            return
        if state.is_world_process_zero:
            self.monitor.to_parquet(self.path)
        # Trainer.log runs the reporters' on_log, which clears should_log: keep the Trainer's
        # own decision to log the loss at this step
        should_log = control.should_log
        self.trainer.log(self.monitor.log_values(rows))
        control.should_log = should_log


__all__ = ["TABLE_NAME", "GeometryCallback"]
