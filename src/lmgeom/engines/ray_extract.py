"""Extraction of a large corpus on a Ray cluster: model-holding actors share the batches.

:func:`extract_distributed` gives exactly what :func:`~lmgeom.activations.extract` gives on one
machine — the same :class:`~lmgeom.activations.Activations`, the same cache key, the same
shards — because both build one :class:`~lmgeom.activations.core.ExtractionPlan` and run the
same per-batch code. The difference is who runs the forwards:

1. one actor loads the model (the driver never does: a 70B model needs only to fit on the
   workers) and builds the plan; the driver reads which shards of that key its cache already
   holds and verifies them;
2. up to ``--workers`` actors (each holding the model, ``--cpus-per-job`` CPUs /
   ``--gpus-per-job`` GPUs) compute the missing batches, two in flight per actor;
3. the driver writes every returned shard into *its* cache (``$LMGEOM_CACHE/activations``)
   as it arrives — atomically, sha256-verified, under the key's file lock — so an interrupted
   run resumes with the missing shards only, no shared file system is needed, and a later
   local ``lmgeom.extract`` (or ``lmgeom analyze``) with the same settings reads everything
   from the cache.

An actor that dies (its process killed or out of memory, its node gone) is replaced by a new
one, placed wherever the cluster has room, and the batches it held are resubmitted first; a
batch lost more than ``--retries`` times stops the extraction with a
:class:`~lmgeom.errors.ClusterError` (the shards already written stay in the cache, so a
rerun resumes). The driver does all of this itself (Ray's own actor restarts and task retries
are off) so it can count it: ``timings["batches_lost"]``, ``timings["workers_replaced"]``.
An error inside a batch (e.g. non-finite states) stops the extraction with that error, as a
local run would.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from .._testing import hold
from ..activations import Activations, plan_extraction, progress_bar
from ..errors import ClusterError, ConfigError, LmgeomError, TextsError
from ..texts import as_textset
from .base import EngineConfig
from .ray_cluster import ensure_ray, forwarded_env

log = logging.getLogger(__name__)


class ExtractWorker:
    """A Ray actor body: holds one loaded model and computes batches of extraction plans."""

    def __init__(self, spec: str, load_kwargs: dict[str, Any], threads: int | None) -> None:
        import torch

        from ..models import load_model

        if threads:
            torch.set_num_threads(int(threads))
        self.model = load_model(spec, **load_kwargs)
        self.plans: dict[str, Any] = {}

    def prepare(self, ts, params: dict[str, Any]) -> dict[str, Any]:
        plan = plan_extraction(self.model, ts, **params)
        self.plans[plan.key] = plan
        return {"plan": plan, "device": str(self.model.device)}

    def run(self, key: str, bi: int, boxed_ts: list, params: dict[str, Any]) -> dict[str, np.ndarray]:
        plan = self.plans.get(key)
        if plan is None:  # a restarted actor: rebuild the plan from the corpus in the store
            import ray

            plan = plan_extraction(self.model, ray.get(boxed_ts[0]), **params)
            if plan.key != key:  # pragma: no cover - the worker's model changed under us
                raise RuntimeError(f"plan key changed on a restarted worker ({plan.key} != {key})")
            self.plans[key] = plan
        hold("extract-batch")
        return plan.run_batch(self.model, bi)


def _n_workers(ray, cfg: EngineConfig, n_batches: int) -> int:
    if cfg.workers:
        return max(1, min(cfg.workers, n_batches))
    res = ray.cluster_resources()
    if cfg.gpus_per_job:
        fit = int(res.get("GPU", 0) // cfg.gpus_per_job)
    else:
        fit = int(res.get("CPU", 1) // cfg.cpus_per_job)
    return max(1, min(fit, n_batches))


def _unwrap(ray, exc: Exception) -> Exception:
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and cause is not None:
        return cause
    return exc


def extract_distributed(
    model: str,
    texts,
    *,
    engine: EngineConfig | None = None,
    load_kwargs: dict[str, Any] | None = None,
    layers="all",
    pooling: str = "last",
    max_length: int = 128,
    batch_size: int = 32,
    cache: bool = True,
    n_tokens: int = 2048,
    seed: int = 0,
    progress: bool | None = None,
    cache_root=None,
) -> Activations:
    """:func:`~lmgeom.activations.extract` on Ray actors (module docstring).

    Args:
        model: what :func:`~lmgeom.load_model` accepts on the workers (bundled name, hub id,
            folder path valid on the workers).
        texts: a :class:`~lmgeom.texts.TextSet`, list of strings or text spec (read here).
        engine: the Ray settings (address, CPUs / GPUs per actor, ``workers``, ``retries``).
        load_kwargs: ``dtype``, ``device``, ``revision``, ``device_map``,
            ``trust_remote_code`` for :func:`~lmgeom.load_model` on the workers.
        layers, pooling, max_length, batch_size, cache, n_tokens, seed, progress, cache_root:
            as in :func:`~lmgeom.activations.extract`.

    Returns:
        The same :class:`Activations` as a local extraction, with ``timings`` that also record
        the number of workers.
    """
    cfg = engine or EngineConfig(engine="ray")
    if cfg.engine != "ray":
        raise ConfigError("extract_distributed needs an EngineConfig with engine='ray'")
    if not isinstance(model, str):
        raise ConfigError("extract_distributed takes a model spec (name / hub id / folder), "
                          "which every worker loads itself; not a loaded model")
    t0 = time.perf_counter()
    ts = as_textset(texts)
    if len(ts) == 0:
        raise TextsError("the corpus is empty: nothing to extract")
    ray = ensure_ray(cfg)
    params = {"layers": layers, "pooling": pooling, "max_length": max_length,
              "batch_size": batch_size, "n_tokens": n_tokens, "seed": seed}
    env = forwarded_env()
    Actor = ray.remote(ExtractWorker).options(
        num_cpus=cfg.cpus_per_job, num_gpus=cfg.gpus_per_job or 0,
        max_restarts=0, max_task_retries=0,  # a dead actor is replaced below, and counted
        runtime_env={"env_vars": env} if env else None)
    ts_ref = ray.put(ts)
    lk = dict(load_kwargs or {})
    actors: list[Any] = []
    n_work = 0

    def new_actor() -> Any:
        actors.append(Actor.remote(model, lk, cfg.threads))
        return actors[-1]

    try:
        head = _prepare(ray, new_actor, ts_ref, params, cfg.retries)
        plan = head["plan"]
        store = plan.store(cache, cache_root)
        with store.lock():
            store.drop_stale()
            shards: list[dict[str, np.ndarray] | None] = [
                store.get(bi) for bi in range(len(plan.batches))]
            missing = [bi for bi, s in enumerate(shards) if s is None]
            n_work = _n_workers(ray, cfg, len(missing)) if missing else 0
            slots = [actors[-1]] + [new_actor() for _ in range(max(0, n_work - 1))]
            bar = progress_bar(len(plan.batches),
                               f"extract {plan.model_name} (ray x{max(n_work, 1)})", progress)
            bar.update(len(plan.batches) - len(missing))
            pool = _Pool(ray, slots, new_actor, cfg.retries,
                         lambda bi, a: a.run.remote(plan.key, bi, [ts_ref], params), missing)
            pool.run(store, shards, bar, plan.model_name)
            bar.close()
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    return plan.assemble([s for s in shards if s is not None], ts, timings={
        "extract_s": time.perf_counter() - t0, "batches_computed": len(missing),
        "batches_cached": len(plan.batches) - len(missing), "workers": n_work,
        "batches_lost": pool.lost, "workers_replaced": pool.replaced, "device": head["device"]})


class _Pool:
    """The missing batches on a pool of actors, two in flight per actor (that keeps one busy);
    a batch lost with its actor is resubmitted (at most ``retries`` times) and the dead actor
    replaced once (``gen``: each slot's actor incarnation)."""

    def __init__(self, ray, slots: list[Any], new_actor, retries: int, submit,
                 missing: list[int]) -> None:
        self.ray, self.slots, self.new_actor = ray, slots, new_actor
        self.retries, self.submit = retries, submit
        self.gen = [0] * len(slots)
        self.load = [0] * len(slots)
        self.queue = list(missing)
        self.tries = {bi: 0 for bi in missing}
        self.inflight: dict[Any, tuple[int, int, int]] = {}
        self.lost = self.replaced = 0

    def fill(self) -> None:
        for a in range(len(self.slots) if self.tries else 0):
            while self.load[a] < 2 and self.queue:
                bi = self.queue.pop(0)
                self.tries[bi] += 1
                self.load[a] += 1
                self.inflight[self.submit(bi, self.slots[a])] = (bi, a, self.gen[a])

    def run(self, store, shards: list, bar, model_name: str) -> None:
        """Every missing batch into ``store`` and ``shards``."""
        ray = self.ray
        self.fill()
        while self.inflight:
            done, _ = ray.wait(list(self.inflight), num_returns=1)
            ref = done[0]
            bi, a, g = self.inflight.pop(ref)
            if g == self.gen[a]:
                self.load[a] -= 1
            try:
                got = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = _unwrap(ray, exc)
                raise cause if isinstance(cause, LmgeomError) else exc
            except ray.exceptions.RayError as exc:  # the actor died (killed, OOM, node gone)
                self._lost(exc, bi, a, g, store, shards, model_name)
                self.fill()
                continue
            store.put(bi, got)
            shards[bi] = got
            bar.update(1)
            self.fill()

    def _lost(self, exc: Exception, bi: int, a: int, g: int, store, shards: list,
              model_name: str) -> None:
        self.lost += 1
        why = " ".join(str(exc).split())[:300]
        if self.tries[bi] > self.retries:
            done_n = sum(s is not None for s in shards)
            raise ClusterError(
                f"batch {bi} of {model_name} was lost {self.tries[bi]} times: Ray "
                f"workers keep dying ({type(exc).__name__}: {why}). {done_n} of "
                f"{len(shards)} shards are in the cache {store.dir}; rerun to "
                "resume (raise --retries, or check the nodes' memory)") from exc
        log.warning("batch %d lost with its Ray worker (%s); resubmitting it",
                    bi, type(exc).__name__)
        self.queue.insert(0, bi)
        if g == self.gen[a]:  # the first news of this actor's death: replace it once
            self.ray.kill(self.slots[a], no_restart=True)
            self.slots[a] = self.new_actor()
            self.gen[a] += 1
            self.load[a] = 0
            self.replaced += 1


def _prepare(ray, new_actor, ts_ref, params: dict[str, Any], retries: int) -> dict[str, Any]:
    """Load the model on a first actor and build the plan there (a new actor if it dies)."""
    for attempt in range(1 + retries):
        try:
            return ray.get(new_actor().prepare.remote(ts_ref, params))
        except ray.exceptions.RayTaskError as exc:
            cause = _unwrap(ray, exc)
            if isinstance(cause, LmgeomError):
                raise cause from None
            raise
        except ray.exceptions.RayError as exc:  # the actor died while loading the model
            if attempt == retries:
                raise ClusterError(f"the Ray worker loading the model died {1 + retries} times "
                                   f"({type(exc).__name__}); check the nodes' memory") from exc
            log.warning("the Ray worker loading the model died (%s); starting another",
                        type(exc).__name__)
    raise AssertionError("unreachable")  # pragma: no cover
