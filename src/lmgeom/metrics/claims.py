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
* ``not testable here`` — the models or data needed are absent; ``reason`` says what is
  missing (e.g. "needs d >= 2048; the widest model here has d = 1536").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
VERDICTS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE)


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


def not_testable(claim: str, statement: str, reason: str, *,
                 models: tuple[ModelInfo, ...] = (), quantity: str = "") -> ClaimVerdict:
    """A ``not testable here`` verdict with its reason."""
    return ClaimVerdict(claim=claim, statement=statement, verdict=NOT_TESTABLE, reason=reason,
                        quantity=quantity, models=models)


__all__ = [
    "CONTRADICTED", "INCONCLUSIVE", "NOT_TESTABLE", "SUPPORTED", "VERDICTS", "ClaimVerdict",
    "ModelInfo", "not_testable", "verdict_from_interval",
]
