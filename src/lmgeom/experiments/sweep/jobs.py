"""The unit of work of the scale × training-time sweep (:mod:`lmgeom.experiments.sweep`
runs them): one model × checkpoint (:class:`JobSpec`) analysed by
:func:`sweep_job` into a :class:`JobResult` (plain, picklable arguments; an ordinary failure is
returned, never raised), its cache key, and the job lists (a suite's checkpoints or models)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..._io import stable_hash
from ..._testing import fail_once
from ...errors import ConfigError, LmgeomError
from ...results import table
from ...results.table import step_of
from ...training.suite_manifest import read_suite, suite_checkpoints
from ..analyze import analyze_model
from ..layer_sweep import LayerSweepConfig, config_dict
from ..options import ModelOptions

log = logging.getLogger(__name__)

#: part of every job's cache key: "2" added the tidy table's ``flag`` column (low-sample
#: values), so jobs cached without it are recomputed (same numbers, now flagged)
SWEEP_VERSION = "2"


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobSpec:
    """One model × checkpoint to analyse.

    Attributes:
        model: the ``model`` column (``w128`` for a suite width, else the spec as given).
        spec: what :func:`~lmgeom.models.load_model` gets (a folder, hub id, bundled name).
        revision: the ``revision`` column (``step512``; ``""`` for none).
        hub_revision: the revision passed to the hub (``None`` for folders).
        step: training step of the checkpoint, when known.
        width: d, when known before loading.
        weights_sha256: the weights hash, when known before loading (suite manifests).
        val_loss: held-out loss of the checkpoint, when known (suites).
    """

    model: str
    spec: str
    revision: str = ""
    hub_revision: str | None = None
    step: int | None = None
    width: int | None = None
    weights_sha256: str | None = None
    val_loss: float | None = None

    @property
    def name(self) -> str:
        return f"{self.model}@{self.revision}" if self.revision else self.model


@dataclass(frozen=True)
class JobOptions:
    """How a job loads and runs its model (plain values; part of the job's cache key where
    they change results).

    Attributes:
        dtype: forward-pass dtype (``float32`` default).
        device: torch device for the forward pass (``None``: CUDA if available).
        cache: use the activation cache.
        threads: torch / BLAS threads inside the job (``None``: leave as is).
        k: readout dimension, an int or ``"auto"`` (min(100, d // 4), per model).
        trust_remote_code: passed to the loader.
        device_map: transformers ``device_map`` (``auto`` spreads a big model over the
            machine's GPUs / CPU with accelerate).
    """

    dtype: str = "float32"
    device: str | None = None
    cache: bool = True
    threads: int | None = 1
    k: int | str = "auto"
    trust_remote_code: bool = False
    device_map: str | None = None


@dataclass
class JobResult:
    """What one job produced: its rows, facts about the model, or the error that stopped it."""

    job: JobSpec
    frame: pd.DataFrame | None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.frame is not None


def job_key(job: JobSpec, texts, config: LayerSweepConfig, options: JobOptions) -> str:
    """Content key of a job's result: weights (or hub id + revision), texts, every setting."""
    ident: dict[str, Any] = {"spec": job.spec, "revision": job.hub_revision,
                             "weights": job.weights_sha256}
    if job.weights_sha256 is None:
        # by content: weights replaced in place or a moved hub branch give a new key
        from ...models.load import model_fingerprint

        with contextlib.suppress(LmgeomError, OSError):
            ident["weights"] = model_fingerprint(job.spec, job.hub_revision)
    return stable_hash({
        "v": SWEEP_VERSION, "model": ident, "label": [job.model, job.revision],
        "val_loss": job.val_loss, "texts": texts.hash, "config": config_dict(config),
        "dtype": options.dtype, "k": options.k,
    })[:20]


def sweep_job(
    job: JobSpec,
    texts,
    config: LayerSweepConfig,
    *,
    options: JobOptions | None = None,
    work_dir: str | None = None,
    progress: bool | None = False,
) -> JobResult:
    """Run the layer sweep of ``lmgeom analyze`` on one model × checkpoint.

    Self-contained: loads the model, extracts (through the activation cache), computes every
    per-layer metric (:func:`~lmgeom.experiments.layer_sweep.run_layer_sweep`, resumable per
    layer in ``work_dir``) and returns the rows with ``model = job.model`` and
    ``revision = job.revision``, plus model-level ``readout_k`` and (suites) ``val_loss`` rows.
    Every argument is plain and picklable, so a distributed backend can call it remotely.

    Args:
        job: what to analyse.
        texts: the shared :class:`~lmgeom.texts.TextSet`.
        config: layer-sweep settings; ``config.k`` is replaced by ``options.k`` resolved per model.
        options: loading / threading options.
        work_dir: folder for the per-layer metric cache of this job (``None``: no cache).
        progress: progress bars.

    Returns:
        A :class:`JobResult`; a failure (bad model, k >= d, out of memory, ...) is returned in
        ``error`` with its traceback in ``info["traceback"]``, never raised.
    """
    options = options or JobOptions()
    t0 = time.perf_counter()
    info: dict[str, Any] = {"job": asdict(job), "host": socket.gethostname(), "pid": os.getpid()}
    try:
        fail_once(job.model)
        res = analyze_model(
            job.spec, texts, config,
            model_options=ModelOptions(dtype=options.dtype, device=options.device,
                                       device_map=options.device_map,
                                       trust_remote_code=options.trust_remote_code),
            hub_revision=job.hub_revision, revision=job.revision, label=job.model, k=options.k,
            cache=options.cache, threads=options.threads, work_dir=work_dir, progress=progress)
    except (LmgeomError, OSError, RuntimeError, MemoryError, ValueError, KeyError) as exc:
        info["traceback"] = traceback.format_exc(limit=8)
        info["error_type"] = type(exc).__name__
        info["total_s"] = time.perf_counter() - t0
        msg = f"{type(exc).__name__}: {exc}"
        log.warning("sweep job %s failed: %s", job.name, msg)
        return JobResult(job, None, info, msg)
    info.update(res.info)
    info.update(res.timings)
    extra = [table.row(model=job.model, revision=job.revision, metric="readout_k",
                       value=float(res.k))]
    if job.val_loss is not None and math.isfinite(float(job.val_loss)):
        extra.append(table.row(model=job.model, revision=job.revision, metric="val_loss",
                               value=float(job.val_loss)))
    df = pd.concat([res.frame, table.frame(extra)], ignore_index=True)
    info["total_s"] = time.perf_counter() - t0
    return JobResult(job, df, info, None)


# --------------------------------------------------------------------------- job lists


def jobs_from_suite(root: str | Path, *, widths: Sequence[int] | None = None,
                    steps: Sequence[int] | None = None) -> list[JobSpec]:
    """One job per saved checkpoint of a suite folder (optionally only some widths / steps)."""
    cks = suite_checkpoints(root)
    if widths:
        missing = sorted({int(w) for w in widths} - {c["width"] for c in cks})
        if missing:
            raise ConfigError(f"suite {root} has no checkpoints of width(s) {missing}")
        cks = [c for c in cks if c["width"] in {int(w) for w in widths}]
    if steps:
        cks = [c for c in cks if c["step"] in {int(s) for s in steps}]
    if not cks:
        raise ConfigError(f"no checkpoints selected in suite {root}")
    return [JobSpec(model=c["label"], spec=c["path"], revision=c["revision"], step=c["step"],
                    width=c["width"], weights_sha256=c["weights_sha256"], val_loss=c["val_loss"])
            for c in cks]


def jobs_from_models(models: Sequence[str], revisions: Sequence[str] | None = None) -> list[JobSpec]:
    """Jobs for ``models`` × ``revisions`` (hub suites such as Pythia's ``stepN``); without
    revisions one job per model (e.g. several local folders)."""
    if not models:
        raise ConfigError("give at least one --model (or --suite DIR)")
    out = []
    for m in models:
        p = Path(m)
        is_dir = p.is_dir()
        for r in (revisions or [None]):
            if r is not None and is_dir:
                raise ConfigError(f"--revision {r} needs a hub model; {m} is a local folder "
                                  "(give each checkpoint folder as its own --model)")
            out.append(JobSpec(model=str(m), spec=str(m), revision=r or "", hub_revision=r,
                               step=step_of(r) if r else None))
    return out


def select_jobs(*, suite: str | Path | None = None, widths: Sequence[int] | None = None,
                steps: Sequence[int] | None = None, models: Sequence[str] | None = None,
                revisions: Sequence[str] | None = None) -> tuple[list[JobSpec], str]:
    """The jobs of a sweep and its name: every checkpoint of a ``suite`` folder (optionally only
    some ``widths`` / ``steps``), or ``models`` × ``revisions``. Exactly one of ``suite`` and
    ``models``; a clear :class:`ConfigError` for every mix that cannot mean anything."""
    if bool(suite) == bool(models):
        raise ConfigError("give either --suite DIR or one or more --model (not both)")
    if suite:
        if revisions:
            raise ConfigError("--revision is for hub models; a suite's checkpoints are its steps "
                              "(select them with --steps)")

        read_suite(suite)  # a clear error for a folder that is not a suite
        return (jobs_from_suite(suite, widths=widths, steps=steps),
                Path(suite).resolve().name)
    if widths or steps:
        raise ConfigError("--widths / --steps select checkpoints of a --suite")
    return (jobs_from_models(models, revisions),
            "_".join(m.replace("/", "_") for m in models)[:80])
