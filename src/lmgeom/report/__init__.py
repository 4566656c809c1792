"""The report layer: results table → plots (matplotlib, Agg) → one self-contained HTML page.

No computation happens here beyond selecting and grouping rows of the tidy table
(:mod:`lmgeom.results.table`)::

    from lmgeom.report import write_report
    write_report("runs/demo", df, manifest)      # runs/demo/report.html + runs/demo/plots/*

Imports are lazy: ``import lmgeom.report`` does not import matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "write_report": "lmgeom.report.html",
    "layer_table": "lmgeom.report.html",
    "SECTIONS": "lmgeom.report.html",
    "plot_metric_by_layer": "lmgeom.report.plots",
    "build_layer_figure": "lmgeom.report.plots",
    "plot_pga": "lmgeom.report.plots",
    "plot_pc1": "lmgeom.report.plots",
    "plot_spectral": "lmgeom.report.plots",
    "plot_logit_lens": "lmgeom.report.plots",
    "plot_dispersion": "lmgeom.report.plots",
    "plot_probes": "lmgeom.report.plots",
    "describe": "lmgeom.report.reading",
    "describe_pga": "lmgeom.report.reading",
    "describe_pc1": "lmgeom.report.reading",
    "describe_spectral": "lmgeom.report.reading",
    "describe_logit_lens": "lmgeom.report.reading",
    "describe_dispersion": "lmgeom.report.reading",
    "describe_probes": "lmgeom.report.reading",
    "pga_findings": "lmgeom.metrics.regime",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmgeom.report' has no attribute {name!r}")
