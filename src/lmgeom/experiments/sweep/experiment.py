"""Scale × training-time sweep: the ``lmgeom analyze`` layer sweep over many models × checkpoints
on one shared text set, gathered into one tidy table with regimes, trajectories and plots.

The unit of work is :func:`sweep_job` — one model × checkpoint → a :class:`JobResult` — which
(with the job lists) lives in :mod:`lmgeom.experiments.sweep` (import it from there); it
takes plain, picklable arguments (:class:`JobSpec`, a :class:`~lmgeom.texts.TextSet`, a
:class:`~lmgeom.experiments.layer_sweep.LayerSweepConfig`, :class:`JobOptions`, a folder path), loads
its own model and never raises for an ordinary failure: the error is returned in the result.
:func:`run_jobs` runs the jobs on an engine (``local``: in this process; ``ray``: one Ray task
per job, :mod:`lmgeom.engines.base`) and caches each finished job's rows; :func:`gather` turns results into the
table and the manifest entries (failed jobs, identical weights, regimes, trajectories).

Extra rows beyond the layer sweep (all model-level, ``layer = ""``):

::

    ``readout_k``            the readout dimension k used for that model (``--k auto``: min(100, d // 4))
    ``val_loss``             the suite's held-out loss at that checkpoint (suites only)
    ``regime_detour``, ``collapse_min_z``, ``collapse_restored_ccr``, ``collapse_zone_layers``
                             the regime of the CCR-1 profile (:mod:`lmgeom.metrics.regime`)
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
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ..._io import atomic_path, write_json
from ...activations.forward import progress_bar
from ...engines import EngineConfig, make_engine
from ...errors import ConfigError
from ...metrics.regime import regimes_from_table
from ...metrics.sample_size import join_flags, split_flags
from ...report.figures_sweep import last_revisions, write_sweep_report
from ...results import table
from ...results.console import format_table
from ...results.table import step_of
from ...training.suite_manifest import duplicate_weights, read_suite
from ..base import register
from ..layer_sweep import LayerSweepConfig, config_dict, fit_k
from ..options import TextOptions
from ..regime import regime_rows
from .jobs import (
    JobOptions,
    JobResult,
    JobSpec,
    job_key,
    sweep_job,
)

log = logging.getLogger(__name__)

SPECTRAL = ("rankme", "alpha_req", "isoscore", "mean_cosine", "condition_number")


# --------------------------------------------------------------------------- running


def _result_paths(work: Path, key: str) -> tuple[Path, Path]:
    return work / "jobs" / f"{key}.parquet", work / "jobs" / f"{key}.json"


def run_jobs(
    jobs: Sequence[JobSpec],
    texts,
    config: LayerSweepConfig,
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
        engine: ``local`` (in this process), ``ray``, or an
            :class:`~lmgeom.engines.base.EngineConfig` (Ray address, CPUs / GPUs per job,
            retries). Both engines call :func:`sweep_job` with the same arguments, so they give
            the same numbers; each finished job's rows are written to the cache as soon as it
            ends, so an interrupted sweep resumes with the jobs still missing.
    """
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
                res = JobResult(job, table.normalise(pd.read_parquet(fpath)),
                                json.loads(ipath.read_text()), None)
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
        res.info["attempt_errors"] = list(outcome.history)
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
    make_engine(cfg).map(sweep_job, calls, names=[jobs[i].name for i in todo], on_done=done,
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
    items = [(r.job.name, r.info.get("weights_sha256") or r.job.weights_sha256) for r in results]
    return duplicate_weights(items)


def gather(results: Sequence[JobResult], *, primary_ccr: int = 1) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Combine job results into one table plus the manifest entries.

    Returns:
        (table, entries) with entries ``jobs`` (per job: name, key, ok, error, info),
        ``failed_jobs``, ``identical_weights``, ``regimes`` (``model@revision`` → sentence),
        ``tracked_layers``.
    """
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
        "jobs": [{**{k: v for k, v in r.info.items() if k not in ("job", "traceback")},
                  "name": r.job.name, "model": r.job.model, "revision": r.job.revision,
                  "spec": r.job.spec, "ok": r.ok, "error": r.error}
                 for r in results],
        "failed_jobs": [{"name": r.job.name, "error": r.error,
                         "attempts": r.info.get("attempts", 1),
                         "traceback": r.info.get("traceback")} for r in failed],
        "identical_weights": dups,
        "regimes": {(f"{m}@{r}" if r else m): reg.describe() for (m, r), reg in regimes.items()},
        "regime_labels": {(f"{m}@{r}" if r else m): reg.label for (m, r), reg in regimes.items()},
        "tracked_layers": tracked,
        "low_sample": low_sample_jobs(results),
    }
    return df, entries


def low_sample_jobs(results: Sequence[JobResult]) -> dict[str, str]:
    """``model@revision`` -> the low-sample flag codes of its rows (jobs with none left out)."""
    out = {}
    for r in results:
        if not r.ok or r.frame is None or "flag" not in r.frame.columns:
            continue
        codes = [c for f in r.frame["flag"].dropna().unique() for c in split_flags(f)]
        if codes:
            out[r.job.name] = join_flags(codes)
    return out


# --------------------------------------------------------------------------- whole sweep


@dataclass
class SweepResult:
    """The whole sweep: its table, manifest entries (jobs, failures, regimes ...) and the job
    results; with ``config`` set (``SweepConfig.run``) also a run-folder result."""

    frame: pd.DataFrame
    entries: dict[str, Any]
    results: list[JobResult]
    config: SweepConfig | None = None
    extra_manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def n_failed(self) -> int:
        return len(self.entries.get("failed_jobs", []))

    def rows(self) -> pd.DataFrame:
        return self.frame

    def manifest(self) -> dict[str, Any]:
        return {**self.extra_manifest, **self.entries}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        c = self.config
        title = f"lmgeom sweep — {c.name}" if c is not None and c.name else "lmgeom sweep"
        ccrs = c.layers.ccr if c is not None else (1, 5, 10)
        return write_sweep_report(folder.path, self.frame, manifest, self.entries,
                                  n_jobs=len(self.results), ccrs=ccrs, title=title)

    def summary(self) -> str:
        df, entries = self.frame, self.entries
        ccr = self.config.layers.ccr if self.config is not None else (1, 5)
        out: list[str] = []
        per_layer = df.loc[df["layer_index"] >= 0]
        if not per_layer.empty:
            ccrs = [f"ccr={m}" for m in ccr if m in (1, 5)]
            for model, rev in last_revisions(per_layer).items():
                g = per_layer.loc[(per_layer["model"] == model) & (per_layer["revision"] == rev)
                                  & (per_layer["metric"] == "pga_z")]
                z = g.pivot_table(index=["layer_index", "layer"], columns="setting",
                                  values="value", sort=True)
                rows = [{"layer": layer, **{f"z {c}": float(r[c]) for c in ccrs if c in z.columns}}
                        for (_, layer), r in z.iterrows()]
                key = f"{model}@{rev}" if rev else model
                vl = df.loc[(df["model"] == model) & (df["revision"] == rev)
                            & (df["metric"] == "val_loss"), "value"]
                tail = f", val loss {float(vl.iloc[0]):.3f}" if len(vl) else ""
                out += [f"\n{key}: {entries['regimes'].get(key, 'no regime')}{tail}",
                        format_table(rows, floatfmt="{:.2f}")]
        out += ["WARNING: identical weights: " + ", ".join(g) for g in entries["identical_weights"]]
        out += [f"LOW SAMPLE {name}: {codes} (see the 'flag' column)"
                for name, codes in entries.get("low_sample", {}).items()]
        out += [f"FAILED {f['name']} (after {f.get('attempts', 1)} attempt"
                f"{'s' if f.get('attempts', 1) != 1 else ''}): {f['error']}"
                for f in entries["failed_jobs"]]
        n = len(self.results)
        out.append(f"\n{n - self.n_failed} of {n} jobs ok")
        return "\n".join(out).lstrip("\n")


def run_sweep(
    jobs: Sequence[JobSpec],
    texts,
    config: LayerSweepConfig,
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


@register
@dataclass(frozen=True)
class SweepConfig:
    """``lmgeom sweep``: the layer sweep of ``analyze`` on every model × checkpoint.

    Attributes:
        jobs: the model × checkpoint jobs (:func:`jobs_from_suite`, :func:`jobs_from_models`).
        texts: the one text set all jobs share.
        layers: per-layer metric settings (``k`` is replaced per model by ``options.k``).
        options: how each job loads and runs its model.
        engine: where the jobs run.
        suite: the suite folder the jobs come from (resolved path), if any.
        name: the title of the report.
    """

    command: ClassVar[str] = "sweep"
    table: ClassVar[str] = "sweep"

    jobs: tuple[JobSpec, ...]
    texts: TextOptions = field(default_factory=lambda: TextOptions(n=256))
    layers: LayerSweepConfig = field(default_factory=LayerSweepConfig)
    options: JobOptions = field(default_factory=JobOptions)
    engine: EngineConfig = field(default_factory=EngineConfig)
    suite: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.jobs:
            raise ConfigError("the sweep has no jobs")
        object.__setattr__(self, "jobs", tuple(self.jobs))
        if self.texts.n is not None and self.options.k != "auto":  # before the run folder
            fit_k(self.options.k, n=self.texts.n, ccr=self.layers.ccr)

    def settings(self) -> dict[str, Any]:
        t = self.texts
        return {"suite": self.suite, "jobs": [[j.model, j.revision, j.spec] for j in self.jobs],
                "texts": t.spec, "n": t.n, "text_column": t.text_column,
                "label_column": t.label_column, "split": t.split, "dtype": self.options.dtype,
                "k": self.options.k, "sweep": config_dict(self.layers)}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> SweepResult:
        extra: dict[str, Any] = {"engine": self.engine.describe()}
        timings: dict[str, float] = {}
        t = time.perf_counter()
        texts = self.texts.load()
        timings["texts_s"] = time.perf_counter() - t
        if self.options.k != "auto":  # an explicit k that cannot fit n stops before any job
            fit_k(self.options.k, n=len(texts), ccr=self.layers.ccr)
        t = time.perf_counter()
        with contextlib.ExitStack() as stack:
            if work_dir is None:
                work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory())) / ".work"
            res = run_sweep(self.jobs, texts, self.layers, out_dir=Path(work_dir).parent,
                            options=self.options, progress=progress, engine=self.engine)
        timings["jobs_s"] = time.perf_counter() - t
        k = self.options.k
        extra.update({
            "models": sorted({j.model for j in self.jobs}, key=lambda m: (len(m), m)),
            "texts": texts.source, "n_texts": len(texts), "texts_hash": texts.hash,
            "n_dropped_texts": texts.n_dropped,
            "k_rule": "min(100, d // 4)" if k == "auto" else f"k = {k}",
            "seeds": {"texts": self.texts.seed, "pga_null_and_pairs": self.layers.seed},
            "timings": timings,
        })
        if self.suite is not None:
            sm = read_suite(self.suite)
            extra["suite_manifest"] = {key: sm.get(key) for key in (
                "format", "tokens_per_width", "steps_total", "seed", "checkpoint_steps",
                "identical_weights")}
            extra["suite_manifest"]["data_hash"] = sm.get("data", {}).get("data_hash")
        res.config = self
        res.extra_manifest = extra
        return res


__all__ = [
    "SweepConfig",
    "SweepResult",
    "gather",
    "identical_weight_groups",
    "run_jobs",
    "run_sweep",
    "tracked_layers",
    "trajectory_rows",
]
