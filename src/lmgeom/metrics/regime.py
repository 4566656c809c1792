"""The regime rules over PGA z profiles — primary setting, collapse zones, restoration by a
higher CCR level, ``direct`` vs ``detour`` — and the one parser of the table's ``setting``
string. The sweep's regime rows (:mod:`lmgeom.experiments.regime`) and the report's reading
(:mod:`lmgeom.report.reading`) both take their verdicts from here, so they cannot disagree.

Rules, on a results table's ``pga_z`` rows:

1. Rows (:func:`pga_curves`): plain layer points (``layer_index >= 0``, no ``.point`` suffix),
   finite values, the first row per layer × setting, in layer-axis order.
2. Primary setting (:func:`primary_setting`): ``ccr=1`` when present (the method's default);
   otherwise the smallest ``ccr=m`` with ``m > 0``; otherwise ``ccr=0``; otherwise the first
   setting. *Higher* settings (:func:`higher_settings`): the ``ccr=m`` settings with a larger
   ``m`` and the same other keys.
3. The *final* layer is the one labelled ``final`` (else the last); the others are non-final.
4. Peak: the largest z over the non-final layers (the first of equal maxima; over all layers
   when there is no non-final one).
5. Collapse zone (:func:`collapse_profile`): among the non-final layers after the peak, a
   maximal run of consecutive layers with z < 0 that has at least :data:`MIN_RUN` (2) layers,
   or any such run holding a z < :data:`STRONG_NEGATIVE_Z` (−2). Negative runs that are no
   zone are *weak dips*.
6. Restoration (:func:`restoration`): a profile restores a set of layers when it has a finite
   z > 0 at every one of them. ``restored_ccr`` is the lowest higher CCR level that restores
   every collapse zone.
7. Regime (:func:`classify_regime`): ``detour`` when there is a collapse zone, else ``direct``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError

STRONG_NEGATIVE_Z = -2.0
"""A single non-final layer after the peak with z below this is a collapse zone on its own."""

MIN_RUN = 2
"""A run of at least this many consecutive non-final layers with z < 0 (after the peak) is a
collapse zone."""

DIRECT = "direct"
DETOUR = "detour"


# --------------------------------------------------------------------------- setting strings


def parse_setting(setting: str) -> dict[str, str]:
    """The ``key=value`` parts of a table's ``setting`` string, in order.

    Parts are joined by ``;`` (as every experiment writes them: ``vs=B;layer_b=3;ccr=1``);
    ``,`` also separates (``ccr=1,readout=raw``). A part without ``=`` continues the value
    before it, so values may hold commas (``forms=a,b``). The first of repeated keys wins;
    ``""`` gives ``{}``.
    """
    out: dict[str, str] = {}
    key, sep = None, ";"
    for part in re.split(r"([;,])", str(setting)):
        if part in (";", ","):
            sep = part
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            key = k.strip() if k.strip() not in out else None
            if key is not None:
                out[key] = v
        elif key is not None and part:
            out[key] += sep + part
    return out


def ccr_of(setting: str) -> int | None:
    """The CCR level ``m`` of a setting with ``ccr=m``; ``None`` when it has none."""
    v = parse_setting(setting).get("ccr", "")
    return int(v) if v.isdigit() else None


def natural_key(s: str) -> tuple[Any, ...]:
    """Sort key that orders ``ccr=5`` before ``ccr=10`` (digits compared as numbers)."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", s)
    )


def primary_setting(settings: Sequence[str]) -> str:
    """The primary setting among ``settings`` (rule 2 of the module docstring)."""
    if not settings:
        raise DataError("no settings to choose a primary one from")
    if "ccr=1" in settings:
        return "ccr=1"
    ccrs = [(m, s) for s in settings if (m := ccr_of(s)) is not None]
    positive = [(m, natural_key(s), s) for m, s in ccrs if m > 0]
    if positive:
        return min(positive)[2]
    if ccrs:
        return min(ccrs, key=lambda t: (t[0], natural_key(t[1])))[1]
    return settings[0]


