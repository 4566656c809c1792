"""Metrics: pure functions over arrays (numpy in, torch accepted), frozen results out.

No I/O, no model, no globals; randomness only through explicit ``seed`` arguments.
Input problems raise :class:`lmgeom.errors.ConfigError` (bad option) or
:class:`lmgeom.errors.DataError` (unusable arrays); every function takes ``label=`` to prefix
its messages (e.g. ``label="layer 12"``).

Modules: :mod:`~lmgeom.metrics.geometry` (centring, CCR, readout basis, null frames),
:mod:`~lmgeom.metrics.pga` (Subspace PGA, all CCR levels at once, PC1 share), :mod:`~lmgeom.metrics.convergence`
(cross-model alignment), :mod:`~lmgeom.metrics.spectral`, :mod:`~lmgeom.metrics.dispersion`,
:mod:`~lmgeom.metrics.uncertainty`, :mod:`~lmgeom.metrics.probes`.
"""

from __future__ import annotations

from lmgeom.metrics._pairs import sample_pairs
from lmgeom.metrics.convergence import AlignmentResult, cross_model_alignment
from lmgeom.metrics.dispersion import (
    DispersionGap,
    dispersion,
    dispersion_between,
    dispersion_gap,
    dispersion_gap_states,
)
from lmgeom.metrics.geometry import ccr, center, null_frames, random_frame, readout_basis
from lmgeom.metrics.pc1 import PC1Share, pc1_readout_share
from lmgeom.metrics.pga import PGAResult, subspace_pga, subspace_pga_levels
from lmgeom.metrics.probes import ProbeResult, probe_accuracy
from lmgeom.metrics.spectral import (
    alpha_req,
    condition_number,
    isoscore,
    mean_cosine,
    rankme,
    singular_values,
    spectral_summary,
)
from lmgeom.metrics.uncertainty import (
    BootstrapResult,
    CorrelationResult,
    bootstrap_ci,
    correlation_with_ci,
)

__all__ = [
    "AlignmentResult",
    "BootstrapResult",
    "CorrelationResult",
    "DispersionGap",
    "PC1Share",
    "PGAResult",
    "ProbeResult",
    "alpha_req",
    # uncertainty
    "bootstrap_ci",
    "ccr",
    # geometry
    "center",
    "condition_number",
    "correlation_with_ci",
    "cross_model_alignment",
    # dispersion
    "dispersion",
    "dispersion_between",
    "dispersion_gap",
    "dispersion_gap_states",
    "isoscore",
    "mean_cosine",
    "null_frames",
    "pc1_readout_share",
    # probes
    "probe_accuracy",
    "random_frame",
    "rankme",
    "readout_basis",
    "sample_pairs",
    # spectral
    "singular_values",
    "spectral_summary",
    # PGA and diagnostics
    "subspace_pga",
    "subspace_pga_levels",
]
