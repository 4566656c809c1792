"""``lmgeom claims``: the experiment (:class:`ClaimsConfig`) and its result.

The PGA paper's claims P1-P8 are measured by :mod:`lmgeom.experiments.claims.pga`, the
dispersion paper's D1-D8 by :mod:`lmgeom.experiments.claims.dispersion`; the verdict rules live in
:mod:`lmgeom.metrics.claims_pga` / :mod:`lmgeom.metrics.claims_dispersion`. The result is one
row per claim (:meth:`~lmgeom.metrics.claims.ClaimVerdict.row`) in ``claims.parquet``, the layer
sweep and convergence tables beside it, and a report page (:mod:`lmgeom.report.claims`)::

    from lmgeom.experiments import run_experiment
    from lmgeom.experiments.claims import ClaimsConfig
    run = run_experiment(ClaimsConfig(models=("smollm2-135m",)), "runs/claims")
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from ..._paths import cache_dir
from ...errors import ConfigError
from ...metrics.claims import REFERENCE_N, ClaimVerdict, ModelInfo, Power, mark_unstable
from ...metrics.claims_profile import ladder_powers
from ...metrics.sample_size import warn_low_sample
from ...models.bundled import BUNDLED
from ...report.claims import verdict_lines, write_claims_report
from ..base import register
from ..layer_sweep import LayerSweepConfig, config_dict, fit_k
from ..options import ModelOptions, TextOptions
from .dispersion import measure_dispersion_claims
from .dispersion_base import CLAIMS
from .pga import PgaMeasurements, measure_pga, pga_verdicts, wanted

DISPERSION_CLAIMS = CLAIMS
PGA_IDS = tuple(f"P{i}" for i in range(1, 9))
#: the claims whose numbers depend on the readout dimension k (the layer sweep, converge)
SWEEP_CLAIMS = ("P1", "P2", "P3", "P4", "P5", "P7", "P8")
_ID = re.compile(r"^[PD][1-8]$")


def dispersion_cache() -> Path:
    """Where the D-claims' measurements are kept between runs: ``<cache>/claims-dispersion``
    (each file named by the content key of its measurement)."""
    return cache_dir("claims-dispersion")


def installed_bundled() -> tuple[str, ...]:
    """Every bundled model whose packages are installed, in the registry's order."""
    return tuple(name for name, bm in BUNDLED.items() if bm.installed())


def parse_only(text: str | None) -> tuple[str, ...] | None:
    """``"P1,d3"`` → ``("P1", "D3")``; ``None`` / ``""`` → ``None`` (every claim)."""
    if not text:
        return None
    out = tuple(dict.fromkeys(x.strip().upper() for x in str(text).split(",") if x.strip()))
    bad = [x for x in out if not _ID.match(x)]
    if bad or not out:
        raise ConfigError(f"--only: {', '.join(bad) or repr(text)} is not a claim id; use "
                          "P1..P8 and D1..D8, comma-separated (e.g. --only P1,D3)")
    return out


def parse_ladder(value: str | Sequence[int]) -> tuple[int, ...]:
    """``"64,128,256"`` (or a sequence) → ``(64, 128, 256)``: at least two distinct sizes of
    at least 8 texts, increasing."""
    parts = str(value).split(",") if isinstance(value, str) else list(value)
    try:
        sizes = tuple(sorted({int(str(x).strip()) for x in parts if str(x).strip()}))
    except ValueError:
        sizes = ()
    if len(sizes) < 2 or sizes[0] < 8:
        raise ConfigError(f"--n-ladder {value!r}: give two or more numbers of texts, each at "
                          "least 8, comma-separated (e.g. --n-ladder 64,128,256)")
    return sizes


def tuning_of(spec: str, description: str = "") -> str:
    """``base`` / ``instruct`` / ``unknown`` from a bundled model's registry entry (its own
    ``tuned`` field when it has one, else the words of its description) or the spec's name."""
    bm = BUNDLED.get(spec)
    if bm is not None and getattr(bm, "tuned", None) in ("base", "instruct"):
        return str(bm.tuned)
    words = " ".join([description, bm.description if bm else "", bm.gguf_name if bm else "",
                      spec]).lower()
    if re.search(r"instruct|\bchat\b|-it\b|\bit\b", words):
        return "instruct"
    if re.search(r"\bbase\b", words):
        return "base"
    return "unknown"