def higher_settings(settings: Iterable[str], primary: str) -> list[str]:
    """The settings with a higher CCR level than ``primary`` and the same other keys, in
    :func:`natural_key` order (``[]`` when ``primary`` has no CCR level)."""
    pm = ccr_of(primary)
    if pm is None:
        return []
    rest = {k: v for k, v in parse_setting(primary).items() if k != "ccr"}
    return sorted((s for s in settings if (m := ccr_of(s)) is not None and m > pm
                   and {k: v for k, v in parse_setting(s).items() if k != "ccr"} == rest),
                  key=natural_key)


# --------------------------------------------------------------------------- the zone rule


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


@dataclass(frozen=True)
class Restoration:
    """How a profile fares over some layers (a collapse zone), rule 6.

    Attributes:
        size: layers asked about.
        have: of those, layers with a finite z.
        restored: of those, layers with z > 0.
        min_z: the lowest z among them (NaN when none has data).
        still_low: the layers with data and z <= 0, in order.
    """

    size: int
    have: int
    restored: int
    min_z: float
    still_low: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """z > 0 at every layer asked about (and every one has data)."""
        return self.restored == self.have == self.size


def restoration(layers: Sequence[str], z_by_layer: Mapping[str, float]) -> Restoration:
    """Rule 6 for ``layers`` under the profile ``z_by_layer`` (non-finite values: no data)."""
    have = [(lab, float(z_by_layer[lab])) for lab in layers
            if lab in z_by_layer and math.isfinite(float(z_by_layer[lab]))]
    low = tuple(lab for lab, v in have if not v > 0)
    return Restoration(size=len(layers), have=len(have), restored=len(have) - len(low),
                       min_z=min((v for _, v in have), default=math.nan), still_low=low)


# --------------------------------------------------------------------------- table rows


@dataclass(frozen=True)
class Curve:
    """One setting's z per layer (rule 1): finite values, layer-axis order."""

    layers: tuple[str, ...]
    layer_index: tuple[int, ...]
    z: tuple[float, ...]

    @property
    def final_index(self) -> int:
        """layer_index of the final point: the one labelled ``final``, else the last."""
        return (self.layer_index[self.layers.index("final")] if "final" in self.layers
                else max(self.layer_index))

    def as_dict(self) -> dict[str, float]:
        """layer → z (the first of repeated labels)."""
        out: dict[str, float] = {}
        for lab, v in zip(self.layers, self.z):
            out.setdefault(lab, v)
        return out

    def nonfinal(self) -> list[tuple[str, float]]:
        fi = self.final_index
        return [(lab, v) for lab, i, v in zip(self.layers, self.layer_index, self.z) if i != fi]


def pga_curves(df: pd.DataFrame, metric: str = "pga_z") -> dict[tuple[str, str], dict[str, Curve]]:
    """Rule 1: ``{(model, revision): {setting: Curve}}`` from a tidy results table
    (:mod:`lmgeom.results.table` columns); runs in order of appearance, settings in
    :func:`natural_key` order. Runs without a finite row are left out."""
    sel = ((df["metric"] == metric) & (df["layer_index"] >= 0)
           & ~df["layer"].astype(str).str.contains(".", regex=False)
           & np.isfinite(df["value"].astype(float)))
    rows = df.loc[sel]
    out: dict[tuple[str, str], dict[str, Curve]] = {}
    pairs = rows[["model", "revision"]].astype(str).drop_duplicates()
    for model, revision in pairs.itertuples(index=False):
        run = rows.loc[(rows["model"] == model) & (rows["revision"] == revision)]
        curves = {}
        for s in sorted(set(run["setting"].astype(str)), key=natural_key):
            c = (run.loc[run["setting"] == s].drop_duplicates("layer_index", keep="first")
                 .sort_values("layer_index"))
            curves[s] = Curve(tuple(str(x) for x in c["layer"]),
                              tuple(int(x) for x in c["layer_index"]),
                              tuple(float(x) for x in c["value"]))
        out[(str(model), str(revision))] = curves
    return out


