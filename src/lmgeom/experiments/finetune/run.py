"""The registered fine-tuning experiment (:class:`FinetuneConfig`, ``lmgeom train``) and its
run: the baseline, every arm, the table, the plots and the report."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._io import fs_clock_ns, record_tree, write_json
from ...errors import ConfigError
from ...report.figures_training import plot_curves
from ...report.html import write_report
from ..base import register, run_experiment
from .arms import load_lm, train_arm
from .config import ARMS, ArmResult, FinetuneSettings
from .data import Domain, domain_schedule, prepare_data
from .evaluation import (
    decode_eval,
    delta_rows,
    encode_eval,
    evaluate,
    summary_frame,
    summary_text,
    tidy,
)

log = logging.getLogger("lmgeom.experiments.finetune")


# ---------------------------------------------------------------------- config
@register
@dataclass
class FinetuneConfig(FinetuneSettings):
    """One fine-tuning run (every field:
    :class:`~lmgeom.experiments.finetune.config.FinetuneSettings`): a registered experiment, ``run_experiment(config, out)`` or
    :func:`finetune`."""

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> FinetuneResult:
        """Train every arm (resuming what is there). The run folder is ``work_dir``'s parent
        (``run_experiment`` passes ``out/.work``): the arms live in ``out/arms/<arm>``."""
        if work_dir is None:
            raise ConfigError("fine-tuning writes its models into a run folder: run it with "
                              "lmgeom.experiments.run_experiment(config, out) or "
                              "finetune(config, out)")
        out_dir = Path(work_dir).parent
        t_start_ns = fs_clock_ns(out_dir)
        try:
            return _run(self, out_dir, self.progress if progress is None else progress,
                        t_start_ns)
        finally:
            record_tree(out_dir, since_ns=t_start_ns)  # what this run wrote (--overwrite)


# ---------------------------------------------------------------------- the result
@dataclass
class FinetuneResult:
    """What a fine-tuning run produced.

    Attributes:
        table: tidy results (``train.parquet``), one row per arm × step × set × metric.
        arms: per-arm :class:`~lmgeom.experiments.finetune.ArmResult`.
        finished: every arm reached ``steps``.
        out_dir: the run folder.
        report: ``report.html`` (None while unfinished; set by :func:`finetune`).
        entries: what the run adds to ``manifest.json``.
        config: the run's :class:`FinetuneConfig`.
    """

    table: Any
    arms: dict[str, ArmResult]
    finished: bool
    out_dir: Path
    report: Path | None
    entries: dict[str, Any]
    config: Any = None
    t_start_ns: int = 0

    def rows(self):
        return self.table

    def manifest(self) -> dict[str, Any]:
        return dict(self.entries)

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        """``plots/train_curves.png|svg`` and ``report.html`` once every arm is finished."""
        if not self.finished:
            return None

        cfg, out_dir = self.config, folder.path
        label = self.entries["layer"]
        figs = plot_curves(self.table, folder.plots)
        extra = []
        if figs:
            caption = (f"Held-out perplexity and token-level dispersion at layer {label} per "
                       f"arm (none / push-away / squeeze, λ = {cfg.lam:g}, {cfg.method}, "
                       f"mode {cfg.aux_mode}); same seed and data order for every arm.")
            extra.append(("Perplexity and dispersion over training steps", figs, caption))
        manifest["extra_plots"] = [str(Path(p).relative_to(out_dir)) for p in figs]
        page = write_report(out_dir, self.table, manifest, extra_figures=extra,
                            title=f"lmgeom train — {cfg.model}, {cfg.method}, "
                                  f"{'+'.join(cfg.texts)}")
        record_tree(out_dir, since_ns=self.t_start_ns)  # the plots too (--overwrite)
        return page

    def summary(self) -> str:
        """What ``lmgeom train`` prints: the before / after table, or where a stopped run is."""
        cfg = self.config
        if not self.finished:
            done = {a: (r.log[-1]["step"] if r.log else 0) for a, r in self.arms.items()}
            return (f"stopped before the end ({', '.join(f'{a}: step {s}' for a, s in done.items())}"
                    f" of {cfg.steps}); checkpoints are in {self.out_dir}/arms — rerun the same "
                    "command to continue")
        return summary_text(cfg, self.entries.get("layer", cfg.layer), self.table)

    def summary_frame(self):
        """Before / after per arm and evaluation set (a DataFrame)."""
        return summary_frame(self.table)


# ---------------------------------------------------------------------- the run
def _baseline(cfg: FinetuneConfig, lm, label: str, eval_sets, out_dir: Path,
              timings: dict[str, float]) -> dict[str, Any] | None:
    """Step 0 is the same model for every arm: with several arms, measure it once
    (``baseline.json``)."""
    if len(cfg.arms) < 2:
        return None
    base_file = out_dir / "baseline.json"
    if base_file.is_file():
        return decode_eval(json.loads(base_file.read_text()))
    t = time.perf_counter()
    baseline = evaluate(lm, eval_sets, label, batch_size=cfg.eval_batch_size,
                        skip_first=cfg.skip_first, seed=cfg.seed)
    timings["baseline_eval_s"] = time.perf_counter() - t
    write_json(base_file, encode_eval(baseline))
    return baseline


def _train_arms(cfg: FinetuneConfig, domains: list[Domain], eval_sets, out_dir: Path,
                baseline, timings: dict[str, float],
                progress: bool | None) -> dict[str, ArmResult]:
    """Every arm in turn, within the ``stop_after`` budget of this call."""
    results: dict[str, ArmResult] = {}
    budget = cfg.stop_after  # steps left in this call (over all arms)
    for arm in cfg.arms:
        t = time.perf_counter()
        results[arm] = train_arm(cfg, arm, domains, eval_sets, out_dir / "arms" / arm,
                                 baseline=baseline, on_eval=_log_eval, budget=budget,
                                 progress=progress, make_hooks=cfg.make_hooks)
        timings[f"arm_s[{arm}]"] = time.perf_counter() - t
        if not results[arm].finished:
            break
        if budget is not None:
            budget -= int(results[arm].info.get("steps_run", 0))
            if budget <= 0 and arm != cfg.arms[-1]:
                log.warning("stopped after %d steps (--stop-after) before arm %s; rerun to "
                            "continue", cfg.stop_after, cfg.arms[cfg.arms.index(arm) + 1])
                break
    return results


def _run(cfg: FinetuneConfig, out_dir: Path, progress: bool | None,
         t_start_ns: int) -> FinetuneResult:
    from ...training.losses import resolve_layer

    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    lm = load_lm(cfg)
    label = resolve_layer(lm, cfg.layer)
    domains, eval_sets = prepare_data(lm, cfg)
    timings["data_s"] = time.perf_counter() - t
    baseline = _baseline(cfg, lm, label, eval_sets, out_dir, timings)
    model_info = lm.describe()
    del lm
    results = _train_arms(cfg, domains, eval_sets, out_dir, baseline, timings, progress)
    finished = len(results) == len(cfg.arms) and all(r.finished for r in results.values())
    rows = [r for a in results.values() for r in a.rows]
    if finished:
        rows += delta_rows(cfg, label, results)
    timings["total_s"] = time.perf_counter() - t_start
    entries = {
        "models": [cfg.model],
        "texts": list(cfg.texts) + [t for t in cfg.eval_texts if t not in cfg.texts],
        "model_info": model_info, "layer": label, "arms": list(cfg.arms), "complete": finished,
        "data": [d.info for d in domains], "eval_sets": {k: len(v) for k, v in eval_sets.items()},
        "epochs": domain_schedule(domains, cfg.batch_size, cfg.seed).epochs(cfg.steps),
        "lr_used": cfg.learning_rate,
        "seeds": {"split": cfg.seed, "data_order": cfg.seed, "lora_init": cfg.seed,
                  "aux_sampling": cfg.seed, "eval_chunks": cfg.seed},
        "arm_info": {a: r.info | {"model_dir": r.model_dir, "finished": r.finished}
                     for a, r in results.items()},
        "timings": timings,
    }
    return FinetuneResult(tidy(rows), results, finished, out_dir, None, entries, cfg, t_start_ns)


def _log_eval(arm: str, step: int, ev: dict[str, dict[str, Any]]) -> None:
    for name, m in ev.items():
        log.info("%s step %d %s: perplexity %.4g, dispersion %.4f", arm, step, name,
                 m["perplexity"], m["dispersion"])


def finetune(cfg: FinetuneConfig, out: str | os.PathLike[str], *, overwrite: bool = False,
             report: bool = True) -> FinetuneResult:
    """Run every arm of ``cfg`` into the run folder ``out`` (resuming what is there):
    :func:`~lmgeom.experiments.base.run_experiment` — locked against a second run while this
    one writes, refused for a different run unless ``overwrite``."""
    run = run_experiment(cfg, out, overwrite=overwrite, progress=cfg.progress, report=report)
    run.result.report = run.report
    return run.result


def compare_arms(cfg: FinetuneConfig, out: str | os.PathLike[str], **kwargs: Any) -> FinetuneResult:
    """:func:`finetune` with the three arms none / push-away / squeeze."""
    return finetune(dataclasses.replace(cfg, arms=ARMS), out, **kwargs)


__all__ = ["FinetuneConfig", "FinetuneResult", "compare_arms", "finetune"]
