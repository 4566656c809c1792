"""Verdicts on the claims of the two papers (``lmgeom claims``): the shared vocabulary.

A claim is tested by a *rule*: a pure function from measured numbers (arrays, tidy tables)
to a :class:`ClaimVerdict`. Rules live in :mod:`lmgeom.metrics` (this module for the shared
types, :mod:`lmgeom.metrics.claims_pga` for P1-P8 and :mod:`lmgeom.metrics.claims_dispersion`
for D1-D8); :mod:`lmgeom.experiments.claims` only gathers the measurements and calls them, and
the report only phrases the verdicts.

Verdicts:

* ``supported`` — the measured quantity's confidence interval lies on the claim's side of the
  threshold the claim implies;
* ``contradicted`` — the interval lies on the other side;
* ``inconclusive`` — the interval straddles the threshold (or the evidence is split);
* ``underpowered`` — a z-based decision (PGA claims) that this number of texts cannot make:
  the measured z lies inside its null band, or the band is wider than an effect of the size
  the papers report would be at this n (:func:`z_call`, :class:`Power`); ``reason`` gives the
  n it would need;
* ``unstable`` — with an n-ladder (``claims --n-ladder 64,128,256``): the verdicts at the two
  largest n differ (:func:`mark_unstable`); ``reason`` gives both;
* ``not testable here`` — the models or data needed are absent; ``reason`` says what is
  missing (e.g. "needs d >= 2048; the widest model here has d = 1536").

The power rule (one rule, one place: :func:`z_call`). PGA z is measured against a null of
random frames; its 95 % band is about ±2 in z units at every n, while |z| of a real effect
barely grows with n (``|z| ∝ n^a``, a ≈ 0.2 measured), while its text-sampling error (which
the band does not contain) shrinks as ``1/sqrt(n)``. So a decision needs (1) z clear of the
band and of the 95 % sampling error combined (else: underpowered, with the n at which it would
be) and (2) an n at which an effect of the papers' size, :data:`REFERENCE_Z` at
:data:`REFERENCE_N` texts, would be decided (else the noise hides exactly what the claim is
about, whatever z came out). The decision (2) always uses ``a`` = :data:`DEFAULT_Z_GROWTH`,
so a verdict at n depends only on the texts at n and this rule: ``claims --n 64`` and the
n = 64 rung of ``--n-ladder 64,128,256`` decide alike. A :class:`Power` measured for the model
(an n-ladder: the rules take ``powers``) only says at which n the decision would be made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import ConfigError

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
UNDERPOWERED = "underpowered"
UNSTABLE = "unstable"
VERDICTS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, UNDERPOWERED, UNSTABLE, NOT_TESTABLE)

#: the papers' effect at their setting, the yardstick of "can this n see it": a collapse
#: zone (or a mid-layer peak) of |z| = 10 at n = 256 texts (k = 100, CCR-1, last pooling).
#: An independent reference implementation measured |z| above 10 in Gemma-3-270M's zone at
#: that setting (issue 34); the PGA paper reports peaks of 9-24 and zones down to -32 on
#: Pythia, so 10 is the small end of what the claims are about.
REFERENCE_N = 256
REFERENCE_Z = 10.0
#: growth exponent ``a`` of a fixed effect's ``|z| ∝ n^a`` when no n-ladder measured it:
#: measured on SmolLM2-135M (``benchmarks/bench_z_growth.py``, k = 20, CCR-1, nested subsets
#: of 256 ``builtin:domains`` texts): median slope of log|z| on log n over the layers with
#: |z| > 3, 0.19 (quartiles 0.09-0.22). z hardly grows with n: more texts mostly shrink its
#: sampling error (:data:`Z_SAMPLING_C`).
DEFAULT_Z_GROWTH = 0.2
#: text-sampling variance of z is about ``Z_SAMPLING_C / n``: from the same run, the variance
#: over layers of z(n) - z(256) for nested subsets n = 32, 64, 128 gave C = 52, 73, 70
#: (sd of z 1.05 at n = 64, 0.52 at n = 256)
Z_SAMPLING_C = 70.0


@dataclass(frozen=True)
class ModelInfo:
    """What a verdict needs to know about a model: its name, residual width ``d``, family
    (``llama``, ``gemma3_text``, ``qwen2`` ...) and whether it is instruction-tuned."""

    name: str
    d: int
    family: str
    tuned: str = "unknown"  # "base" | "instruct" | "unknown"
    n_layers: int = 0

    def label(self) -> str:
        return f"{self.name} (d={self.d}, {self.family}, {self.tuned})"


@dataclass(frozen=True)
class ClaimVerdict:
    """One row of ``claims.parquet``.

    Attributes:
        claim: the id (``P1`` ... ``P8``, ``D1`` ... ``D8``; a suffix such as ``D1.segment``
            for a variant of a claim).
        statement: the claim in one line.
        verdict: one of :data:`VERDICTS`.
        reason: one line: why this verdict (what was compared with what, or what is missing).
        quantity: the name of the measured quantity (e.g. ``"min z over intermediate layers"``).
        estimate: its value (``nan`` when not testable).
        ci_low, ci_high: its confidence interval (``nan`` when none).
        threshold: the value the claim implies the quantity is above / below.
        direction: ``">"`` when the claim says quantity > threshold, ``"<"`` when below.
        models: the models the verdict rests on.
        seed: the seed of any sampling behind the estimate (``None`` when none).
        details: free-form extra numbers (per-model values ...), kept in the manifest.
        n: the number of texts the decision rests on (PGA claims; ``nan`` otherwise).
        band_half_width: half the width of the null band (z units) at the decisive layer.
        min_effect_z: the smallest effect this n can resolve, as the |z| it would have at
            :data:`REFERENCE_N` texts (so runs at different n compare): ``band_half_width ×
            (REFERENCE_N / n)^a``.
        n_needed: for an ``underpowered`` verdict, the n at which the decision could be made
            (``nan`` otherwise, ``inf`` when the measured z shows no trend to extrapolate).
    """

    claim: str
    statement: str
    verdict: str
    reason: str
    quantity: str = ""
    estimate: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    threshold: float = math.nan
    direction: str = ">"
    models: tuple[ModelInfo, ...] = ()
    seed: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    n: float = math.nan
    band_half_width: float = math.nan
    min_effect_z: float = math.nan
    n_needed: float = math.nan

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ConfigError(f"claim {self.claim}: verdict {self.verdict!r} is not one of "
                              f"{', '.join(VERDICTS)}")
        if self.direction not in (">", "<"):
            raise ConfigError(f"claim {self.claim}: direction must be '>' or '<'")

    def row(self) -> dict[str, Any]:
        """The flat row ``claims.parquet`` stores (models as ``;``-joined labels)."""
        out = asdict(self)
        out.pop("details")
        out["models"] = "; ".join(m.label() for m in self.models)
        out["widths"] = ",".join(str(m.d) for m in self.models)
        out["families"] = ",".join(sorted({m.family for m in self.models}))
        return out


def verdict_from_interval(low: float, high: float, threshold: float, direction: str = ">"
                          ) -> str:
    """The verdict of an interval ``[low, high]`` against a claim ``quantity <direction>
    threshold``: supported when the whole interval is on the claim's side, contradicted when
    it is wholly on the other side (or touches the threshold from there), inconclusive when it
    straddles. A non-finite bound gives inconclusive."""
    if direction not in (">", "<"):
        raise ConfigError("direction must be '>' or '<'")
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if low > high:
        low, high = high, low
    if direction == ">":
        if low > threshold:
            return SUPPORTED
        if high <= threshold:
            return CONTRADICTED
        return INCONCLUSIVE
    if high < threshold:
        return SUPPORTED
    if low >= threshold:
        return CONTRADICTED
    return INCONCLUSIVE


@dataclass(frozen=True)
class Power:
    """What ``n`` texts can resolve in PGA z.

    Two things limit a z decision. The null band (random frames, about ±2 in z units at any
    n) is one; the other is the text sample itself: another draw of n texts gives another z,
    with a variance of about ``sampling_c / n`` (:data:`Z_SAMPLING_C`, measured), which the
    null band does not contain. A decision needs z clear of both, combined in quadrature
    (:meth:`decision_half_width`). And ``|z|`` of a fixed effect grows only slowly with n,
    as ``n^growth`` (:data:`DEFAULT_Z_GROWTH`); ``source`` says whether that was measured for
    this model (an n-ladder) or assumed."""

    n: int
    growth: float = DEFAULT_Z_GROWTH
    source: str = "assumed"
    sampling_c: float = Z_SAMPLING_C

    def __post_init__(self) -> None:
        if not self.growth > 0:
            object.__setattr__(self, "growth", DEFAULT_Z_GROWTH)
            object.__setattr__(self, "source", "assumed")

    def sampling_sd(self, n: float | None = None) -> float:
        """The text-sampling standard deviation of z at ``n`` texts (default: this n)."""
        return math.sqrt(self.sampling_c / (n or self.n))

    def decision_half_width(self, band_half_width: float, n: float | None = None) -> float:
        """How far from the band's centre z must be to decide at ``n`` texts: the null band
        and the 95 % text-sampling error combined, ``sqrt(h^2 + (1.96 sd)^2)``."""
        return math.hypot(band_half_width, 1.96 * self.sampling_sd(n))

    def scale(self, z: float, to_n: float) -> float:
        """``|z|`` measured at this n, grown (or shrunk) to ``to_n`` texts."""
        return abs(z) * (to_n / self.n) ** self.growth

    def n_to_clear(self, z: float, half_width: float, cap: float = 1e7) -> float:
        """The smallest n at which ``z`` (measured here, from the band's centre), grown as
        ``n^growth``, would be decided against a band of ``half_width`` and the sampling error
        at that n (``inf`` when not below ``cap``)."""
        dev = abs(z)
        if not dev > 0:
            return math.inf

        def clear(n: float) -> bool:
            return self.scale(dev, n) > self.decision_half_width(half_width, n)

        if not clear(cap):
            return math.inf
        lo, hi = 1.0, float(self.n)
        while not clear(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # clear() is monotone in n: bisect to the first integer n
            mid = math.floor((lo + hi) / 2)
            lo, hi = (lo, mid) if clear(mid) else (mid, hi)
        return float(math.ceil(hi))

    def reference_visible(self, half_width: float) -> bool:
        """Whether an effect of the papers' size would be decided at this n, with the assumed
        growth :data:`DEFAULT_Z_GROWTH` whatever this power measured: the verdict at n must
        not depend on whether other n were measured in the same run (a ladder's measured
        growth only says at which n a decision would be made)."""
        return (REFERENCE_Z * (self.n / REFERENCE_N) ** DEFAULT_Z_GROWTH
                > self.decision_half_width(half_width))

    def describe(self) -> str:
        return (f"|z| ∝ n^{self.growth:g}, {self.source}; text-sampling sd of z "
                f"{self.sampling_sd():.2f} at n={self.n}")


def z_call(z: float, lo: float, hi: float, direction: str, power: Power | None
           ) -> tuple[str, str, dict[str, float]]:
    """The verdict of "z is ``direction`` 0" for a z with its null band ``[lo, hi]`` (the
    null's 2.5 / 97.5 % points in z units), with the power rule (module docstring).

    Returns ``(verdict, note, numbers)``: ``note`` is empty for a decided verdict, else it says
    why the n is not enough and what n would be; ``numbers`` holds ``band_half_width``,
    ``decision_half_width``, ``min_effect_z`` and ``n_needed`` (see :class:`ClaimVerdict`)."""
    base = verdict_from_interval(z - hi, z - lo, 0.0, direction)
    half = (hi - lo) / 2 if math.isfinite(hi - lo) else math.nan
    if power is None or not math.isfinite(half) or not math.isfinite(z):
        return base, "", {"band_half_width": half}
    centre = (hi + lo) / 2
    total = power.decision_half_width(half)
    nums = {"band_half_width": half, "decision_half_width": total,
            "min_effect_z": power.scale(total, REFERENCE_N), "n_needed": math.nan}
    if not power.reference_visible(half):
        need = Power(REFERENCE_N, power.growth, power.source,
                     power.sampling_c).n_to_clear(REFERENCE_Z, half)
        nums["n_needed"] = need
        here = REFERENCE_Z * (power.n / REFERENCE_N) ** DEFAULT_Z_GROWTH
        note = (f"n={power.n} cannot resolve an effect of the papers' size: |z| ≈ "
                f"{REFERENCE_Z:g} at n={REFERENCE_N} is ≈ {here:.2f} here, inside ±{total:.2f} "
                f"(null band ±{half:.2f} with the text-sampling error); needs n ≥ "
                f"{need:.0f} ({power.describe()})")
        return UNDERPOWERED, note, nums
    dev = abs(z - centre)
    if base == INCONCLUSIVE or dev <= total:
        need = power.n_to_clear(z - centre, half)
        nums["n_needed"] = need
        where = (f"needs n ≈ {need:.0f}" if math.isfinite(need)
                 else "no trend to extrapolate a needed n from")
        inside = (f"inside the null band ±{half:.2f}" if dev <= half else
                  f"outside the null band ±{half:.2f} but inside the text-sampling error "
                  f"(±{total:.2f} together)")
        note = f"z {z:.2f} {inside} at n={power.n}; {where} ({power.describe()})"
        return UNDERPOWERED, note, nums
    return base, "", nums


def mark_unstable(top: Sequence[ClaimVerdict], lower: Sequence[ClaimVerdict], *, n_top: int,
                  n_lower: int) -> list[ClaimVerdict]:
    """The verdicts at the largest n of a ladder, each one whose verdict at the next smaller
    n (``lower``) differs turned ``unstable``, its reason giving both verdicts. Not a change:
    ``underpowered`` at the smaller n becoming decided at the larger (the power rule deferred
    exactly that decision to more texts), and a claim absent from ``lower``."""
    below = {v.claim: v for v in lower}
    out = []
    for v in top:
        w = below.get(v.claim)
        if w is None or w.verdict == v.verdict or w.verdict == UNDERPOWERED \
                or NOT_TESTABLE in (v.verdict, w.verdict):
            out.append(v)
            continue
        out.append(replace(v, verdict=UNSTABLE, reason=(
            f"{v.verdict} at n = {n_top} but {w.verdict} at n = {n_lower}; at n = {n_top}: "
            f"{v.reason}; at n = {n_lower}: {w.reason}"),
            details={**v.details, "verdict_at_n": {n_top: v.verdict, n_lower: w.verdict},
                     "reason_at_top": v.reason}))
    return out


def not_testable(claim: str, statement: str, reason: str, *,
                 models: tuple[ModelInfo, ...] = (), quantity: str = "") -> ClaimVerdict:
    """A ``not testable here`` verdict with its reason."""
    return ClaimVerdict(claim=claim, statement=statement, verdict=NOT_TESTABLE, reason=reason,
                        quantity=quantity, models=models)


__all__ = [
    "CONTRADICTED", "DEFAULT_Z_GROWTH", "Z_SAMPLING_C", "INCONCLUSIVE", "NOT_TESTABLE", "REFERENCE_N",
    "REFERENCE_Z", "SUPPORTED", "UNDERPOWERED", "UNSTABLE", "VERDICTS", "ClaimVerdict", "ModelInfo",
    "Power", "mark_unstable", "not_testable", "verdict_from_interval", "z_call",
]
