"""The experiment protocol, the same for every analysis of the two papers.

An experiment is a frozen config dataclass (every setting, plain values) with

* ``command`` — its name (``analyze``, ``sweep``, ...), also the CLI sub-command;
* ``table`` — the stem of its tidy results table in the run folder (``layers``, ``sweep``, ...);
* ``settings()`` — the dict the run's signature hashes (what changes the numbers);
* ``run(work_dir=None, progress=None)`` — computes and returns a result.

A result has ``rows()`` (the tidy table, :mod:`lmgeom.results.table`), ``manifest()`` (seeds,
timings, models ...), ``figures(folder, manifest)`` (plots + ``report.html``) and
``summary()`` (the text the CLI prints). :func:`run_experiment` is what both the CLI and a
Python user call to get the same run folder::

    from lmgeom.experiments import AnalyzeConfig, run_experiment
    run = run_experiment(AnalyzeConfig(models=("smollm2-135m",)), "runs/demo")
    run.result.rows()          # the tidy table; run.folder.path / "report.html"

Experiments register themselves (:func:`register`), so ``experiment_for("analyze")`` finds
the config class by name.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import pandas as pd

from ..errors import ConfigError
from ..results.folder import RunFolder


class ExperimentResult(Protocol):
    def rows(self) -> pd.DataFrame: ...

    def manifest(self) -> dict[str, Any]: ...

    def figures(self, folder: RunFolder, manifest: dict[str, Any]) -> Path | None: ...

    def summary(self) -> str: ...


class Experiment(Protocol):
    command: ClassVar[str]
    table: ClassVar[str]

    def settings(self) -> dict[str, Any]: ...

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> ExperimentResult: ...


@dataclass
class Run:
    """A finished run: the result, its folder and the report page (``None`` without one)."""

    result: Any
    folder: RunFolder
    report: Path | None

    @property
    def path(self) -> Path:
        return self.folder.path


def run_experiment(experiment: Experiment, out: str | Path, *, overwrite: bool = False,
                   progress: bool | None = None, report: bool = True) -> Run:
    """Run ``experiment`` into the run folder ``out``: lock and check the folder (a different
    run there needs ``overwrite``), run with ``out/.work`` as its resume state, then write the
    table, the plots and report, and the manifest (:meth:`RunFolder.save`)."""
    with RunFolder.create(out, experiment.command, experiment.settings(),
                          overwrite=overwrite, table=experiment.table) as folder:
        result = experiment.run(work_dir=folder.work, progress=progress)
        page = folder.save(result, table=experiment.table, report=report)
    return Run(result, folder, page)


_REGISTRY: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register(cls: T) -> T:
    """Class decorator: make an experiment config findable by its ``command``."""
    name = getattr(cls, "command", None)
    if not name:
        raise TypeError(f"{cls.__name__} has no 'command'")
    _REGISTRY[name] = cls
    return cls


def experiment_for(command: str) -> type:
    """The registered experiment config class of ``command``."""
    from . import registry  # noqa: F401 - imports every experiment module, which registers

    try:
        return _REGISTRY[command]
    except KeyError:
        raise ConfigError(f"no experiment named {command!r}; known: "
                          f"{', '.join(sorted(_REGISTRY))}") from None


def registered() -> dict[str, type]:
    from . import registry  # noqa: F401

    return dict(_REGISTRY)


def timed(timings: dict[str, float], key: str) -> Callable[..., Any]:
    """``with timed(t, "load_s"):`` adds the block's wall time to ``t[key]``."""
    @contextlib.contextmanager
    def _cm():
        t0 = time.perf_counter()
        try:
            yield
        finally:
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0

    return _cm()


__all__ = ["Experiment", "ExperimentResult", "Run", "experiment_for", "register", "registered",
           "run_experiment", "timed"]
