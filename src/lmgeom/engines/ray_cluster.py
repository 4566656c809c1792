"""The ``ray`` engine: one Ray task per call on a Ray cluster (or a private local instance).

Ray is an optional dependency (``pip install 'lmgeom[ray]'``), imported only here.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import ConfigError
from .base import EngineConfig, TaskOutcome, judge, retryable

log = logging.getLogger(__name__)


def import_ray():
    """``ray``, or a :class:`ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--engine ray needs Ray: pip install 'lmgeom[ray]' (or pip install "
                          "'ray[default]'), then rerun") from exc
    return ray


#: per-node settings that are never forwarded: a path on the driver means nothing on a worker
NODE_LOCAL_ENV = ("LMGEOM_CACHE",)


def forwarded_env() -> dict[str, str]:
    """The ``LMGEOM_*`` variables of this process, passed on to Ray workers (except the
    per-node ones, :data:`NODE_LOCAL_ENV`: each node keeps its own activation cache)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith("LMGEOM_") and k not in NODE_LOCAL_ENV}


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


def failure_of_ray_error(ray, exc: BaseException) -> tuple[str, str, str | None, BaseException]:
    """``(error_type, message, traceback, exception)`` of what ``ray.get`` raised: the job's
    own exception for a ``RayTaskError``, else Ray's (worker died, node died, ...)."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        return type(cause).__name__, f"{type(cause).__name__}: {cause}", str(exc)[-2000:], cause
    text = " ".join(str(exc).split())
    return type(exc).__name__, f"{type(exc).__name__}: {text[:400]}", None, exc


class RayEngine:
    """Runs each call as a Ray task (see :class:`~lmgeom.engines.base.Engine`). Every failed
    attempt — an exception inside the call, a worker process that died, a node that left the
    cluster — is resubmitted by the driver (bounded by ``config.retries``) and counted, so
    ``attempts`` and ``history`` say what happened; Ray's own silent task retries are off."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        ensure_ray(config)

    def map(self, fn, calls, *, failure_of=None, on_done=None, names=None) -> list[TaskOutcome]:
        cfg = self.config
        names = list(names) if names is not None else [f"job {i}" for i in range(len(calls))]
        ray = ensure_ray(cfg)
        remote = ray.remote(fn).options(
            num_cpus=cfg.cpus_per_job, num_gpus=cfg.gpus_per_job or 0,
            max_retries=0,            # worker / node crashes: resubmitted (and counted) below
            retry_exceptions=False,   # exceptions: judged and resubmitted below
            runtime_env={"env_vars": forwarded_env()} if forwarded_env() else None,
        )
        pending: dict[Any, tuple[int, int]] = {}
        history: dict[int, list[str]] = {i: [] for i in range(len(calls))}
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
                    fail = judge(value, failure_of)
                except ray.exceptions.RayError as exc:  # the call raised, its worker / node died
                    etype, msg, tb, err = failure_of_ray_error(ray, exc)
                    value, fail = None, (etype, msg)
                if fail is not None and attempt <= cfg.retries and retryable(fail[0], err):
                    log.warning("%s failed (attempt %d of %d): %s; retrying", names[i], attempt,
                                1 + cfg.retries, fail[1])
                    history[i].append(f"attempt {attempt}: {fail[1]}"[:500])
                    submit(i, attempt + 1)
                    continue
                res = TaskOutcome(value, None if fail is None else fail[1],
                                  None if fail is None else fail[0], attempt, tb, err,
                                  history=history[i])
                out[i] = res
                if on_done is not None:
                    on_done(i, res)
        except BaseException:  # Ctrl-C, or on_done failed (disk full): stop what is queued
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return [o for o in out if o is not None]
