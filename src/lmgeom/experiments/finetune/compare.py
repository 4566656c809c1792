"""``lmgeom train --compare A,B,... --seeds 0,1,2``: the dispersion regularisers side by side,
with confidence intervals over seeds.

Each seed is one ordinary fine-tuning run (:class:`~lmgeom.experiments.finetune.FinetuneConfig`
with every chosen arm: same data and order within a seed) in ``<out>/.work/seed<N>/``, so an
interrupted comparison resumes seed by seed and arm by arm. For every arm, held-out evaluation
set and seed it takes the change from the initial model to the last step of

* ``perplexity`` and ``dispersion`` (``<metric>_change``), and, when ``none`` is among the arms,
* the difference from the ``none`` arm of the same seed (``<metric>_vs_none``),

then reports the mean over seeds with a Student-t 95 % interval (``n`` = the number of seeds;
one seed gives no interval). Rows are lmgeom's tidy table (``revision`` = the arm) in
``compare.parquet``; ``plots/compare.png`` shows the changes per regulariser with their
intervals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from scipy import stats

from ...errors import ConfigError
from ...report.figures_compare import plot_compare
from ...report.html import write_report
from ...results.table import frame, row
from .evaluation import tidy
from .run import FinetuneConfig, finetune

METRICS = ("perplexity", "dispersion")


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval of ``values`` (``nan`` bounds with fewer than 2)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    h = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - h, m + h


def seed_changes(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    """One seed's finetune table → ``arm, eval, metric, change, vs_none, seed`` (the last step
    minus step 0, and minus the ``none`` arm's change on the same set)."""
    df = tidy(table.to_dict("records")) if "arm" not in table else table
    df = df[df["metric"].isin(METRICS) & df["eval"].str.len().astype(bool)
            & (df["eval"] != "train")]
    last = int(df["step"].max())
    keyed = df.set_index(["arm", "eval", "metric", "step"])["value"]
    out = []
    for (arm, ev, metric), _ in df.groupby(["arm", "eval", "metric"]):
        out.append({"arm": arm, "eval": ev, "metric": metric, "seed": seed,
                    "change": float(keyed[(arm, ev, metric, last)] - keyed[(arm, ev, metric, 0)])})
    res = pd.DataFrame(out)
    base = res[res.arm == "none"].set_index(["eval", "metric"])["change"]
    res["vs_none"] = [c - base.get((e, m), math.nan) if len(base) else math.nan
                      for e, m, c in zip(res["eval"], res["metric"], res["change"])]
    return res


def compare_rows(changes: pd.DataFrame, model: str, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Mean and t-interval over seeds per arm × evaluation set × metric."""
    rows = []
    tag = ",".join(str(s) for s in seeds)
    for (arm, ev, metric), g in changes.groupby(["arm", "eval", "metric"], sort=False):
        for col, suffix in (("change", "change"), ("vs_none", "vs_none")):
            vals = [v for v in g[col] if math.isfinite(v)]
            if not vals or (suffix == "vs_none" and arm == "none"):
                continue
            m, lo, hi = t_interval(vals)
            rows.append(row(model=model, revision=arm, metric=f"{metric}_{suffix}",
                            setting=f"eval={ev};seeds={tag}", value=m, ci_low=lo, ci_high=hi,
                            seed=int(seeds[0]), n=float(len(vals))))
    return rows


@dataclass
class SeedComparison:
    """The regularisers of ``config.arms`` trained once per seed (run by ``run_experiment``)."""

    command: ClassVar[str] = "train"
    table: ClassVar[str] = "compare"

    config: FinetuneConfig
    seeds: tuple[int, ...] = (0, 1, 2)
    progress: bool | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.seeds = tuple(int(s) for s in self.seeds)
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ConfigError(f"--seeds must be distinct integers, got {list(self.seeds)}")
        if len(self.config.arms) < 2:
            raise ConfigError("--compare needs at least two regularisers (e.g. none,push-away)")

    def settings(self) -> dict[str, Any]:
        return {"compare": self.config.settings(), "seeds": list(self.seeds)}

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> ComparisonResult:
        if work_dir is None:
            raise ConfigError("SeedComparison runs inside a run folder (run_experiment)")
        parts = []
        for s in self.seeds:
            cfg = dataclasses.replace(self.config, seed=s)
            res = finetune(cfg, Path(work_dir) / f"seed{s}", report=False)
            if not res.finished:
                raise ConfigError(f"seed {s} stopped before its last step; rerun to go on")
            parts.append(seed_changes(res.table, s))
        changes = pd.concat(parts, ignore_index=True)
        return ComparisonResult(self, changes,
                                frame(compare_rows(changes, self.config.model, self.seeds)))


@dataclass
class ComparisonResult:
    comparison: SeedComparison
    changes: pd.DataFrame
    table: pd.DataFrame

    def rows(self) -> pd.DataFrame:
        return self.table

    def manifest(self) -> dict[str, Any]:
        return {"seeds": list(self.comparison.seeds), "arms": list(self.comparison.config.arms),
                "per_seed": self.changes.to_dict("records")}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:
        figs = plot_compare(self.table, folder.plots)
        cfg = self.comparison.config
        cap = (f"Change from the initial model to step {cfg.steps} of held-out perplexity and "
               f"dispersion per regulariser (λ = {cfg.lam:g}, {cfg.method}); mean over seeds "
               f"{', '.join(map(str, self.comparison.seeds))} with a Student-t 95 % interval.")
        return write_report(folder.path, self.table, manifest,
                            extra_figures=[("Regularisers compared", figs, cap)] if figs else [],
                            title=f"lmgeom train --compare — {cfg.model}")

    def summary(self) -> str:
        df = self.table
        lines = [f"{'regulariser':<12} {'metric':<22} {'eval':<34} {'mean':>10}  95 % CI over seeds"]
        for r in df.itertuples():
            ev = r.setting.split(";")[0].removeprefix("eval=")
            ci = (f"[{r.ci_low:+.4g}, {r.ci_high:+.4g}]" if math.isfinite(r.ci_low)
                  else "(one seed: no interval)")
            lines.append(f"{r.revision:<12} {r.metric:<22} {ev[:34]:<34} {r.value:>+10.4g}  {ci}")
        return "\n".join(lines)


__all__ = ["ComparisonResult", "SeedComparison", "compare_rows", "seed_changes", "t_interval"]