def model_infos(models: tuple[str, ...], options: ModelOptions,
                known: Sequence[dict[str, Any]] = ()) -> list[ModelInfo]:
    """Each model's width, family, depth and tuning: from ``known`` (the layer sweep's model
    facts, in the order of ``models``) where given, else by loading the model once."""
    out = []
    for i, spec in enumerate(models):
        if i < len(known) and known[i].get("width"):
            k = known[i]
            out.append(ModelInfo(name=str(k.get("name") or spec), d=int(k["width"]),
                                 family=str(k.get("model_type")),
                                 tuned=tuning_of(spec), n_layers=int(k.get("n_blocks") or 0)))
            continue
        m = options.load(spec)
        out.append(ModelInfo(name=str(m.name), d=int(m.width), family=str(m.model_type),
                             tuned=tuning_of(spec), n_layers=int(m.n_blocks)))
        del m
    return out


@register
@dataclass(frozen=True)
class ClaimsConfig:
    """``lmgeom claims``: test each claim of the two papers on the models given.

    Attributes:
        models: model specs (default: every installed bundled model).
        texts: the texts of the PGA claims (labelled, for the probes of P8); their ``n`` and
            seed also go to the dispersion claims. Every n is drawn as the nested subset of
            the seeded sample of max(256, n) texts (``within``), so ``--n 64`` decides on the
            texts of the n = 64 rung of ``--n-ladder 64,128,256``, and reaches its verdict.
        model: how the models load (dtype, device ...).
        layers: the layer sweep behind P1-P5 and P8 (CCR levels 0,1,5,10 by default).
        folds: CV folds of the linear probes (P8).
        suite: a trained width suite folder (P6, and D4 where it needs checkpoints).
        only: run only these claim ids (``("P1", "D3")``); ``None``: all.
        ladder: an n-ladder (``(64, 128, 256)``; its largest n is ``texts.n``): the PGA claims
            (P1-P5, P7, P8) are decided again at each smaller n on nested seeded subsets of
            the texts, their states sliced from the one forward pass per model; the growth of
            |z| with n is measured per model from the rungs, and a verdict that differs
            between the two largest n becomes ``unstable``
            (:func:`~lmgeom.metrics.claims.mark_unstable`). ``()``: no ladder.
    """

    command: ClassVar[str] = "claims"
    table: ClassVar[str] = "claims"

    models: tuple[str, ...] = ()
    texts: TextOptions = field(default_factory=lambda: TextOptions(n=256))
    model: ModelOptions = field(default_factory=ModelOptions)
    layers: LayerSweepConfig = field(default_factory=LayerSweepConfig)
    folds: int = 5
    suite: str | None = None
    only: tuple[str, ...] | None = None
    ladder: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        models = tuple(self.models) or installed_bundled()
        if not models:
            raise ConfigError("no bundled model is installed and no --model given; install one "
                              "(`make demo`) or pass --model SPEC")
        object.__setattr__(self, "models", models)
        if self.only is not None:
            object.__setattr__(self, "only", parse_only(",".join(self.only)))
        if self.suite is not None and not Path(self.suite).is_dir():
            raise ConfigError(f"--suite {self.suite}: no such folder (a suite from `lmgeom suite "
                              "train --out DIR`)")
        if self.texts.n is None:
            raise ConfigError("claims need a number of texts (--n)")
        if self.texts.within is None:  # every n <= 256 on the texts of the 256's ladder rung
            object.__setattr__(self, "texts", replace(self.texts,
                                                      within=max(REFERENCE_N, self.texts.n)))
        fit_k(self.layers.k, n=self.texts.n, ccr=self.layers.ccr)  # before the run folder
        if self.ladder:
            rungs = parse_ladder(self.ladder)
            if rungs[-1] != self.texts.n:
                raise ConfigError(f"--n-ladder {','.join(map(str, rungs))}: its largest n "
                                  f"({rungs[-1]}) is the run's n, but --n is {self.texts.n}; "
                                  "leave --n out or make them equal")
            fit_k(self.layers.k, n=rungs[0], ccr=self.layers.ccr)  # the smallest rung too
            object.__setattr__(self, "ladder", rungs)

    def settings(self) -> dict[str, Any]:
        return {"models": list(self.models), "texts": self.texts.spec, "n": self.texts.n,
                "seed": self.texts.seed, "texts_within": self.texts.within, "dtype": self.model.dtype,
                "sweep": config_dict(self.layers), "folds": self.folds,
                "suite": str(Path(self.suite).resolve()) if self.suite else None,
                "only": list(self.only) if self.only else None,
                **({"ladder": list(self.ladder)} if self.ladder else {})}

    def plan(self) -> tuple[LayerSweepConfig, str | None, int]:
        """What the texts can support, decided before any model loads: the layer sweep with
        its k fitted to n and the CCR levels (:func:`~.layer_sweep.fit_k`; an explicit k that
        does not fit raises :class:`ConfigError` here), the note when k was lowered, and n."""
        n = len(self.texts.load())
        layers, note = self.layers.fitted(n)
        return layers, note, n

    def run(self, *, work_dir: str | Path | None = None,
            progress: bool | None = None) -> ClaimsResult:

        timings: dict[str, float] = {}
        t = time.perf_counter()
        layers, k_note, n = self.plan()
        timings["plan_s"] = time.perf_counter() - t
        if k_note is not None:
            warn_low_sample(k_note)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(work_dir) if work_dir is not None else Path(tmp)
            t = time.perf_counter()
            meas = measure_pga(self.models, texts=self.texts, model=self.model,
                               layers=layers, folds=self.folds, work_dir=work,
                               progress=progress, suite=self.suite, only=self.only,
                               ladder=self.ladder)
            t1 = time.perf_counter()
            infos = model_infos(self.models, self.model, meas.models)
            timings["model_infos_s"] = time.perf_counter() - t1
            powers = self._powers(meas, n, infos)
            verdicts = self._with_note(pga_verdicts(meas, infos, seed=self.layers.seed,
                                                    only=self.only, suite=self.suite,
                                                    powers=powers.get(n)), k_note)
            ladder = {m: [v for v in self._with_note(pga_verdicts(
                meas.at(m), infos, seed=self.layers.seed, only=self.only, powers=powers.get(m)),
                layers.rung(m)[1]) if v.claim.split(".")[0] in SWEEP_CLAIMS]
                for m in meas.rungs()}
            if ladder:  # the two largest n disagree: unstable
                verdicts = mark_unstable(verdicts, ladder[max(ladder)], n_top=n,
                                         n_lower=max(ladder))
            timings["pga_claims_s"] = time.perf_counter() - t
            t = time.perf_counter()
            # the D-claims' measurements are keyed by content (models, texts, settings): kept
            # in the lmgeom cache, so a run that stops later, or reruns, reuses them
            verdicts += self._dispersion(infos, work / "dispersion", progress)
            timings["dispersion_claims_s"] = time.perf_counter() - t
        timings.update({f"pga.{k}": v for k, v in meas.timings.items()})
        return ClaimsResult(self, verdicts, infos, meas, timings,
                            {"k": layers.k, "k_asked": self.layers.k, "k_note": k_note,
                             "n_texts": n, "ccr": list(layers.ccr),
                             **({"ladder_k": {m: layers.rung(m)[0].k for m in ladder}}
                                if ladder else {})},
                            ladder)

    @staticmethod
    def _with_note(verdicts: list[ClaimVerdict], note: str | None) -> list[ClaimVerdict]:
        """Every verdict that rests on the sweep says why k was lowered, when it was."""
        if note is None:
            return verdicts
        return [replace(v, reason=f"{v.reason}; {note}")
                if v.claim.split(".")[0] in SWEEP_CLAIMS else v for v in verdicts]

    @staticmethod
    def _powers(meas: PgaMeasurements, n: int, infos: list[ModelInfo]
                ) -> dict[int, dict[str, Power]]:
        """With a ladder: each model's power per rung, the growth of |z| measured on it."""
        if not meas.rungs() or meas.layers is None:
            return {}
        tables = {m: meas.at(m).layers for m in meas.rungs()}
        return ladder_powers({**tables, n: meas.layers}, infos)

    def _dispersion(self, infos: list[ModelInfo], work: Path,
                    progress: bool | None) -> list[ClaimVerdict]:
        ids = [c for c in DISPERSION_CLAIMS if wanted(c, self.only)]
        if not ids:
            return []
        only = [c for c in self.only if c.startswith("D")] if self.only else None
        # the measurements in the cache (content-keyed); the fine-tuning runs of D3/D8 are run
        # folders, which may not lie in the cache: in this run's work folder
        return list(measure_dispersion_claims(
            self.models, infos, n=int(self.texts.n or 0), seed=self.texts.seed,
            device=self.model.device, dtype=self.model.dtype, work_dir=dispersion_cache(),
            runs_dir=work, progress=progress, suite=self.suite, only=only))


