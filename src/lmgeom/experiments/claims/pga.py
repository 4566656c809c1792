"""The measurements behind the Subspace PGA paper's claims P1-P8 (``lmgeom claims``).

Nothing here re-implements a metric: the claims reuse the existing experiments and take their
verdicts from :mod:`lmgeom.metrics.claims_pga`:

* P1-P5, P8: the ``analyze`` layer sweep (:class:`~lmgeom.experiments.analyze.AnalyzeConfig`:
  PGA z at CCR 0/1/5/10 with its null band, PC1 readout share, spectral metrics, the linear
  probes), its per-layer metrics cached by content in the lmgeom cache
  (``<cache>/layer-metrics``, :func:`sweep_cache`), so a run that stops after the sweep
  loses none of it;
* P7: ``converge`` (:class:`~lmgeom.experiments.convergence.ConvergeExperiment`) on the same
  texts; its extraction is a hit in the activation cache the layer sweep filled (same texts,
  points and pooling), so each model runs forward once;
* P6: ``sweep`` (:class:`~lmgeom.experiments.sweep.SweepConfig`) over a trained width suite.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..._paths import cache_dir
from ...activations import extract
from ...errors import ConfigError
from ...metrics import claims_pga as R
from ...metrics.claims import ClaimVerdict, ModelInfo, Power, not_testable
from ...results import table
from ..analyze import AnalyzeConfig
from ..convergence import ConvergeConfig, converge_pair
from ..layer_sweep import LayerSweepConfig, model_basis
from ..options import ModelOptions, TextOptions
from ..sweep import SweepConfig, jobs_from_suite

#: every PGA claim id (``P8`` comes with its variant ``P8.wide``)
PGA_CLAIMS = ("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8")
#: the claims that rest on the layer sweep
_SWEEP = {"P1", "P2", "P3", "P4", "P5", "P8"}


def wanted(claim: str, only: Sequence[str] | None) -> bool:
    """Whether ``claim`` (``P8.wide`` counts as ``P8``) is among ``only`` (``None``: all)."""
    return only is None or claim.split(".")[0] in {o.split(".")[0] for o in only}


@dataclass
class PgaMeasurements:
    """What the PGA claims were computed from: the tables, the models, the timings."""

    layers: pd.DataFrame | None = None
    converge: pd.DataFrame | None = None
    suite: pd.DataFrame | None = None
    suite_infos: list[ModelInfo] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    texts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    #: an n-ladder's smaller rungs: the layer and converge rows, column ``n_texts``
    ladder: pd.DataFrame | None = None
    converge_ladder: pd.DataFrame | None = None

    def rungs(self) -> list[int]:
        """The smaller n of the ladder (increasing), ``[]`` without one."""
        if self.ladder is None or self.ladder.empty:
            return []
        return sorted(int(n) for n in self.ladder["n_texts"].unique())

    def at(self, n: int) -> PgaMeasurements:
        """The measurements of the rung at ``n`` texts (the sweep and converge rows; no suite)."""
        def pick(df: pd.DataFrame | None) -> pd.DataFrame | None:
            if df is None:
                return None
            return df[df["n_texts"] == n].drop(columns="n_texts").reset_index(drop=True)

        return PgaMeasurements(layers=pick(self.ladder), converge=pick(self.converge_ladder),
                               models=self.models, texts={**self.texts, "n": n})


def sweep_cache() -> Path:
    """Where the claims' layer-sweep metrics are kept between runs: ``<cache>/layer-metrics``
    (each file named by the content key of :func:`~.layer_sweep.run_layer_sweep`)."""
    return cache_dir("layer-metrics")


def measure_pga(models: Sequence[str], *, texts: TextOptions,
                model: ModelOptions, layers: LayerSweepConfig, folds: int = 5,
                converge_null: int | None = None, work_dir: Path, progress: bool | None,
                suite: str | None = None, only: Sequence[str] | None = None,
                ladder: Sequence[int] = ()) -> PgaMeasurements:
    """Run what the requested PGA claims need (module docstring) and return the tables;
    ``ladder``: smaller n whose sweep and convergence are measured again on nested subsets of
    the texts, from the same forward pass (:attr:`PgaMeasurements.ladder`)."""
    out = PgaMeasurements()
    work = Path(work_dir)
    # k decided for n before any model loads (ClaimsConfig.plan has done it already)
    n = len(texts.load())
    layers, _ = layers.fitted(n)
    rungs = tuple(sorted({int(m) for m in ladder if int(m) < n}))
    if any(wanted(c, only) for c in _SWEEP):
        t = time.perf_counter()
        # the per-layer metrics go to the cache, keyed by content (states, weights, every
        # setting): a run that stops later (or a rerun with other claims or another --out)
        # reuses them instead of recomputing the sweep
        # no logit lens: no claim reads it, and its V-wide readout per layer is minutes at
        # n = 256 on the larger vocabularies
        res = AnalyzeConfig(models=tuple(models), texts=texts, model=model,
                            layers=replace(layers, logit_lens=False),
                            probes=True, folds=folds, ladder=rungs).run(work_dir=sweep_cache(),
                                                                        progress=progress)
        out.layers, out.models, out.texts = res.frame, res.models, res.texts
        out.ladder = res.ladder
        out.timings["layer_sweep_s"] = time.perf_counter() - t
        out.timings.update({f"sweep.{k}": v for k, v in res.timings.items()})
    if wanted("P7", only) and len(models) >= 2:
        t = time.perf_counter()
        out.converge, out.converge_ladder = _converge(models, texts, model, layers,
                                                      converge_null, progress, rungs)
        out.timings["converge_s"] = time.perf_counter() - t
    if wanted("P6", only) and suite is not None:
        t = time.perf_counter()
        out.suite, out.suite_infos = _suite_sweep(suite, texts, layers, work / "suite", progress)
        out.timings["suite_sweep_s"] = time.perf_counter() - t
    return out


@dataclass(frozen=True)
class _Shape:
    """What :func:`~lmgeom.experiments.convergence.converge_pair` needs of a model once its
    states are extracted (so no two models are held in memory at once)."""

    name: str
    n_blocks: int
    index: dict[str, int]

    def point_index(self, label: str) -> int:
        return self.index[label]


def _converge(models: Sequence[str], texts: TextOptions, options: ModelOptions,
              layers: LayerSweepConfig, n_null: int | None, progress: bool | None,
              rungs: Sequence[int] = ()) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The ``converge`` rows of every model pair (:func:`~.convergence.converge_pair`, matched
    layers by relative depth, no heatmap); each model loaded once, its extraction a hit in
    the activation cache the layer sweep filled. With ``rungs``: the same on the nested
    subsets the layer sweep's ladder used (second table, column ``n_texts``)."""

    ts = texts.load()
    picks = texts.nested_picks(ts, rungs, seed=layers.seed) if rungs else {}
    loaded = []
    for spec in models:
        m = options.load(spec)
        acts = extract(m, ts, layers=layers.layers, pooling=layers.pooling,
                       max_length=layers.max_length, batch_size=layers.batch_size,
                       seed=layers.seed, progress=progress)
        shape = _Shape(m.name, m.n_blocks, {lab: m.point_index(lab) for lab in acts.layers})
        subs = {n: acts.subset(idx, texts_hash=ts.subset(idx).hash) for n, idx in picks.items()}
        bases = {n: model_basis(m, layers.rung(n, m.width)[0]) for n in picks}
        loaded.append((shape, acts, model_basis(m, layers), subs, bases))
        del m
    rows: list[dict[str, Any]] = []
    ladder_rows: list[dict[str, Any]] = []
    for (ma, aa, ba, sa, bsa), (mb, ab, bb, sb, bsb) in itertools.combinations(loaded, 2):
        cfg = ConvergeConfig(k=layers.k, n_null=n_null or layers.n_null, ccr=1,
                             seed=layers.seed, heatmap=False)
        rows += converge_pair(ma, aa, ba, mb, ab, bb, cfg, progress=progress)[0]
        for n in picks:
            k = min(bsa[n].shape[1], bsb[n].shape[1])
            got = converge_pair(ma, sa[n], bsa[n][:, :k], mb, sb[n], bsb[n][:, :k],
                                replace(cfg, k=k), progress=progress)[0]
            ladder_rows += [{**r, "n_texts": n} for r in got]
    return table.frame(rows), (pd.DataFrame(ladder_rows) if picks else None)


