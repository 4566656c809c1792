"""The geometry trajectory of lmgeom's own training runs (``lmgeom suite train``, ``lmgeom train``):
a :func:`~lmgeom.training.loop.train_loop` hook around :class:`lmgeom.monitor.GeometryMonitor`
that measures at chosen steps and keeps ``geometry.parquet`` in the run's folder up to date.

* **When**: at the start (step 0 of a fresh run), at every step in ``at_steps`` (the suite: its
  checkpoint steps, so the z-by-step table lines up with the saved checkpoints), every ``every``
  steps (``0``: never by count) and at the last step.
* **Resume**: the file is rewritten atomically after each measurement, and a resumed run reads it
  back and skips steps already measured, so an interrupted run ends with the same table (the
  monitor restores the model's modes and random generators, so training itself is unchanged:
  tests/e2e/test_train_geometry.py).
* **Where**: ``<folder>/geometry.parquet``, lmgeom's tidy table with ``revision = "step<N>"`` and
  ``model`` = the suite's width label or the fine-tuning arm; :func:`combine` gathers several
  into one table (the suite's root ``geometry.parquet``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .._io import atomic_path, written_by_lmgeom
from ..errors import ConfigError

log = logging.getLogger(__name__)

GEOMETRY_FILE = "geometry.parquet"
#: the probe set of lmgeom's own runs: smaller than the monitor's default (256) so a width-suite
#: model or a 135M fine-tune pays a few per cent (benchmarks/bench_monitor.py)
PROBE_TEXTS = 128


def _step_of(revision: str) -> int | None:
    return int(revision[4:]) if isinstance(revision, str) and revision.startswith("step") \
        and revision[4:].isdigit() else None


def read_geometry(path: str | Path) -> pd.DataFrame | None:
    """The rows of a ``geometry.parquet`` lmgeom wrote (``None`` when absent or not lmgeom's: a
    file someone else put there is neither read nor replaced)."""
    path = Path(path)
    if not path.is_file():
        return None
    if not written_by_lmgeom(path):
        raise ConfigError(f"{path} was not written by lmgeom; move it away (lmgeom writes the "
                          "geometry trajectory there)")
    return pd.read_parquet(path)


class GeometryRecorder:
    """A step hook: ``recorder(step, entry)`` measures when the step is due and rewrites the
    parquet. Build it with :func:`make_recorder`.

    Args:
        monitor: the :class:`~lmgeom.monitor.GeometryMonitor` (its ``every`` is ignored; the
            recorder decides the steps).
        path: the ``geometry.parquet`` to keep up to date.
        at_steps: steps always measured.
        every: also measure every this many steps (0: only ``at_steps`` and the last step).
        last_step: the run's final step (always measured).
    """

    def __init__(self, monitor: Any, path: str | Path, *, at_steps: Iterable[int] = (),
                 every: int = 0, last_step: int | None = None) -> None:
        if int(every) < 0:
            raise ConfigError(f"--geometry-every must be >= 0 (0: only at checkpoints), got {every}")
        self.monitor, self.path = monitor, Path(path)
        self.at = {int(s) for s in at_steps}
        self.every, self.last = int(every), last_step
        self.prior = read_geometry(self.path)
        self.done = set() if self.prior is None else {
            s for s in map(_step_of, self.prior["revision"].unique()) if s is not None}

    def due(self, step: int) -> bool:
        if step in self.done:
            return False
        return (step in self.at or step == self.last
                or (self.every > 0 and step % self.every == 0))

    def start(self, step: int) -> None:
        """Measure the starting point of a fresh run (step 0)."""
        if step == 0 and 0 not in self.done:
            self._measure(0)

    def __call__(self, step: int, entry: dict[str, float] | None = None) -> None:
        if self.due(int(step)):
            self._measure(int(step))

    def _measure(self, step: int) -> None:
        self.monitor.measure(step)
        self.done.add(step)
        self.write()

    def rows(self) -> pd.DataFrame:
        """Every measured row: read back from an earlier (interrupted) run, then this one."""
        new = self.monitor.rows()
        if self.prior is None or self.prior.empty:
            return new
        return pd.concat([self.prior, new], ignore_index=True)

    def write(self) -> Path:
        with atomic_path(self.path) as tmp:
            self.rows().to_parquet(tmp, index=False)
        return self.path


def make_recorder(model: Any, tokenizer: Any, folder: str | Path, *, name: str,
                  at_steps: Iterable[int] = (), every: int = 0, last_step: int | None = None,
                  probe_texts: Any = None, n_texts: int = PROBE_TEXTS, seed: int = 0,
                  layers: Any = None) -> GeometryRecorder:
    """A :class:`GeometryRecorder` writing ``folder/geometry.parquet`` for ``model`` (a
    ``transformers`` causal LM or PeftModel being trained), rows labelled ``name``."""
    from ..monitor.core import GeometryMonitor

    monitor = GeometryMonitor(model, probe_texts, tokenizer=tokenizer, layers=layers,
                              every=10**9, seed=seed, n_texts=n_texts, name=name)
    return GeometryRecorder(monitor, Path(folder) / GEOMETRY_FILE, at_steps=at_steps,
                            every=every, last_step=last_step)


def combine(paths: Sequence[str | Path], out: str | Path) -> Path | None:
    """Concatenate several ``geometry.parquet`` files (each run's ``model`` column keeps them
    apart) into ``out``; ``None`` when none exists."""
    frames = [f for f in (read_geometry(p) for p in paths) if f is not None and not f.empty]
    if not frames:
        return None
    out = Path(out)
    with atomic_path(out) as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)
    return out


__all__ = ["GEOMETRY_FILE", "PROBE_TEXTS", "GeometryRecorder", "combine", "make_recorder",
           "read_geometry"]
