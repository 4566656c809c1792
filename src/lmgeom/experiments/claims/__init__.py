"""``lmgeom claims``: a measured verdict on every claim of the two papers.

The package, bottom to top (each module imports only those above it in this list):

* :mod:`~lmgeom.experiments.claims.dispersion_base` — the D-claims' ids, settings
  (:class:`DispersionClaimsSettings`), content keys, array cache and clock;
* :mod:`~lmgeom.experiments.claims.pga` — the measurements behind P1-P8 (the layer sweep, with
  an n-ladder; converge; a width suite's sweep) and their verdicts;
* :mod:`~lmgeom.experiments.claims.dispersion_models` (D4, D6, D7) and
  :mod:`~lmgeom.experiments.claims.dispersion_train` (D3, D8);
* :mod:`~lmgeom.experiments.claims.dispersion` — D1, D2, D5 and the D-claims' entry point;
* :mod:`~lmgeom.experiments.claims.experiment` — :class:`ClaimsConfig` (``lmgeom claims``) and
  :class:`ClaimsResult`.

The verdict rules are in :mod:`lmgeom.metrics.claims_pga` / :mod:`lmgeom.metrics.claims_dispersion`.
This ``__init__`` is the public import path::

    from lmgeom.experiments import run_experiment
    from lmgeom.experiments.claims import ClaimsConfig
    run = run_experiment(ClaimsConfig(models=("smollm2-135m",)), "runs/claims")
"""

from .dispersion import measure_dispersion_claims
from .dispersion_base import DispersionClaimsSettings
from .experiment import (
    ClaimsConfig,
    ClaimsResult,
    dispersion_cache,
    installed_bundled,
    model_infos,
    parse_ladder,
    parse_only,
    tuning_of,
)
from .pga import PgaMeasurements, measure_pga, measure_pga_claims, pga_verdicts, sweep_cache

__all__ = [
    "ClaimsConfig",
    "ClaimsResult",
    "DispersionClaimsSettings",
    "PgaMeasurements",
    "dispersion_cache",
    "installed_bundled",
    "measure_dispersion_claims",
    "measure_pga",
    "measure_pga_claims",
    "model_infos",
    "parse_ladder",
    "parse_only",
    "pga_verdicts",
    "sweep_cache",
    "tuning_of",
]