# --------------------------------------------------------------------------- regime


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
        return {str(k): float(v) for k, v in z.items()}
    if isinstance(z, (Sequence, np.ndarray)) and not isinstance(z, str):
        return {str(i): float(v) for i, v in enumerate(z)}
    raise ConfigError(f"{what} must be a mapping layer -> z or a sequence of z values")


def classify_regime(
    z_by_layer: Mapping[str, float] | Sequence[float],
    *,
    ccr: int = 1,
    other_ccr: Mapping[int, Mapping[str, float] | Sequence[float]] | None = None,
) -> Regime:
    """Label a PGA z-profile ``direct`` or ``detour`` (rules 3–7 of the module docstring).

    ``min_z`` is the lowest z in the collapse zones (detour), or for a direct profile the
    lowest z over the non-final layers after the peak (NaN when the peak is the last
    non-final layer) — how close it came to a collapse.

    Args:
        z_by_layer: z per layer under the primary CCR level: a mapping ``{"0": z0, ..., "L": zL,
            "final": zf}`` (labels ``0..L`` and ``final``, any order) or a sequence of z in
            layer order whose last entry is the final layer. Non-finite values are ignored.
        ccr: the primary CCR level the profile was measured with (default 1, the method's).
        other_ccr: z-profiles at other CCR levels ``{5: {...}, 10: {...}}``, same layer labels;
            levels above ``ccr`` are used to find the level that restores the collapse.

    Raises:
        DataError: fewer than 2 finite points.
        ConfigError: a malformed profile or a negative CCR level.
    """
    if int(ccr) < 0:
        raise ConfigError(f"ccr must be >= 0, got {ccr}")
    primary = _as_profile(z_by_layer, "z_by_layer")
    higher = {int(m): _as_profile(p, f"other_ccr[{m}]")
              for m, p in (other_ccr or {}).items() if int(m) > int(ccr)}
    finite = {k: v for k, v in primary.items() if math.isfinite(v)}
    if len(finite) < 2:
        raise DataError(f"a z-profile needs at least 2 finite layers, got {len(finite)}")
    order = _order(list(primary))
    f = collapse_profile(order, [primary[lab] for lab in order])
    zones = tuple(tuple(z.layers) for z in f.zones)
    layers = [lab for z in zones for lab in z]
    resto = {m: restoration(layers, higher[m]) for m in sorted(higher)}
    if zones:
        worst = min(f.zones, key=lambda z: z.min_z)
        min_z, min_layer = worst.min_z, worst.min_layer
        restored_ccr = next((m for m, r in resto.items() if r.complete), None)
    else:
        after = [lab for lab in f.after if math.isfinite(primary[lab])]
        min_layer = min(after, key=lambda lab: primary[lab]) if after else ""
        min_z = primary[min_layer] if after else math.nan
        restored_ccr = None
    return Regime(
        label=DETOUR if zones else DIRECT, ccr=int(ccr), zones=zones, min_z=float(min_z),
        min_layer=str(min_layer), peak_layer=f.peak_layer, peak_z=float(f.peak_z),
        final_z=float(f.final_z), restored_ccr=restored_ccr,
        restoration={m: (r.restored, r.have) for m, r in resto.items()},
    )


def regimes_from_table(df: pd.DataFrame, *, ccr: int = 1) -> dict[tuple[str, str], Regime]:
    """:func:`classify_regime` of the ``ccr=<ccr>`` curve (rule 1) of every model × revision,
    the other ``ccr=m`` curves as ``other_ccr`` (of settings with one CCR level, the last in
    :func:`natural_key` order).

    Returns:
        ``{(model, revision): Regime}`` in order of appearance; runs without the primary CCR
        level (or with fewer than 2 finite layers) are left out.
    """
    out: dict[tuple[str, str], Regime] = {}
    for run, curves in pga_curves(df).items():
        profiles = {m: c.as_dict() for s, c in curves.items() if (m := ccr_of(s)) is not None}
        if ccr not in profiles:
            continue
        try:
            out[run] = classify_regime(profiles[ccr], ccr=ccr, other_ccr=profiles)
        except DataError:
            continue
    return out


# --------------------------------------------------------------------------- report facts


