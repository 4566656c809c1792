"""Execution engines (the one meaning of "engine" in lmgeom): run lmgeom's jobs in this process (``local``) or on a Ray cluster (``ray``).

The unit of work is always a plain, picklable function call — a sweep job
(:func:`lmgeom.experiments.sweep.sweep_job`), one model of ``analyze``
(:func:`lmgeom.experiments.analyze.analyze_model`), or one batch of an extraction
(:func:`lmgeom.engines.ray_extract.extract_distributed`) — so both engines run the same code
and produce the same numbers. The ``ray`` engine:

* connects to ``--ray-address`` (or the ``RAY_ADDRESS`` environment variable, Ray's own
  convention; ``auto`` = the cluster this machine belongs to), else starts a private local Ray
  instance for this process (``--ray-num-cpus``);
* runs one Ray task per job, requesting ``--cpus-per-job`` CPUs and ``--gpus-per-job`` GPUs
  (a GPU job sees only its GPU through ``CUDA_VISIBLE_DEVICES`` and runs its forward on it);
* retries a failed job up to ``--retries`` times: the driver resubmits it, whether the job
  raised, its worker process died (killed, out of memory) or its node left the cluster, and
  counts every attempt (``TaskOutcome.attempts``, ``TaskOutcome.history``); a job
  that still fails is returned as a failure with the reason, and every other job's result
  is kept. A user error (any :class:`~lmgeom.errors.LmgeomError`: missing weights, a bad
  option, unusable texts) is deterministic and never retried, on either engine;
* forwards the ``LMGEOM_*`` environment variables set in this process to the workers, except
  ``LMGEOM_CACHE``: a node's activation cache is its own (the ``LMGEOM_CACHE`` its
  ``ray start`` was given, else ``~/.cache/lmgeom`` there).

Ray is an optional dependency (``pip install 'lmgeom[ray]'``); it is imported only when the
``ray`` engine is used, never by the local engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ConfigError, LmgeomError

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
#: failures that depend only on the user's inputs and settings (every
#: :class:`~lmgeom.errors.LmgeomError`): retrying cannot help. Subclasses defined elsewhere
#: are found by :func:`retryable` too.
NOT_RETRYABLE = ("LmgeomError", "ConfigError", "TextsError", "DataError", "ModelError",
                 "CacheError", "ClusterError")


@dataclass(frozen=True)
class EngineConfig:
    """Where and how jobs run (also the CLI's execution option group: each ``Attributes:``
    entry is the option's ``--help``).

    Attributes:
        engine: local: in this process, one job after another; ray: one Ray task per job on a
            Ray cluster (pip install 'lmgeom[ray]').
        address: Ray cluster to join (auto, host:6379, ray://host:10001; default $RAY_ADDRESS,
            else a private local Ray instance).
        cpus_per_job: CPUs each Ray job requests (also its torch / BLAS thread count).
        gpus_per_job: GPUs each Ray job requests (0: CPU jobs; 0.5 packs two jobs per GPU).
        retries: extra attempts for a failed job before it is reported as failed.
        num_cpus: CPUs of the private local Ray instance (default: all of this machine).
        workers: model-holding Ray actors sharing the batches of a distributed extraction
            (default: as many as the cluster fits, at most one per batch).
    """

    engine: str = field(default="local", metadata={"cli": {"choices": ENGINES}})
    address: str | None = field(default=None, metadata={"cli": {"flag": "--ray-address",
                                                                 "metavar": "ADDR"}})
    cpus_per_job: float = field(default=1.0, metadata={"cli": {"type": "positive_float"}})
    gpus_per_job: float = field(default=0.0, metadata={"cli": {"type": "nonneg_float"}})
    retries: int = field(default=2, metadata={"cli": {"type": "nonneg_int"}})
    num_cpus: int | None = field(default=None, metadata={"cli": {"flag": "--ray-num-cpus",
                                                                  "type": "positive_int"}})
    workers: int | None = field(default=None, metadata={"cli": {"type": "positive_int"}})

    def __post_init__(self) -> None:
        eng = normalize_engine(self.engine)
        object.__setattr__(self, "engine", eng)
        if self.cpus_per_job <= 0:
            raise ConfigError(f"--cpus-per-job must be > 0, got {self.cpus_per_job}")
        if self.gpus_per_job < 0:
            raise ConfigError(f"--gpus-per-job must be >= 0, got {self.gpus_per_job}")
        if self.retries < 0:
            raise ConfigError(f"--retries must be >= 0, got {self.retries}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if eng == "local" and (self.address or self.gpus_per_job or self.workers):
            raise ConfigError("--ray-address / --gpus-per-job / --workers need --engine ray")

    @property
    def threads(self) -> int:
        """torch / BLAS threads inside one job."""
        return max(1, int(self.cpus_per_job))

    def describe(self) -> dict[str, Any]:
        d = {"engine": self.engine, "retries": self.retries}
        if self.engine == "ray":
            d.update(address=self.address or os.environ.get("RAY_ADDRESS") or "local",
                     cpus_per_job=self.cpus_per_job, gpus_per_job=self.gpus_per_job)
        return d


def normalize_engine(name: str) -> str:
    """``local`` / ``ray`` (case and surrounding blanks ignored)."""
    n = str(name).strip().lower()
    if n not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
    return n


@dataclass
class TaskOutcome:
    """What one mapped call produced: its return value, or the error after every attempt.

    ``attempts`` counts every try (1 = it worked the first time); ``history`` holds one line
    per failed earlier attempt (``"attempt 1: WorkerCrashedError: ..."``), so a retried job
    says what went wrong before it succeeded.
    """

    value: Any
    error: str | None
    error_type: str | None
    attempts: int
    traceback: str | None = None
    exception: BaseException | None = None
    history: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def _user_error_names() -> set[str]:
    """Names of :class:`~lmgeom.errors.LmgeomError` and every subclass defined so far."""
    names: set[str] = set()
    todo: list[type] = [LmgeomError]
    while todo:
        cls = todo.pop()
        if cls.__name__ not in names:
            names.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return names


def retryable(error_type: str | None, exc: BaseException | None = None) -> bool:
    """Whether a failure may be retried: an infrastructure failure (a crash, a worker or node
    that died, an ``OSError``, out of memory) yes; a user error (an
    :class:`~lmgeom.errors.LmgeomError`, by its class when ``exc`` is given, else by the name
    ``error_type``) never: it would fail the same way again."""
    if isinstance(exc, LmgeomError):
        return False
    return error_type not in NOT_RETRYABLE and error_type not in _user_error_names()


def judge(value: Any, failure_of) -> tuple[str, str] | None:
    return failure_of(value) if failure_of is not None else None


#: ``(args, kwargs)`` of one call
Call = tuple[tuple, dict]


class Engine(Protocol):
    """Runs plain, picklable function calls and returns one :class:`TaskOutcome` per call.

    ``map(fn, calls)`` never raises for a failing call: the failure (after the bounded
    retries of :class:`EngineConfig`) is in its outcome, and every other call's value is kept.
    """

    config: EngineConfig

    def map(
        self,
        fn: Callable[..., Any],
        calls: Sequence[Call],
        *,
        failure_of: Callable[[Any], tuple[str, str] | None] | None = None,
        on_done: Callable[[int, TaskOutcome], None] | None = None,
        names: Sequence[str] | None = None,
    ) -> list[TaskOutcome]:
        """Run ``fn(*args, **kwargs)`` for every call.

        Args:
            fn: a module-level (importable, picklable) function.
            calls: ``(args, kwargs)`` per call.
            failure_of: for functions that *return* their failures (sweep jobs): ``result ->
                (error_type, message)`` or ``None`` when the result is a success.
            on_done: called in this process as each call finishes (in completion order), e.g.
                to write its result to a resumable cache at once.
            names: labels for log messages.

        Returns:
            One outcome per call, in call order. A retryable failure (not an
            :class:`~lmgeom.errors.LmgeomError`, :func:`retryable`) is attempted up to
            ``1 + config.retries`` times; a user error once.
        """
        ...