@dataclass
class ClaimsResult:
    """The verdicts, the models they rest on and the tables they were computed from."""

    config: ClaimsConfig
    verdicts: list[ClaimVerdict]
    infos: list[ModelInfo]
    measurements: PgaMeasurements
    timings: dict[str, float]
    plan: dict[str, Any] = field(default_factory=dict)
    #: with a ladder: the PGA verdicts at each smaller n
    ladder: dict[int, list[ClaimVerdict]] = field(default_factory=dict)

    def rows(self) -> pd.DataFrame:
        return pd.DataFrame([v.row() for v in self.verdicts],
                            columns=list(ClaimVerdict.__dataclass_fields__)
                            + ["widths", "families"]).drop(columns=["details"])

    def ladder_rows(self) -> pd.DataFrame | None:
        """With a ladder: one row per claim and n (column ``n_texts``), the largest n's rows
        as in ``claims.parquet`` but before :func:`~lmgeom.metrics.claims.mark_unstable`."""
        if not self.ladder:
            return None
        n = int(self.plan.get("n_texts") or 0)
        top = [v for v in self.verdicts if v.claim.split(".")[0] in SWEEP_CLAIMS]
        frames = [pd.DataFrame([v.row() for v in vs]).assign(n_texts=m)
                  for m, vs in sorted(self.ladder.items())]
        frames.append(pd.DataFrame([_before_unstable(v).row() for v in top]).assign(n_texts=n))
        return pd.concat(frames, ignore_index=True).drop(columns=["details"], errors="ignore")

    def extra_tables(self) -> dict[str, pd.DataFrame]:
        """``layers`` (the layer sweep), ``converge`` and ``suite`` tables when they ran; with
        a ladder ``claims_ladder`` (the verdicts per n) and ``layers_ladder`` (the rungs'
        layer rows)."""
        m = self.measurements
        return {k: v for k, v in (("layers", m.layers), ("converge", m.converge),
                                  ("suite", m.suite), ("claims_ladder", self.ladder_rows()),
                                  ("layers_ladder", m.ladder)) if v is not None}

    def manifest(self) -> dict[str, Any]:
        c = self.config
        m = self.measurements
        return {"models": [asdict(i) for i in self.infos], "loaded_models": m.models,
                "texts": m.texts.get("source", c.texts.spec), "n_texts": m.texts.get("n"),
                "texts_hash": m.texts.get("hash"),
                "seeds": {"texts": c.texts.seed, "pga_null_and_pairs": c.layers.seed,
                          "bootstrap": c.layers.seed},
                "readout_k": dict(self.plan),
                "claims": {v.claim: {"verdict": v.verdict, "seed": v.seed,
                                     "details": _plain(v.details)} for v in self.verdicts},
                "timings": dict(self.timings)}

    def figures(self, folder, manifest: dict[str, Any]) -> Path | None:

        return write_claims_report(folder.path, self.rows(), self.measurements.layers, manifest,
                                   infos=self.infos,
                                   title="lmgeom claims — " + ", ".join(self.config.models))

    def summary(self) -> str:

        return "\n".join(verdict_lines(self.rows()))


def _before_unstable(v: ClaimVerdict) -> ClaimVerdict:
    """The verdict an ``unstable`` one had at the largest n (from its details)."""
    at = v.details.get("verdict_at_n") if v.verdict == "unstable" else None
    if not at:
        return v
    return replace(v, verdict=at[max(at)], reason=v.details.get("reason_at_top", v.reason))


def _plain(x: Any) -> Any:
    """JSON-safe copy of a details dict (numpy numbers and arrays → Python, tuples → lists)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalars and arrays
        return x.tolist()
    return x


__all__ = ["ClaimsConfig", "ClaimsResult", "dispersion_cache", "installed_bundled", "model_infos",
           "parse_ladder", "parse_only", "tuning_of"]
