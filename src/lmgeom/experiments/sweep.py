"""Scale × training-time sweep: the ``lmgeom analyze`` layer sweep over many models × checkpoints
on one shared text set, gathered into one tidy table with regimes, trajectories and plots.

The unit of work is :func:`sweep_job` — one model × checkpoint → a :class:`JobResult` — which
takes plain, picklable arguments (:class:`JobSpec`, a :class:`~lmgeom.texts.TextSet`, a
:class:`~lmgeom.experiments.layer_sweep.SweepConfig`, :class:`JobOptions`, a folder path), loads
its own model and never raises for an ordinary failure: the error is returned in the result.
:func:`run_jobs` runs the jobs on an engine (``local``: in this process; ``ray``: one Ray task
per job, :mod:`lmgeom.engines.base`) and caches each finished job's rows; :func:`gather` turns results into the
table and the manifest entries (failed jobs, identical weights, regimes, trajectories).

Extra rows beyond the layer sweep (all model-level, ``layer = ""``):

``readout_k``            the readout dimension k used for that model (``--k auto``: min(100, d // 4))
``val_loss``             the suite's held-out loss at that checkpoint (suites only)
``regime_detour``, ``collapse_min_z``, ``collapse_restored_ccr``, ``collapse_zone_layers``
                         the regime of the CCR-1 profile (:mod:`lmgeom.experiments.regime`)
``zone_pga_z_min``       lowest z over the model's *tracked layers* (setting ``ccr=m``)
``zone_<spectral>_mean`` mean of a spectral metric over the tracked layers
``job_failed``           1 for a job that failed (its error is in the manifest)

Tracked layers of a model (the same for all its checkpoints, so a trajectory compares like with
like): the collapse-zone layers of its *last* checkpoint when that one is a detour; otherwise
its late non-final layers (``layer_index > (L + 1) / 2``, the final layer excluded).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._io import atomic_path, stable_hash, write_json
from .._testing import fail_once
from ..errors import ConfigError, LmgeomError
from ..results import table
from .layer_sweep import SweepConfig, config_dict, run_layer_sweep

log = logging.getLogger(__name__)

#: ``k = "auto"``: min(AUTO_K_MAX, width // AUTO_K_DIV)
AUTO_K_MAX = 100
AUTO_K_DIV = 4
SPECTRAL = ("rankme", "alpha_req", "isoscore", "mean_cosine", "condition_number")
SWEEP_VERSION = "1"


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


def resolve_k(k: int | str, width: int) -> int:
    """The readout dimension for a model of ``width``: ``k`` itself, or for ``"auto"``
    ``min(100, width // 4)`` (the paper's k = 100 where d >= 400, a quarter of d below)."""
    if isinstance(k, str):
        if k != "auto":
            try:
                k = int(k)
            except ValueError as exc:
                raise ConfigError(f"k must be an integer or 'auto', got {k!r}") from exc
        else:
            return max(1, min(AUTO_K_MAX, int(width) // AUTO_K_DIV))
    if int(k) < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    return int(k)


def job_key(job: JobSpec, texts, config: SweepConfig, options: JobOptions) -> str:
    """Content key of a job's result: weights (or hub id + revision), texts, every setting."""
    ident: dict[str, Any] = {"spec": job.spec, "revision": job.hub_revision,
                             "weights": job.weights_sha256}
    if job.weights_sha256 is None:
        p = Path(job.spec)
        if p.is_dir() and (p / "config.json").is_file():
            from ..models.load import weights_hash

            with contextlib.suppress(LmgeomError, OSError):
                ident["weights"] = weights_hash(p)
    return stable_hash({
        "v": SWEEP_VERSION, "model": ident, "label": [job.model, job.revision],
        "val_loss": job.val_loss, "texts": texts.hash, "config": config_dict(config),
        "dtype": options.dtype, "k": options.k,
    })[:20]


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        limits: Any = contextlib.nullcontext()
    else:
        limits = threadpool_limits(limits=int(n))
    try:
        with limits:
            yield
    finally:
        torch.set_num_threads(prev)


def sweep_job(
    job: JobSpec,
    texts,
    config: SweepConfig,
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
        from ..activations import extract
        from ..models import load_model

        with _threads(options.threads):
            fail_once(job.model)
            t = time.perf_counter()
            model = load_model(job.spec, dtype=options.dtype, device=options.device,
                               revision=job.hub_revision, device_map=options.device_map,
                               trust_remote_code=options.trust_remote_code)
            info["load_s"] = time.perf_counter() - t
            k = resolve_k(options.k, model.width)
            cfg = replace(config, k=k)
            info.update(width=model.width, n_blocks=model.n_blocks, k=k,
                        weights_sha256=model.identity.get("weights_sha256"),
                        commit=model.identity.get("commit"), model_type=model.model_type,
                        vocab_size=model.vocab_size)
            t = time.perf_counter()
            acts = extract(model, texts, layers=cfg.layers, pooling=cfg.pooling,
                           max_length=cfg.max_length, batch_size=cfg.batch_size,
                           cache=options.cache, seed=cfg.seed, progress=progress)
            info["extract_s"] = time.perf_counter() - t
            info["activations_key"] = acts.key
            info["n_truncated"] = acts.n_truncated
            df, tm = run_layer_sweep(model, acts, cfg, work_dir=work_dir, revision=job.revision,
                                     progress=progress)
            info.update(tm)
            del model, acts
    except (LmgeomError, OSError, RuntimeError, MemoryError, ValueError, KeyError) as exc:
        info["traceback"] = traceback.format_exc(limit=8)
        info["error_type"] = type(exc).__name__
        info["total_s"] = time.perf_counter() - t0
        msg = f"{type(exc).__name__}: {exc}"
        log.warning("sweep job %s failed: %s", job.name, msg)
        return JobResult(job, None, info, msg)
    df["model"] = job.model
    extra = [table.row(model=job.model, revision=job.revision, metric="readout_k", value=float(k))]
    if job.val_loss is not None and math.isfinite(float(job.val_loss)):
        extra.append(table.row(model=job.model, revision=job.revision, metric="val_loss",
                               value=float(job.val_loss)))
    df = pd.concat([df, table.frame(extra)], ignore_index=True)
    info["total_s"] = time.perf_counter() - t0
    return JobResult(job, df, info, None)


# --------------------------------------------------------------------------- job lists


_STEP = re.compile(r"step[_-]?(\d+)$")


def step_of(revision: str) -> int | None:
    """``step512`` → 512 (also ``step_512``); ``None`` for other revision names."""
    m = _STEP.search(str(revision))
    return int(m.group(1)) if m else None


def jobs_from_suite(root: str | Path, *, widths: Sequence[int] | None = None,
                    steps: Sequence[int] | None = None) -> list[JobSpec]:
    """One job per saved checkpoint of a suite folder (optionally only some widths / steps)."""
    from ..training.suite import suite_checkpoints

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


# --------------------------------------------------------------------------- running


def _result_paths(work: Path, key: str) -> tuple[Path, Path]:
    return work / "jobs" / f"{key}.parquet", work / "jobs" / f"{key}.json"


def run_jobs(
    jobs: Sequence[JobSpec],
    texts,
    config: SweepConfig,
    *,
    out_dir: str | Path,
    options: JobOptions | None = None,
    progress: bool | None = None,
    engine: str | Any = "local",
) -> list[JobResult]:
    """Run every job (reusing finished ones from ``out_dir/.work/jobs``) and return the results
    in job order. A job that fails is retried (bounded, see
    :class:`~lmgeom.engines.base.EngineConfig`), then recorded; the other jobs go on.

    Args:
        engine: ``local`` (in this process; ``serial`` is the old name), ``ray``, or an
            :class:`~lmgeom.engines.base.EngineConfig` (Ray address, CPUs / GPUs per job,
            retries). Both engines call :func:`sweep_job` with the same arguments, so they give
            the same numbers; each finished job's rows are written to the cache as soon as it
            ends, so an interrupted sweep resumes with the jobs still missing.
    """
    from ..activations.core import progress_bar
    from ..engines.base import EngineConfig, map_calls

    cfg = engine if isinstance(engine, EngineConfig) else EngineConfig(engine=str(engine))
    options = options or JobOptions()
    if cfg.engine == "ray":
        # one job per Ray task: its CPUs are its threads, its GPU (if any) is its device
        options = replace(options, threads=cfg.threads)
    work = Path(out_dir) / ".work"
    (work / "jobs").mkdir(parents=True, exist_ok=True)
    results: list[JobResult | None] = [None] * len(jobs)
    keys = [job_key(job, texts, config, options) for job in jobs]
    todo: list[int] = []
    for i, (job, key) in enumerate(zip(jobs, keys)):
        fpath, ipath = _result_paths(work, key)
        if fpath.is_file() and ipath.is_file():
            try:
                res = JobResult(job, pd.read_parquet(fpath), json.loads(ipath.read_text()), None)
                res.info["reused"] = True
                res.info["key"] = key
                results[i] = res
                continue
            except (OSError, ValueError) as exc:
                log.warning("cached result of %s unreadable (%s); recomputing", job.name, exc)
        todo.append(i)

    bar = progress_bar(len(jobs), f"sweep jobs ({cfg.engine})", progress)
    bar.unit = "job"
    bar.update(len(jobs) - len(todo))

    def done(j: int, outcome) -> None:
        i = todo[j]
        job = jobs[i]
        res = outcome.value if isinstance(outcome.value, JobResult) else None
        if res is None:  # raised (or the worker died) on every attempt
            res = JobResult(job, None, {"traceback": outcome.traceback,
                                        "error_type": outcome.error_type}, outcome.error)
            log.warning("sweep job %s failed: %s", job.name, outcome.error)
        res.info["attempts"] = outcome.attempts
        res.info["engine"] = cfg.engine
        if res.ok and res.frame is not None:
            fpath, ipath = _result_paths(work, keys[i])
            with atomic_path(fpath) as tmp:
                res.frame.to_parquet(tmp, index=False)
            write_json(ipath, res.info)
        res.info["key"] = keys[i]
        results[i] = res
        bar.set_postfix_str(job.name, refresh=False)
        bar.update(1)

    calls = [((jobs[i], texts, config),
              {"options": options, "work_dir": str(work / "layers" / keys[i]),
               "progress": progress if cfg.engine == "local" else False})
             for i in todo]
    map_calls(sweep_job, calls, cfg, names=[jobs[i].name for i in todo], on_done=done,
              failure_of=lambda r: None if r.ok else (r.info.get("error_type"), r.error))
    bar.close()
    return [r for r in results if r is not None]


# --------------------------------------------------------------------------- gathering


def tracked_layers(df: pd.DataFrame, regimes: dict[tuple[str, str], Any]) -> dict[str, list[str]]:
    """Per model, the layers its trajectory follows (module docstring): the last checkpoint's
    collapse zone when it is a detour, else the late non-final layers."""
    out: dict[str, list[str]] = {}
    z = df.loc[(df["metric"] == "pga_z") & (df["layer_index"] >= 0)
               & ~df["layer"].astype(str).str.contains(".", regex=False)]
    for model, g in z.groupby("model", sort=False):
        revs = list(dict.fromkeys(g["revision"].astype(str)))
        last = max(revs, key=lambda r: (step_of(r) is None, step_of(r) or 0, revs.index(r)))
        reg = regimes.get((str(model), last))
        if reg is not None and reg.detour:
            out[str(model)] = list(reg.zone_layers)
            continue
        lay = g.loc[g["revision"] == last, ["layer", "layer_index"]].drop_duplicates("layer")
        final_idx = lay.loc[lay["layer"] == "final", "layer_index"]
        n_axis = int(final_idx.iloc[0]) if len(final_idx) else int(lay["layer_index"].max())
        late = lay.loc[(lay["layer"] != "final") & (lay["layer_index"] > n_axis / 2)
                       & (lay["layer_index"] < n_axis)]
        out[str(model)] = [str(x) for x in late.sort_values("layer_index")["layer"]]
    return out


def trajectory_rows(df: pd.DataFrame, tracked: dict[str, list[str]]) -> list[dict[str, Any]]:
    """``zone_pga_z_min`` (per CCR setting) and ``zone_<spectral>_mean`` per model × revision
    over the model's tracked layers."""
    rows: list[dict[str, Any]] = []
    base = df.loc[df["layer_index"] >= 0]
    for model, layers in tracked.items():
        if not layers:
            continue
        sel = base.loc[(base["model"] == model) & base["layer"].isin(layers)]
        for rev, g in sel.groupby("revision", sort=False):
            z = g.loc[g["metric"] == "pga_z"]
            for s, gz in z.groupby("setting"):
                v = gz["value"].astype(float)
                v = v[np.isfinite(v)]
                if len(v):
                    rows.append(table.row(model=model, revision=str(rev), metric="zone_pga_z_min",
                                          setting=str(s), value=float(v.min()), n=float(len(v))))
            for m in SPECTRAL:
                v = g.loc[g["metric"] == m, "value"].astype(float)
                v = v[np.isfinite(v)]
                if len(v):
                    rows.append(table.row(model=model, revision=str(rev), metric=f"zone_{m}_mean",
                                          value=float(v.mean()), n=float(len(v))))
    return rows


def identical_weight_groups(results: Sequence[JobResult]) -> list[list[str]]:
    """Names (``model@revision``) of jobs whose weights hash to the same value, in groups."""
    from ..training.suite import duplicate_weights

    items = [(r.job.name, r.info.get("weights_sha256") or r.job.weights_sha256) for r in results]
    return duplicate_weights(items)


def gather(results: Sequence[JobResult], *, primary_ccr: int = 1) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Combine job results into one table plus the manifest entries.

    Returns:
        (table, entries) with entries ``jobs`` (per job: name, key, ok, error, info),
        ``failed_jobs``, ``identical_weights``, ``regimes`` (``model@revision`` → sentence),
        ``tracked_layers``.
    """
    from .regime import regime_rows, regimes_from_table

    frames = [r.frame for r in results if r.ok and r.frame is not None]
    failed = [r for r in results if not r.ok]
    fail_rows = [table.row(model=r.job.model, revision=r.job.revision, metric="job_failed",
                           value=1.0) for r in failed]
    parts = frames + ([table.frame(fail_rows)] if fail_rows else [])
    df = pd.concat(parts, ignore_index=True) if parts else table.frame([])
    regimes = regimes_from_table(df, ccr=primary_ccr)
    tracked = tracked_layers(df, regimes)
    extra = regime_rows(regimes) + trajectory_rows(df, tracked)
    if extra:
        df = pd.concat([df, table.frame(extra)], ignore_index=True)
    dups = identical_weight_groups(results)
    for group in dups:
        log.warning("IDENTICAL WEIGHTS: %s have the same weights hash — these checkpoints are the "
                    "same model; their rows are duplicates, not a trajectory", ", ".join(group))
    entries = {
        "jobs": [{"name": r.job.name, "model": r.job.model, "revision": r.job.revision,
                  "spec": r.job.spec, "ok": r.ok, "error": r.error,
                  **{k: v for k, v in r.info.items() if k not in ("job", "traceback")}}
                 for r in results],
        "failed_jobs": [{"name": r.job.name, "error": r.error,
                         "attempts": r.info.get("attempts", 1),
                         "traceback": r.info.get("traceback")} for r in failed],
        "identical_weights": dups,
        "regimes": {(f"{m}@{r}" if r else m): reg.describe() for (m, r), reg in regimes.items()},
        "regime_labels": {(f"{m}@{r}" if r else m): reg.label for (m, r), reg in regimes.items()},
        "tracked_layers": tracked,
    }
    return df, entries


def last_revisions(df: pd.DataFrame) -> dict[str, str]:
    """Per model, its last checkpoint (largest step; else the last revision seen)."""
    out: dict[str, str] = {}
    for model, g in df.groupby("model", sort=False):
        revs = list(dict.fromkeys(g["revision"].astype(str)))
        out[str(model)] = max(revs, key=lambda r: (step_of(r) is None, step_of(r) or 0,
                                                       revs.index(r)))
    return out


def report_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the HTML report's per-layer sections show: every model's last checkpoint's
    per-layer rows, and every model-level row (the step plots show the other checkpoints)."""
    last = last_revisions(df.loc[df["layer_index"] >= 0]) if (df["layer_index"] >= 0).any() else {}
    keep = df["layer_index"] < 0
    for model, rev in last.items():
        keep |= (df["model"] == model) & (df["revision"] == rev)
    return df.loc[keep].reset_index(drop=True)


# --------------------------------------------------------------------------- plots


def _model_order(df: pd.DataFrame) -> list[str]:
    models = list(dict.fromkeys(df["model"].astype(str)))

    def key(m: str) -> tuple:
        mm = re.fullmatch(r"w(\d+)", m)
        return (0, int(mm.group(1)), m) if mm else (1, 0, models.index(m))

    return sorted(models, key=key)


def _steps_axis(revs: Sequence[str]) -> dict[str, float]:
    if all(step_of(r) is not None for r in revs):
        return {r: float(step_of(r)) for r in revs}  # type: ignore[arg-type]
    return {r: float(i) for i, r in enumerate(revs)}


def plot_profiles(df: pd.DataFrame, out_dir: str | Path, *, ccrs: Sequence[int] = (1, 5),
                  stem: str = "profiles_by_step") -> list[Path]:
    """PGA z per layer for every checkpoint: one panel per model (columns) and CCR level
    (rows), one line per checkpoint coloured by training step (log colour scale)."""
    from matplotlib import cm, colormaps, colors, rc_context
    from matplotlib.figure import Figure

    from ..report.plots import PLOT_STYLE, literal_text, save_figure, setting_label

    z = df.loc[(df["metric"] == "pga_z") & (df["layer_index"] >= 0)
               & ~df["layer"].astype(str).str.contains(".", regex=False)]
    settings = [f"ccr={m}" for m in ccrs if (z["setting"] == f"ccr={m}").any()]
    if z.empty or not settings:
        return []
    models = _model_order(z)
    with rc_context(PLOT_STYLE):
        fig = Figure(figsize=(3.4 * len(models) + 1.0, 2.6 * len(settings) + 0.6), layout="constrained")
        axes = fig.subplots(len(settings), len(models), squeeze=False, sharey="row")
        all_steps = [s for s in (step_of(r) for r in z["revision"].astype(str)) if s is not None]
        vmax = max(all_steps) if all_steps else 1
        norm = colors.SymLogNorm(linthresh=1.0, vmin=0, vmax=max(vmax, 1), base=10)
        cmap = colormaps["viridis"]
        for i, s in enumerate(settings):
            for j, model in enumerate(models):
                ax = axes[i][j]
                g = z.loc[(z["model"] == model) & (z["setting"] == s)]
                revs = sorted(dict.fromkeys(g["revision"].astype(str)),
                              key=lambda r: (step_of(r) or 0, r))
                xs = _steps_axis(revs)
                for r in revs:
                    c = g.loc[g["revision"] == r].drop_duplicates("layer_index").sort_values("layer_index")
                    st = xs[r]
                    ax.plot(c["layer_index"], c["value"], color=cmap(norm(st)), lw=1.3,
                            marker="o", ms=2.5, label=literal_text(r))
                ax.axhline(0.0, color="black", lw=0.8)
                ticks = g.drop_duplicates("layer_index").sort_values("layer_index")
                ax.set_xticks(list(ticks["layer_index"]), [literal_text(t) for t in ticks["layer"]])
                if i == 0:
                    ax.set_title(literal_text(model), loc="left")
                if j == 0:
                    ax.set_ylabel(f"PGA z ({setting_label(s)})")
                if i == len(settings) - 1:
                    ax.set_xlabel("layer")
        sm = cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(sm, ax=axes, label="training step", shrink=0.8)
        fig.suptitle("Subspace PGA z per layer at every checkpoint (colour = training step)",
                     fontsize=10.5)
        return save_figure(fig, out_dir, stem)


def plot_trajectory(df: pd.DataFrame, out_dir: str | Path, *, ccrs: Sequence[int] = (1, 5),
                    stem: str = "trajectory") -> list[Path]:
    """Against training step, one line per model: tracked-layer z (per CCR level), validation
    loss, and the spectral metrics over the same layers — does z move where loss and spectra
    do not?"""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    from ..report.plots import (
        PALETTE,
        PLOT_STYLE,
        literal_text,
        metric_label,
        save_figure,
        setting_label,
    )

    ml = df.loc[df["layer_index"] < 0]
    panels: list[tuple[str, str, str]] = []
    for m in ccrs:
        if ((ml["metric"] == "zone_pga_z_min") & (ml["setting"] == f"ccr={m}")).any():
            panels.append(("zone_pga_z_min", f"ccr={m}",
                           f"min z, tracked layers ({setting_label(f'ccr={m}')})"))
    if (ml["metric"] == "val_loss").any():
        panels.append(("val_loss", "", "validation loss"))
    for m in ("rankme", "alpha_req", "isoscore"):
        if (ml["metric"] == f"zone_{m}_mean").any():
            panels.append((f"zone_{m}_mean", "", f"{metric_label(m)} (tracked mean)"))
    if not panels:
        return []
    models = _model_order(ml.loc[ml["metric"].isin([p[0] for p in panels])])
    with rc_context(PLOT_STYLE):
        fig = Figure(figsize=(7.5, 1.9 * len(panels) + 0.8), layout="constrained")
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (metric, setting, ylabel) in zip(axes, panels):
            sel = ml.loc[(ml["metric"] == metric) & (ml["setting"] == setting)]
            for j, model in enumerate(models):
                g = sel.loc[sel["model"] == model]
                if g.empty:
                    continue
                revs = sorted(dict.fromkeys(g["revision"].astype(str)), key=lambda r: (step_of(r) or 0, r))
                xs = _steps_axis(revs)
                g = g.drop_duplicates("revision").set_index("revision").loc[revs]
                ax.plot([xs[r] for r in revs], g["value"].astype(float), marker="o", ms=3,
                        lw=1.4, color=PALETTE[j % len(PALETTE)], label=literal_text(model))
            if metric == "zone_pga_z_min":
                ax.axhline(0.0, color="black", lw=0.8)
            ax.set_ylabel(literal_text(ylabel))
            ax.set_xscale("symlog", linthresh=1.0)
        axes[0].legend(loc="best", ncols=min(4, len(models)))
        axes[-1].set_xlabel("training step (symlog)")
        fig.suptitle("Training trajectories: tracked-layer PGA z, validation loss and spectra",
                     fontsize=10.5)
        return save_figure(fig, out_dir, stem)


# --------------------------------------------------------------------------- whole sweep


@dataclass
class SweepResult:
    frame: pd.DataFrame
    entries: dict[str, Any]
    results: list[JobResult]


def run_sweep(
    jobs: Sequence[JobSpec],
    texts,
    config: SweepConfig,
    *,
    out_dir: str | Path,
    options: JobOptions | None = None,
    progress: bool | None = None,
    engine: str | Any = "local",
) -> SweepResult:
    """:func:`run_jobs` then :func:`gather`: the whole sweep's table and manifest entries."""
    if not jobs:
        raise ConfigError("the sweep has no jobs")
    results = run_jobs(jobs, texts, config, out_dir=out_dir, options=options, progress=progress,
                       engine=engine)
    primary = 1 if 1 in config.ccr else min(m for m in config.ccr if m >= 0)
    df, entries = gather(results, primary_ccr=primary)
    return SweepResult(df, entries, results)


def report_sections(df: pd.DataFrame, entries: dict[str, Any], *, n_jobs: int,
                    plots_dir: str | Path, ccrs: Sequence[int] = (1, 5, 10)) -> list[tuple[str, list[Path], str]]:
    """The sweep's own report sections (``extra_figures`` of
    :func:`~lmgeom.report.html.write_report`): z per layer per checkpoint, trajectories, the
    regimes, and checkpoint integrity / failures (identical weights are a warning line)."""
    shown = [m for m in (1, 5, 10) if m in ccrs][:2] or list(ccrs)[:1]
    extra: list[tuple[str, list[Path], str]] = []
    prof = plot_profiles(df, plots_dir, ccrs=shown)
    if prof:
        extra.append(("PGA z per layer at every checkpoint", prof,
                      ("One panel per model (columns) and CCR level (rows); one line per "
                      "checkpoint, coloured by training step.")))
    traj = plot_trajectory(df, plots_dir, ccrs=shown)
    if traj:
        tracked = "; ".join(f"{m}: {', '.join(v) or 'none'}"
                            for m, v in entries.get("tracked_layers", {}).items())
        extra.append(("Training trajectories: z, loss and spectra vs step", traj,
                      ("Lowest PGA z over each model's tracked layers (its last checkpoint's "
                      "collapse zone if that is a detour, else its late non-final layers), the "
                      "validation loss, and spectral metrics averaged over the same layers, "
                      f"against training step. Tracked layers — {tracked}.")))
    if entries.get("regimes"):
        lines = [f"{k}: {v}." for k, v in entries["regimes"].items()]
        extra.append(("Regimes (direct / detour)", [],
                      "Rule: a collapse zone is a run of >= 2 consecutive non-final layers after "
                      "the CCR-1 peak with z < 0, or one such layer with z < -2; a profile with a "
                      "collapse zone is a detour, else direct. " + " ".join(lines)))
    integrity = ["WARNING: identical weights in " + ", ".join(g)
                 + " — these checkpoints are the same model." for g in entries.get("identical_weights", [])]
    integrity += [f"FAILED job {f['name']} ({f.get('attempts', 1)} attempts): {f['error']}"
                  for f in entries.get("failed_jobs", [])]
    extra.append(("Checkpoint integrity and failures", [],
                  " ".join(integrity) if integrity else
                  f"All {n_jobs} jobs ran; no two checkpoints have identical weights (sha256 of the "
                  "weight files, recorded per job in the manifest)."))
    return extra


def write_sweep_report(out_dir: str | Path, df: pd.DataFrame, manifest: dict[str, Any],
                       entries: dict[str, Any], *, n_jobs: int, ccrs: Sequence[int] = (1, 5, 10),
                       title: str = "lmgeom sweep") -> Path:
    """Plots + ``report.html``: the per-layer sections on each model's last checkpoint
    (:func:`report_table`), then :func:`report_sections`."""
    from ..report.html import write_report

    out = Path(out_dir)
    extra = report_sections(df, entries, n_jobs=n_jobs, plots_dir=out / "plots", ccrs=ccrs)
    return write_report(out, report_table(df), manifest, title=title, extra_figures=extra)


__all__ = [
    "JobOptions",
    "JobResult",
    "JobSpec",
    "SweepResult",
    "gather",
    "identical_weight_groups",
    "job_key",
    "jobs_from_models",
    "jobs_from_suite",
    "last_revisions",
    "plot_profiles",
    "plot_trajectory",
    "report_sections",
    "report_table",
    "resolve_k",
    "run_jobs",
    "run_sweep",
    "step_of",
    "sweep_job",
    "tracked_layers",
    "trajectory_rows",
    "write_sweep_report",
]