def _suite_sweep(suite: str, texts: TextOptions, layers: LayerSweepConfig, work: Path,
                 progress: bool | None) -> tuple[pd.DataFrame, list[ModelInfo]]:

    jobs = jobs_from_suite(suite)
    res = SweepConfig(jobs=tuple(jobs), texts=texts, layers=layers,
                      suite=str(Path(suite).resolve())).run(work_dir=work / ".work",
                                                           progress=progress)
    infos = {j.model: ModelInfo(name=j.model, d=int(j.width or 0), family="suite", tuned="base")
             for j in jobs}
    return res.rows(), list(infos.values())


def pga_verdicts(m: PgaMeasurements, infos: Sequence[ModelInfo], *, seed: int = 0,
                 only: Sequence[str] | None = None, suite: str | None = None,
                 powers: Mapping[str, Power] | None = None) -> list[ClaimVerdict]:
    """P1-P8 (and P8.wide) from the measurements, in claim order (only those in ``only``);
    ``powers``: each model's :class:`~lmgeom.metrics.claims.Power` (default: the table's n,
    the assumed growth of z with n)."""
    out: list[ClaimVerdict] = []
    df = m.layers
    no_sweep = "the layer sweep did not run"
    for claim, rule in (("P1", lambda d, i: R.p1_wide_stay_positive(d, i, powers=powers)),
                        ("P2", lambda d, i: R.p2_parts(d, i, powers=powers)),
                        ("P3", lambda d, i: R.p3_pc1_leaves_readout(d, i, seed=seed,
                                                                    powers=powers)),
                        ("P4", lambda d, i: R.p4_ccr_restores(d, i, powers=powers)),
                        ("P5", lambda d, i: R.p5_spectral_flat(d, i, seed=seed,
                                                               powers=powers))):
        if wanted(claim, only):
            got = (rule(df, infos) if df is not None else
                   [not_testable(c, R.STATEMENTS[c], no_sweep)
                    for c in (claim, *R.PARTS.get(claim, ()))])
            out += got if isinstance(got, list) else [got]
    if wanted("P6", only):
        reason = "" if suite is None else "the width suite's sweep gave no rows"
        out.append(R.p6_width_suite(m.suite, m.suite_infos or infos, reason=reason))
    if wanted("P7", only):
        out += R.p7_parts(m.converge, infos, seed=seed)
    if wanted("P8", only):
        out += (R.p8_probes(df, infos, seed=seed, powers=powers) if df is not None
                else [not_testable(c, R.STATEMENTS[c], no_sweep) for c in ("P8", "P8.wide")])
    return out


def measure_pga_claims(models: Sequence[str], infos: Sequence[ModelInfo], *, n: int, seed: int,
                       device: str | None, dtype: str | None, work_dir: Path,
                       progress: bool | None, suite: str | None = None,
                       only: Sequence[str] | None = None) -> list[ClaimVerdict]:
    """P1-P8 verdicts on ``models`` (the same signature as
    ``claims.dispersion.measure_dispersion_claims``): the default texts (``builtin:domains``,
    ``n`` of them, seeded), the default layer sweep, ``device`` / ``dtype`` for the models."""
    if not models:
        raise ConfigError("give at least one model")
    layers = LayerSweepConfig(seed=seed)
    meas = measure_pga(models, texts=TextOptions(n=n, seed=seed),
                       model=ModelOptions(dtype=dtype or "float32", device=device),
                       layers=layers, work_dir=Path(work_dir), progress=progress, suite=suite,
                       only=only)
    return pga_verdicts(meas, infos, seed=seed, only=only, suite=suite)


__all__ = [
    "PGA_CLAIMS",
    "PgaMeasurements",
    "measure_pga",
    "measure_pga_claims",
    "pga_verdicts",
    "sweep_cache",
    "wanted",
]
