"""Regime classification of a PGA z-profile: ``direct`` or ``detour`` (the paper's two regimes).

The collapse-zone rule is :func:`lmgeom.metrics.regime.collapse_profile`, which the report's
reading (:func:`lmgeom.report.reading.pga_findings`) uses too, so the label and the report can
never disagree:

1. The profile is the PGA z per layer under the primary setting (CCR-1 by default), on the
   layer axis ``0..L, final``; the last point is the *final* layer (the readout's input), the
   others are *non-final*.
2. Peak: the largest z over the non-final layers.
3. Collapse zone: among the non-final layers after the peak, a maximal run of consecutive
   layers with z < 0 that has at least 2 layers, or any single layer with z < -2.
4. ``detour`` when the profile has at least one collapse zone, else ``direct``.
5. ``min_z``: the lowest z in the collapse zone(s) (detour); for a direct profile the lowest z
   over the non-final layers after the peak (NaN when the peak is the last non-final layer) —
   how close it came to a collapse.
6. ``restored_ccr``: the lowest CCR level m above the primary one, among those given, whose
   z is > 0 at every layer of every collapse zone — the CCR level at which the collapse
   disappears. ``None`` when no given level restores it (or there is no zone).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from ..metrics.regime import collapse_profile

DIRECT = "direct"
DETOUR = "detour"


@dataclass(frozen=True)
class Regime:
    """The regime of one z-profile.

    Attributes:
        label: ``"direct"`` or ``"detour"``.
        ccr: the primary CCR level the profile was measured with.
        zones: the collapse zones, each a tuple of layer labels (empty for ``direct``).
        min_z: lowest z in the zones (detour) or after the peak (direct); NaN when undefined.
        min_layer: the layer of ``min_z`` (``""`` when undefined).
        peak_layer, peak_z: the highest non-final z.
        final_z: z at the final layer (NaN when the profile has a single point).
        restored_ccr: lowest higher CCR level with z > 0 throughout every zone, or ``None``.
        restoration: CCR level → (layers of the zones with z > 0, layers with data).
    """

    label: str
    ccr: int
    zones: tuple[tuple[str, ...], ...]
    min_z: float
    min_layer: str
    peak_layer: str
    peak_z: float
    final_z: float
    restored_ccr: int | None
    restoration: Mapping[int, tuple[int, int]]

    @property
    def detour(self) -> bool:
        return self.label == DETOUR

    @property
    def zone_layers(self) -> tuple[str, ...]:
        return tuple(lab for z in self.zones for lab in z)

    def describe(self) -> str:
        """One sentence: the label with the zone, the minimum and the restoring CCR level."""
        if not self.detour:
            tail = (f"; lowest z after the peak {self.min_z:.2f} at layer {self.min_layer}"
                    if math.isfinite(self.min_z) else "")
            return (f"direct (CCR-{self.ccr} z never collapses after its peak of "
                    f"{self.peak_z:.2f} at layer {self.peak_layer}{tail})")
        zones = "; ".join(_span(z) for z in self.zones)
        rest = (f"restored (z > 0 throughout) from CCR-{self.restored_ccr}"
                if self.restored_ccr is not None else "not restored by the CCR levels measured")
        return (f"detour (CCR-{self.ccr} collapse zone {zones}, lowest z {self.min_z:.2f} at "
                f"layer {self.min_layer}; {rest})")


def _span(labels: Sequence[str]) -> str:
    if len(labels) == 1:
        return f"layer {labels[0]}"
    return f"layers {labels[0]}–{labels[-1]}"


def _order(labels: Sequence[str]) -> list[str]:
    def key(lab: str) -> tuple[int, int]:
        if lab == "final":
            return (1, 0)
        if lab.lstrip("-").isdigit():
            return (0, int(lab))
        raise ConfigError(f"layer label {lab!r} is not 0..L or 'final'")

    return sorted(labels, key=key)


def _as_profile(z: Mapping[str, float] | Sequence[float], what: str) -> dict[str, float]:
    if isinstance(z, Mapping):
        prof = {str(k): float(v) for k, v in z.items()}
    elif isinstance(z, (Sequence, np.ndarray)) and not isinstance(z, str):
        vals = [float(v) for v in z]
        prof = {str(i): v for i, v in enumerate(vals)}
    else:
        raise ConfigError(f"{what} must be a mapping layer -> z or a sequence of z values")
    return prof


def classify_regime(
    z_by_layer: Mapping[str, float] | Sequence[float],
    *,
    ccr: int = 1,
    other_ccr: Mapping[int, Mapping[str, float] | Sequence[float]] | None = None,
) -> Regime:
    """Label a PGA z-profile ``direct`` or ``detour`` (rules in the module docstring).

    Args:
        z_by_layer: z per layer under the primary CCR level: a mapping ``{"0": z0, ..., "L": zL,
            "final": zf}`` (labels ``0..L`` and ``final``, any order) or a sequence of z in
            layer order whose last entry is the final layer. Non-finite values are ignored.
        ccr: the primary CCR level the profile was measured with (default 1, the method's).
        other_ccr: z-profiles at other CCR levels ``{5: {...}, 10: {...}}``, same layer labels;
            levels above ``ccr`` are used to find the level that restores the collapse.

    Returns:
        A :class:`Regime`.

    Raises:
        DataError: fewer than 2 finite points.
        ConfigError: a malformed profile or a negative CCR level.
    """
    if int(ccr) < 0:
        raise ConfigError(f"ccr must be >= 0, got {ccr}")
    profiles = {int(ccr): _as_profile(z_by_layer, "z_by_layer")}
    for m, prof in (other_ccr or {}).items():
        if int(m) > int(ccr):
            profiles[int(m)] = _as_profile(prof, f"other_ccr[{m}]")
    primary = profiles[int(ccr)]
    finite = {k: v for k, v in primary.items() if math.isfinite(v)}
    if len(finite) < 2:
        raise DataError(f"a z-profile needs at least 2 finite layers, got {len(finite)}")
    order = _order(list(primary))
    f = collapse_profile(order, [primary[lab] for lab in order])
    zones = tuple(tuple(z.layers) for z in f.zones)
    restoration: dict[int, tuple[int, int]] = {}
    for m in sorted(profiles):
        if m == int(ccr):
            continue
        vals = [profiles[m].get(lab, math.nan) for z in zones for lab in z]
        have = [v for v in vals if math.isfinite(v)]
        restoration[m] = (sum(v > 0 for v in have), len(have))
    if zones:
        worst = min(f.zones, key=lambda z: z.min_z)
        min_z, min_layer = worst.min_z, worst.min_layer
        total = sum(len(z) for z in zones)
        restored = [m for m, (ok, have) in sorted(restoration.items()) if ok == have == total]
        restored_ccr = restored[0] if restored else None
        label = DETOUR
    else:
        fin = [lab for lab in order if math.isfinite(primary[lab])]
        nonfinal = fin[:-1]
        after = nonfinal[nonfinal.index(f.peak_layer) + 1:] if f.peak_layer in nonfinal else []
        if after:
            min_layer = min(after, key=lambda lab: primary[lab])
            min_z = primary[min_layer]
        else:
            min_z, min_layer = math.nan, ""
        restored_ccr, label = None, DIRECT
    return Regime(
        label=label, ccr=int(ccr), zones=zones, min_z=float(min_z), min_layer=str(min_layer),
        peak_layer=f.peak_layer, peak_z=float(f.peak_z), final_z=float(f.final_z),
        restored_ccr=restored_ccr, restoration=restoration,
    )


def regimes_from_table(df, *, ccr: int = 1) -> dict[tuple[str, str], Regime]:
    """:func:`classify_regime` for every model × revision with ``pga_z`` rows at plain layers.

    Returns:
        ``{(model, revision): Regime}`` in order of appearance; runs without the primary CCR
        level (or with fewer than 2 finite layers) are left out.
    """
    rows = df.loc[(df["metric"] == "pga_z") & (df["layer_index"] >= 0)
                  & ~df["layer"].astype(str).str.contains(".", regex=False)]
    out: dict[tuple[str, str], Regime] = {}
    pairs = rows[["model", "revision"]].drop_duplicates().itertuples(index=False)
    for model, revision in pairs:
        run = rows.loc[(rows["model"] == model) & (rows["revision"] == revision)]
        profiles: dict[int, dict[str, float]] = {}
        for s, g in run.groupby("setting"):
            try:
                m = int(str(s).split("ccr=")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            g = g.drop_duplicates("layer", keep="first")
            profiles[m] = dict(zip(g["layer"].astype(str), g["value"].astype(float)))
        if ccr not in profiles:
            continue
        try:
            out[(str(model), str(revision))] = classify_regime(
                profiles[ccr], ccr=ccr, other_ccr={m: p for m, p in profiles.items() if m != ccr})
        except DataError:
            continue
    return out


def regime_rows(regimes: Mapping[tuple[str, str], Regime]) -> list[dict[str, Any]]:
    """Model-level table rows (``layer = ""``) of each regime: ``regime_detour`` (0/1),
    ``collapse_min_z`` and ``collapse_restored_ccr`` (NaN when none restores / no zone), and
    ``collapse_zone_layers`` (number of layers in the zones), all with ``setting = ccr=<m>``."""
    from ..results import table

    out = []
    for (model, revision), r in regimes.items():
        s = f"ccr={r.ccr}"
        common = {"model": model, "revision": revision, "setting": s}
        out += [
            table.row(metric="regime_detour", value=1.0 if r.detour else 0.0, **common),
            table.row(metric="collapse_min_z", value=r.min_z, **common),
            table.row(metric="collapse_restored_ccr",
                      value=float(r.restored_ccr) if r.restored_ccr is not None else math.nan,
                      **common),
            table.row(metric="collapse_zone_layers", value=float(len(r.zone_layers)), **common),
        ]
    return out


__all__ = ["DETOUR", "DIRECT", "Regime", "classify_regime", "regime_rows", "regimes_from_table"]
