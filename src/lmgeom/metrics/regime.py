"""The collapse-zone rule over a PGA z profile (the science behind "direct" vs "detour"),
shared by the regime labels of sweeps (:mod:`lmgeom.experiments.regime`) and the report's
reading (:mod:`lmgeom.report.reading`), so the two can never disagree.

Rule, on the z of one setting per layer, in layer order (non-finite values dropped):

1. The *final* layer is the one labelled ``final`` (else the last); the others are non-final.
2. Peak: the largest z over the non-final layers (the first of equal maxima; over all layers
   when there is no non-final one).
3. Collapse zone: among the non-final layers after the peak, a maximal run of consecutive
   layers with z < 0 that has at least :data:`MIN_RUN` (2) layers, or any such run holding a
   z < :data:`STRONG_NEGATIVE_Z` (−2). Negative runs that are no zone are *weak dips*.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import DataError

STRONG_NEGATIVE_Z = -2.0
"""A single non-final layer after the peak with z below this is a collapse zone on its own."""

MIN_RUN = 2
"""A run of at least this many consecutive non-final layers with z < 0 (after the peak) is a
collapse zone."""


@dataclass(frozen=True)
class Zone:
    """One collapse zone: its layers, and its lowest z and where."""

    layers: tuple[str, ...]
    min_z: float
    min_layer: str


@dataclass(frozen=True)
class CollapseProfile:
    """What the rule finds in one z profile (module docstring).

    Attributes:
        peak_layer, peak_z: the peak over the non-final layers.
        after: the non-final layers after the peak, in order.
        zones: the collapse zones, in order.
        weak: layers of negative runs after the peak that form no zone.
        final_layer, final_z: the final layer (``None`` / NaN when the profile has only it).
    """

    peak_layer: str
    peak_z: float
    after: tuple[str, ...]
    zones: tuple[Zone, ...]
    weak: tuple[str, ...]
    final_layer: str | None
    final_z: float

    @property
    def detour(self) -> bool:
        return bool(self.zones)


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, f in enumerate([*flags, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    return out


def collapse_profile(layers: Sequence[str], z: Sequence[float]) -> CollapseProfile:
    """Apply the collapse-zone rule to ``z`` (one value per entry of ``layers``, both in
    layer order; non-finite values are left out).

    Raises:
        DataError: no finite value, or ``layers`` and ``z`` of different lengths.
    """
    if len(layers) != len(z):
        raise DataError(f"{len(layers)} layer labels but {len(z)} z values")
    keep = [(str(lab), float(v)) for lab, v in zip(layers, z) if math.isfinite(float(v))]
    if not keep:
        raise DataError("a z profile needs at least one finite value")
    labels = [lab for lab, _ in keep]
    vals = np.array([v for _, v in keep], dtype=np.float64)
    fin = labels.index("final") if "final" in labels else len(labels) - 1
    nonfinal = [i for i in range(len(labels)) if i != fin]
    base = nonfinal or list(range(len(labels)))
    p = base[int(np.argmax(vals[base]))]
    after = [i for i in nonfinal if i > p]
    zones: list[Zone] = []
    weak: list[str] = []
    za = vals[after]
    for a, b in _runs(list(za < 0)):
        seg = za[a:b]
        names = [labels[after[i]] for i in range(a, b)]
        if b - a >= MIN_RUN or float(seg.min()) < STRONG_NEGATIVE_Z:
            k = int(np.argmin(seg))
            zones.append(Zone(tuple(names), float(seg[k]), names[k]))
        else:
            weak.extend(names)
    has_final = len(nonfinal) > 0
    return CollapseProfile(
        peak_layer=labels[p], peak_z=float(vals[p]),
        after=tuple(labels[i] for i in after), zones=tuple(zones), weak=tuple(weak),
        final_layer=labels[fin] if has_final else None,
        final_z=float(vals[fin]) if has_final else math.nan)


__all__ = ["MIN_RUN", "STRONG_NEGATIVE_Z", "CollapseProfile", "Zone", "collapse_profile"]
