"""Execution engines: run lmgeom's jobs in this process (``local``) or on a Ray cluster (``ray``).

The unit of work is always a plain, picklable function call — a sweep job
(:func:`lmgeom.experiments.sweep.sweep_job`), one model of ``analyze``
(:func:`lmgeom.commands.analyze.analyze_one`), or one batch of an extraction
(:func:`lmgeom.activations.distributed.extract_distributed`) — so both engines run the same code
and produce the same numbers. The ``ray`` engine:

* connects to ``--ray-address`` (or the ``RAY_ADDRESS`` environment variable, Ray's own
  convention; ``auto`` = the cluster this machine belongs to), else starts a private local Ray
  instance for this process (``--ray-num-cpus``);
* runs one Ray task per job, requesting ``--cpus-per-job`` CPUs and ``--gpus-per-job`` GPUs
  (a GPU job sees only its GPU through ``CUDA_VISIBLE_DEVICES`` and runs its forward on it);
* retries a failed job up to ``--retries`` times (a crashed worker through Ray's own task
  retries, an exception inside the job by resubmitting it); a job that still fails is
  returned as a failure and every other job's result is kept;
* forwards the ``LMGEOM_*`` environment variables set in this process (``LMGEOM_CACHE`` ...)
  to the workers.

Ray is an optional dependency (``pip install 'lmgeom[ray]'``); it is imported only when the
``ray`` engine is used, never by the local engine.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
#: failures that depend only on the user's settings: retrying cannot help
NOT_RETRYABLE = ("ConfigError", "TextsError", "DataError")


@dataclass(frozen=True)
class EngineConfig:
    """Where and how jobs run.

    Attributes:
        engine: ``local`` (this process, one job after another) or ``ray``.
        address: Ray cluster address (``auto``, ``ray://host:10001``, ``host:6379``); ``None``:
            ``$RAY_ADDRESS`` if set, else a private local instance.
        cpus_per_job: CPUs a job requests (also its torch / BLAS thread count).
        gpus_per_job: GPUs a job requests (fractions allowed, e.g. 0.5 to pack two per GPU).
        retries: extra attempts for a failed job (bounded; 0 = none).
        num_cpus: CPUs of a private local instance (``None``: all of this machine).
        workers: model-holding actors of a distributed extraction (``None``: as many as the
            cluster's CPUs (or GPUs) allow, at most one per batch).
    """

    engine: str = "local"
    address: str | None = None
    cpus_per_job: float = 1.0
    gpus_per_job: float = 0.0
    retries: int = 2
    num_cpus: int | None = None
    workers: int | None = None

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
    """``local`` / ``ray``; ``serial`` is accepted as the old name of ``local``."""
    n = str(name).strip().lower()
    if n == "serial":
        n = "local"
    if n not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
    return n


# --------------------------------------------------------------------------- CLI


def add_engine_args(p, *, extraction: bool = False) -> None:
    """``--engine``, ``--ray-address``, ``--cpus-per-job``, ``--gpus-per-job``, ``--retries``."""
    g = p.add_argument_group("execution (see README: Running on a cluster)")
    g.add_argument("--engine", default="local", choices=["local", "ray", "serial"],
                   help="local: in this process; ray: one Ray task per job on a Ray cluster "
                        "(pip install 'lmgeom[ray]')")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join (auto, host:6379, ray://host:10001; default "
                        "$RAY_ADDRESS, else a private local Ray instance)")
    g.add_argument("--ray-num-cpus", type=int, default=None,
                   help="CPUs of the private local Ray instance (default: all)")
    g.add_argument("--cpus-per-job", type=float, default=1.0,
                   help="CPUs each Ray job requests (also its torch thread count)")
    g.add_argument("--gpus-per-job", type=float, default=0.0,
                   help="GPUs each Ray job requests (0: CPU jobs; 0.5 packs two jobs per GPU)")
    g.add_argument("--retries", type=int, default=2,
                   help="extra attempts for a failed job before it is reported as failed")
    if extraction:
        g.add_argument("--workers", type=int, default=None,
                       help="model-holding Ray actors sharing the batches (default: as many as "
                            "the cluster fits, at most one per batch)")


def engine_from_args(args) -> EngineConfig:
    """The engine of a command's options; with ``--engine ray`` Ray is started (or joined) and
    the requested resources checked now, before any output folder is written."""
    cfg = EngineConfig(engine=args.engine, address=args.ray_address,
                       cpus_per_job=args.cpus_per_job, gpus_per_job=args.gpus_per_job,
                       retries=args.retries, num_cpus=args.ray_num_cpus,
                       workers=getattr(args, "workers", None))
    if cfg.engine == "ray":
        ensure_ray(cfg)
    return cfg


# --------------------------------------------------------------------------- ray


def import_ray():
    """``ray``, or a :class:`ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--engine ray needs Ray: pip install 'lmgeom[ray]' (or pip install "
                          "'ray[default]'), then rerun") from exc
    return ray


def forwarded_env() -> dict[str, str]:
    """The ``LMGEOM_*`` variables of this process, passed on to Ray workers."""
    return {k: v for k, v in os.environ.items() if k.startswith("LMGEOM_")}


def ensure_ray(cfg: EngineConfig):
    """Connect to (or start) Ray once per process; returns the ``ray`` module."""
    ray = import_ray()
    if not ray.is_initialized():
        _init_ray(ray, cfg)
    res = ray.cluster_resources()
    if cfg.gpus_per_job > res.get("GPU", 0):
        raise ConfigError(f"--gpus-per-job {cfg.gpus_per_job:g} but the Ray cluster has "
                          f"{res.get('GPU', 0):g} GPUs; jobs would wait forever")
    if cfg.cpus_per_job > res.get("CPU", 0):
        raise ConfigError(f"--cpus-per-job {cfg.cpus_per_job:g} but the Ray cluster has "
                          f"{res.get('CPU', 0):g} CPUs; jobs would wait forever")
    return ray


def _init_ray(ray, cfg: EngineConfig) -> None:
    address = cfg.address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"log_to_driver": True, "configure_logging": False}
    if address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs.update(include_dashboard=False, num_cpus=cfg.num_cpus)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "a local instance"
        raise ConfigError(f"could not start or join Ray ({where}): {exc}. Start a head node with "
                          "`ray start --head` and pass --ray-address auto, or leave "
                          "--ray-address out for a private local instance") from exc
    res = ray.cluster_resources()
    log.info("Ray: %s CPUs, %s GPUs", res.get("CPU", 0), res.get("GPU", 0))


@dataclass
class TaskOutcome:
    """What one mapped call produced: its return value, or the error after every attempt."""

    value: Any
    error: str | None
    error_type: str | None
    attempts: int
    traceback: str | None = None
    exception: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _retryable(error_type: str | None) -> bool:
    return error_type not in NOT_RETRYABLE


def map_calls(
    fn: Callable[..., Any],
    calls: Sequence[tuple[tuple, dict]],
    cfg: EngineConfig,
    *,
    failure_of: Callable[[Any], tuple[str, str] | None] | None = None,
    on_done: Callable[[int, TaskOutcome], None] | None = None,
    names: Sequence[str] | None = None,
) -> list[TaskOutcome]:
    """Run ``fn(*args, **kwargs)`` for every call on the configured engine, with retries.

    Args:
        fn: a module-level (importable, picklable) function.
        calls: ``(args, kwargs)`` per call; values are sent to the workers (Ray object refs in
            them are resolved there).
        failure_of: for functions that *return* their failures (sweep jobs): ``result ->
            (error_type, message)`` or ``None`` when the result is a success.
        on_done: called in this process as each call finishes (in completion order), e.g. to
            write its result to a resumable cache at once.
        names: labels for log messages.

    Returns:
        One :class:`TaskOutcome` per call, in call order. A call whose failure is retryable (not
        a ConfigError / TextsError / DataError) is attempted up to ``1 + cfg.retries`` times.
    """
    names = list(names) if names is not None else [f"job {i}" for i in range(len(calls))]
    if cfg.engine == "local":
        return _map_local(fn, calls, cfg, failure_of, on_done, names)
    return _map_ray(fn, calls, cfg, failure_of, on_done, names)


def _judge(value: Any, failure_of) -> tuple[str, str] | None:
    return failure_of(value) if failure_of is not None else None


def _map_local(fn, calls, cfg, failure_of, on_done, names) -> list[TaskOutcome]:
    out: list[TaskOutcome] = []
    for i, (args, kwargs) in enumerate(calls):
        attempt = 0
        while True:
            attempt += 1
            try:
                value = fn(*args, **kwargs)
                fail = _judge(value, failure_of)
                tb = None
            except Exception as exc:  # noqa: BLE001 - one job must never end the others
                value, fail, tb = None, (type(exc).__name__, f"{type(exc).__name__}: {exc}"), \
                    traceback.format_exc(limit=8)
                err = exc
            else:
                err = None
            if fail is None:
                res = TaskOutcome(value, None, None, attempt)
                break
            if attempt <= cfg.retries and _retryable(fail[0]):
                log.warning("%s failed (attempt %d of %d): %s; retrying", names[i], attempt,
                            1 + cfg.retries, fail[1])
                continue
            res = TaskOutcome(value, fail[1], fail[0], attempt, tb, err)
            break
        if on_done is not None:
            on_done(i, res)
        out.append(res)
    return out


def _map_ray(fn, calls, cfg, failure_of, on_done, names) -> list[TaskOutcome]:
    ray = ensure_ray(cfg)
    remote = ray.remote(fn).options(
        num_cpus=cfg.cpus_per_job, num_gpus=cfg.gpus_per_job or 0,
        max_retries=cfg.retries,  # worker / node crashes: Ray resubmits by itself
        retry_exceptions=False,   # exceptions: judged and resubmitted below
        runtime_env={"env_vars": forwarded_env()} if forwarded_env() else None,
    )
    pending: dict[Any, tuple[int, int]] = {}
    shared: dict[int, Any] = {}  # an object passed to several calls goes to the store once

    def ref_of(v: Any) -> Any:
        if v is None or isinstance(v, (str, int, float, bool)):
            return v
        if id(v) not in shared:
            shared[id(v)] = ray.put(v)
        return shared[id(v)]

    def submit(i: int, attempt: int) -> None:
        args, kwargs = calls[i]
        pending[remote.remote(*[ref_of(a) for a in args],
                              **{k: ref_of(v) for k, v in kwargs.items()})] = (i, attempt)

    for i in range(len(calls)):
        submit(i, 1)
    out: list[TaskOutcome | None] = [None] * len(calls)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            i, attempt = pending.pop(ref)
            tb, err = None, None
            try:
                value = ray.get(ref)
                fail = _judge(value, failure_of)
            except ray.exceptions.RayTaskError as exc:  # the function raised
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                value, fail, tb = None, (type(cause).__name__, f"{type(cause).__name__}: {cause}"), str(exc)[-2000:]
                err = cause
            except ray.exceptions.RayError as exc:  # worker died, object lost, ...
                value, fail, tb = None, (type(exc).__name__, f"{type(exc).__name__}: {exc}"), None
                err = exc
            if fail is not None and attempt <= cfg.retries and _retryable(fail[0]):
                log.warning("%s failed (attempt %d of %d): %s; retrying", names[i], attempt,
                            1 + cfg.retries, fail[1])
                submit(i, attempt + 1)
                continue
            res = TaskOutcome(value, None if fail is None else fail[1],
                              None if fail is None else fail[0], attempt, tb, err)
            out[i] = res
            if on_done is not None:
                on_done(i, res)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return [o for o in out if o is not None]