@dataclass(frozen=True)
class CollapseZone:
    """A collapse zone under the primary setting and how each higher setting fares there."""

    layers: tuple[str, ...]
    min_z: float
    min_layer: str
    restoration: Mapping[str, Restoration] = field(default_factory=dict)


@dataclass(frozen=True)
class PgaFinding:
    """The facts the report states about one model × revision (:func:`pga_findings`).

    Attributes:
        primary: the primary setting; ``primary_peak_layer`` / ``primary_peak_z`` its peak.
        peak_layer, peak_z, peak_setting: the largest z over all settings and layers.
        zones: the collapse zones under the primary setting, with their restoration.
        weak_negative: the weak dips (negative layers after the peak that form no zone).
        final_layer, final_z: the primary final layer (``None`` without a non-final one).
        higher: the higher settings; ``higher_min`` their lowest non-final z and where.
        all_positive: every primary z is > 0.
    """

    model: str
    revision: str
    primary: str
    peak_layer: str
    peak_z: float
    peak_setting: str
    primary_peak_layer: str
    primary_peak_z: float
    zones: tuple[CollapseZone, ...]
    weak_negative: tuple[str, ...]
    final_layer: str | None
    final_z: float | None
    higher: tuple[str, ...]
    higher_min: dict[str, tuple[float, str]]
    all_positive: bool

    @property
    def zone_layers(self) -> set[str]:
        return {lab for z in self.zones for lab in z.layers}


def _finding(model: str, revision: str, curves: Mapping[str, Curve]) -> PgaFinding:
    primary = primary_setting(list(curves))
    cur = curves[primary]
    best = max(((max(c.z), s) for s, c in curves.items()), key=lambda t: t[0])
    pc = curves[best[1]]
    k = int(np.argmax(pc.z))
    nonfinal = cur.nonfinal()
    final = [(lab, v) for lab, i, v in zip(cur.layers, cur.layer_index, cur.z)
             if i == cur.final_index]
    prof = (collapse_profile([lab for lab, _ in nonfinal + final], [v for _, v in nonfinal + final])
            if nonfinal else collapse_profile(cur.layers, cur.z))
    higher = higher_settings(curves, primary)
    zones = tuple(CollapseZone(z.layers, z.min_z, z.min_layer,
                               {s: restoration(z.layers, curves[s].as_dict()) for s in higher})
                  for z in prof.zones)
    higher_min = {}
    for s in higher:
        hn = curves[s].nonfinal()
        if hn:
            lab, v = hn[int(np.argmin([v for _, v in hn]))]
            higher_min[s] = (v, lab)
    has_final = bool(final) and bool(nonfinal)
    return PgaFinding(
        model=model, revision=revision, primary=primary,
        peak_layer=pc.layers[k], peak_z=pc.z[k], peak_setting=best[1],
        primary_peak_layer=prof.peak_layer, primary_peak_z=prof.peak_z,
        zones=zones, weak_negative=prof.weak,
        final_layer=final[0][0] if has_final else None,
        final_z=final[0][1] if has_final else None,
        higher=tuple(higher), higher_min=higher_min,
        all_positive=all(v > 0 for v in cur.z),
    )


def pga_findings(df: pd.DataFrame) -> list[PgaFinding]:
    """The module docstring's rules applied to every model × revision with ``pga_z`` rows of a
    tidy results table; also the peak over all settings, the final layer, and each higher
    setting's lowest non-final z.

    Returns:
        One :class:`PgaFinding` per model × revision, in order of appearance.
    """
    return [_finding(m, r, curves) for (m, r), curves in pga_curves(df).items()]


__all__ = [
    "DETOUR", "DIRECT", "MIN_RUN", "STRONG_NEGATIVE_Z", "CollapseProfile", "CollapseZone",
    "Curve", "PgaFinding", "Regime", "Restoration", "Zone", "ccr_of", "classify_regime",
    "collapse_profile", "higher_settings", "natural_key", "parse_setting", "pga_curves",
    "pga_findings", "primary_setting", "regimes_from_table", "restoration",
]
