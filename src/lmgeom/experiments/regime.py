"""The sweep's model-level regime rows. The rules that decide the regime (collapse zones,
restoration, ``direct`` vs ``detour``) are :mod:`lmgeom.metrics.regime`, which the report's
reading uses too."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..metrics.regime import Regime
from ..results import table


def regime_rows(regimes: Mapping[tuple[str, str], Regime]) -> list[dict[str, Any]]:
    """Model-level table rows (``layer = ""``) of each regime: ``regime_detour`` (0/1),
    ``collapse_min_z`` and ``collapse_restored_ccr`` (NaN when none restores / no zone), and
    ``collapse_zone_layers`` (number of layers in the zones), all with ``setting = ccr=<m>``."""
    out = []
    for (model, revision), r in regimes.items():
        common = {"model": model, "revision": revision, "setting": f"ccr={r.ccr}"}
        out += [
            table.row(metric="regime_detour", value=1.0 if r.detour else 0.0, **common),
            table.row(metric="collapse_min_z", value=r.min_z, **common),
            table.row(metric="collapse_restored_ccr",
                      value=float(r.restored_ccr) if r.restored_ccr is not None else math.nan,
                      **common),
            table.row(metric="collapse_zone_layers", value=float(len(r.zone_layers)), **common),
        ]
    return out


__all__ = ["regime_rows"]
