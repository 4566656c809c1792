"""Documented minimum sample sizes: when a number is refused, and when it is computed but flagged.

lmgeom never prints a statistically empty number as if it were an ordinary one (DESIGN.md,
"Trust rules"). Below a *hard* minimum a metric refuses with a typed error
(:class:`~lmgeom.errors.ConfigError` for an option, :class:`~lmgeom.errors.DataError` for the
data) that names the value and the fix. Between the hard and the *soft* minimum it computes the
number, emits a :class:`~lmgeom.errors.LowSampleWarning` and records a flag code in its result
(``PGAResult.flags`` / ``PGAResult.warnings``); the experiments copy the codes into the results
table's ``flag`` column (``";"``-joined, ``""`` for an ordinary value).

Subspace PGA (``subspace_pga``, ``subspace_pga_levels``):

.. list-table::
   :header-rows: 1

   * - quantity
     - refused (hard minimum)
     - flagged below
     - flag code
   * - rows N
     - N < :data:`MIN_ROWS_HARD`
     - :data:`MIN_ROWS`
     - ``low_n``
   * - distinct states
     - 1 (no variance)
     - :data:`MIN_ROWS`
     - ``few_distinct``
   * - null draws
     - n_null < :data:`MIN_NULL_HARD`
     - :data:`MIN_NULL`
     - ``low_null``
   * - sampled pairs
     - pairs < :data:`MIN_PAIRS_HARD`
     - :data:`MIN_PAIRS`
     - ``low_pairs``
   * - readout dim k
     - k >= d
     - k >= rank r_m
     - ``k_rank``
   * - CCR-m
     - m >= rank of the centred X
     - (r_m <= k: k_rank)
     - ``k_rank``

``r_m`` is the numerical rank of the states after centring and CCR-m: the rank of the centred
X (at most N - 1, and at most the number of distinct rows - 1) minus m, counting singular
values above ``RANK_RTOL`` x the largest (:data:`lmgeom.metrics.geometry.RANK_RTOL`).

Linear probes: a class with fewer members than ``folds`` is refused by
:func:`~lmgeom.metrics.probe_accuracy`; ``analyze`` then skips the probes (with a warning that
says which ``--n`` would be enough) and keeps the rest of the run.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import scipy.linalg

from lmgeom.errors import LowSampleWarning

__all__ = [
    "FLAG_CODES",
    "MIN_CORR_POINTS",
    "MIN_EVAL_TOKENS",
    "MIN_NULL",
    "MIN_NULL_HARD",
    "MIN_PAIRS",
    "MIN_PAIRS_HARD",
    "MIN_PROBE_CLASS",
    "MIN_QUANTILE_TEXTS",
    "MIN_ROWS",
    "MIN_ROWS_HARD",
    "corr_flag",
    "describe_flag",
    "join_flags",
    "numerical_rank",
    "pga_flags",
    "split_flags",
    "warn_low_sample",
]

#: Fewest rows (texts) Subspace PGA accepts at all: with 3 rows there are 3 distances, and a
#: Spearman correlation of 3 values takes only 4 distinct values. (METHODS.md: "N < 4" is an
#: error.)
MIN_ROWS_HARD = 4

#: Fewest rows (texts) for an unflagged z: N rows give N(N-1)/2 distances, but they are
#: distances among only N points whose centred span has at most N - 1 dimensions; below 10
#: points (45 distances, rank <= 9) the correlations rest on a handful of degrees of freedom,
#: and the same z can move by whole units when one text is swapped. The paper uses N = 512.
#: Also the threshold for distinct states (``few_distinct``): identical rows (e.g. every text
#: ending in the same token, with last-token pooling) are one point.
MIN_ROWS = 10

#: Fewest null draws accepted: the null std is taken with ddof = 1.
MIN_NULL_HARD = 2

#: Fewest null draws for an unflagged z: z divides by the std of the null correlations, whose
#: relative standard error is about 1 / sqrt(2 (n_null - 1)): +-35 % with 5 draws, +-16 % with
#: 20, +-7 % with the default 100; and the empirical p-value cannot go below 1 / (1 + n_null)
#: (0.05 at 20 draws).
MIN_NULL = 20

#: Fewest *sampled* pairs accepted: a Spearman correlation of fewer than 10 distances takes so
#: few distinct values that z is noise. (Exact mode uses every pair; its floor is the row count.)
MIN_PAIRS_HARD = 10

#: Fewest sampled pairs for an unflagged z: the sampling error of a Spearman correlation over
#: M of the P pairs is about sqrt((1 - M/P) / M) (0.03 for 1000 of many), comparable to the
#: spread of the null correlations themselves above that; a sample whose error exceeds that of
#: 1000 pairs is flagged (so 990 of 1000 pairs are not). ``pairs="auto"`` samples 250 000.
MIN_PAIRS = 1000

#: Fewest points (chunks, perplexity groups, texts, checkpoints, layers) for an unflagged
#: correlation of dispersion with perplexity (or any rank correlation lmgeom reports over
#: units): the standard error of a Spearman correlation over n points is about
#: 1 / sqrt(n - 3) (Fieller et al. 1957), 0.38 at n = 10 and 0.58 at n = 6, so below 10 a
#: correlation of +0.9 cannot be told from +0.3; and a bootstrap interval over 5 points is
#: drawn from so few distinct resamples that it collapses ([+1.00, +1.00] from 5 groups).
MIN_CORR_POINTS = 10

#: Fewest scored tokens for an unflagged perplexity comparison (kNN-LM: each layer's
#: interpolated perplexity on the held-out tokens): the per-token NLL of a small LM has a
#: standard deviation of a few nats, so the mean NLL over n tokens is uncertain by about
#: 2.5 / sqrt(n) nats: 8 % in perplexity at 1000 tokens, more than the few-percent gains that
#: separate the layers below it.
MIN_EVAL_TOKENS = 1000

#: Fewest texts of each class for an unflagged probe accuracy: with ``folds`` = 5 a class of
#: 10 texts puts 2 in each held-out fold, so below that one misclassified text moves the
#: fold's accuracy on the class by 100 % and the per-fold spread (the interval) is noise.
MIN_PROBE_CLASS = 10

#: Fewest texts in a quantile (hardness: the top-perplexity decile against the lowest-dispersion
#: one) for an unflagged overlap share: with k texts the share moves in steps of 1 / k, so
#: below 5 one text changes it by more than 20 points, and the permutation null (mean k / n)
#: is a handful of distinct values. n = 50 texts at the default q = 0.1.
MIN_QUANTILE_TEXTS = 5

#: Flag codes in a fixed order (the order of :func:`join_flags`), with what each means.
FLAG_CODES: dict[str, str] = {
    "low_n": f"fewer than {MIN_ROWS} rows (texts)",
    "few_distinct": f"fewer than {MIN_ROWS} distinct states among the rows",
    "low_null": f"fewer than {MIN_NULL} null draws (n_null)",
    "low_pairs": f"fewer than {MIN_PAIRS} sampled pairs",
    "k_rank": "readout dimension k at or above the rank of the (centred / CCR) states",
    "few_points": f"a correlation over fewer than {MIN_CORR_POINTS} points (chunks, groups, "
                  "texts, candidates or layers)",
    "small_class": f"a probe class with fewer than {MIN_PROBE_CLASS} texts",
    "few_tokens": f"an evaluation over fewer than {MIN_EVAL_TOKENS} scored tokens",
    "small_quantile": f"a quantile of fewer than {MIN_QUANTILE_TEXTS} texts (its share moves in "
                      "steps of 1/k)",
}


def corr_flag(n: int) -> str:
    """The flag of a correlation over ``n`` independent points (texts, chunks, groups,
    candidates, layers): ``"few_points"`` below :data:`MIN_CORR_POINTS`, else ``""``."""
    return "few_points" if n < MIN_CORR_POINTS else ""


def describe_flag(code: str) -> str:
    """What a flag code means (the code itself for an unknown one)."""
    return FLAG_CODES.get(code, code)


def join_flags(codes: Iterable[str]) -> str:
    """Flag codes as the table's ``flag`` string: unique, in :data:`FLAG_CODES` order,
    ``";"``-joined (``""``: none)."""
    got = {c for c in codes if c}
    order = [c for c in FLAG_CODES if c in got] + sorted(got - set(FLAG_CODES))
    return ";".join(order)


def split_flags(flag: str | None) -> tuple[str, ...]:
    """Inverse of :func:`join_flags` (``""``, ``None`` or NaN: no flags)."""
    if not isinstance(flag, str) or not flag:
        return ()
    return tuple(c for c in flag.split(";") if c)


class FlaggedResult:
    """What every null-calibrated result (:class:`~lmgeom.metrics.PGAResult`,
    :class:`~lmgeom.metrics.convergence.AlignmentResult`) does with its ``flags``, ``null``
    and ``warnings`` fields: the table's ``flag`` string and the scalar row."""

    flags: tuple[str, ...]

    @property
    def flag(self) -> str:
        """The flags as the results table's ``flag`` string (``""``: none)."""
        return join_flags(self.flags)

    @property
    def low_sample(self) -> bool:
        """True when the statistic was computed from too little data (any flag set)."""
        return bool(self.flags)

    def to_dict(self) -> dict:
        """All scalar fields (the null draws and the messages excluded; the flags as one
        ``flag`` string), e.g. for a results table row."""
        out = dataclasses.asdict(self)  # type: ignore[call-overload]
        out.pop("null")
        out.pop("warnings")
        out["flags"] = self.flag
        return out


def warn_low_sample(message: str, *, stacklevel: int = 2) -> None:
    """Emit ``message`` as a :class:`~lmgeom.errors.LowSampleWarning`, attributed to the
    user's own line: the first caller outside the lmgeom package (``stacklevel`` is only the
    fallback when the whole stack is lmgeom's, e.g. a worker thread). Python's default filter
    then shows a warning once per line of the user's code, not once per library line."""
    warnings.warn(message, LowSampleWarning, stacklevel=_user_stacklevel(stacklevel + 1))


def _user_stacklevel(fallback: int) -> int:
    """The ``stacklevel`` (counted from the caller of this function) of the first frame
    outside the lmgeom package; ``fallback`` when there is none."""
    package = str(Path(__file__).resolve().parents[1])
    frame, level = sys._getframe(2), 2  # level 1 is warn_low_sample itself
    while frame is not None:
        if not str(Path(frame.f_code.co_filename).resolve()).startswith(package):
            return level
        frame, level = frame.f_back, level + 1
    return fallback


def _prefix(label: str | None) -> str:
    return f"{label}: " if label else ""


def numerical_rank(A: np.ndarray, rtol: float) -> int:
    """Numerical rank of ``A`` (n, d): singular values above ``rtol`` x the largest, from the
    eigenvalues of the smaller Gram matrix (the convention of the CCR rank check)."""
    n, d = A.shape
    C = A @ A.T if n <= d else A.T @ A
    lam = scipy.linalg.eigvalsh(C)
    top = float(lam[-1]) if lam.size else 0.0
    if not top > 0:
        return 0
    return int(np.count_nonzero(lam > (rtol ** 2) * top))


def pga_flags(*, n: int, n_distinct: int, n_null: int, n_pairs: int, exact: bool, k: int,
              ranks: dict[int, int] | None,
              label: str | None = None) -> dict[int | None, list[tuple[str, str]]]:
    """The low-sample flags of one PGA computation.

    Args:
        n: rows; n_distinct: distinct input rows; n_null: null draws; n_pairs, exact: the pairs
            used; k: readout dimension.
        ranks: CCR level m -> r_m (rank after centring / CCR-m), or None when every r_m is
            known to exceed k.
        label: message prefix (e.g. ``"layer 3"``).

    Returns:
        ``{None: [(code, message), ...] for every level, m: [...] for level m only}``.
    """
    p = _prefix(label)
    common: list[tuple[str, str]] = []
    if n < MIN_ROWS:
        common.append(("low_n", (
            f"{p}only n={n} rows (texts): {n * (n - 1) // 2} distances among {n} points "
            f"(fewer than {MIN_ROWS}) make z unreliable; pass at least {MIN_ROWS} texts (the "
            "paper uses 512)")))
    elif n_distinct < MIN_ROWS:
        common.append(("few_distinct", (
            f"{p}only {n_distinct} distinct states among {n} rows (does every text end in the "
            f"same token?): z rests on {n_distinct} points (fewer than {MIN_ROWS}); use "
            "pooling='mean' (--pooling mean) or more varied texts")))
    if n_null < MIN_NULL:
        rse = 100.0 / math.sqrt(2.0 * (n_null - 1))
        common.append(("low_null", (
            f"{p}n_null={n_null} null draws (fewer than {MIN_NULL}): the null std that z "
            f"divides by is uncertain by about +-{rse:.0f} % and the p-value cannot go below "
            f"{1.0 / (1 + n_null):.2g}; use n_null >= {MIN_NULL} (default 100)")))
    total = n * (n - 1) // 2
    se = math.sqrt(max(0.0, 1.0 - n_pairs / total) / n_pairs) if n_pairs and total else 0.0
    if not exact and se > 1.0 / math.sqrt(MIN_PAIRS):
        common.append(("low_pairs", (
            f"{p}z rests on {n_pairs} sampled pairs of {total} (fewer than {MIN_PAIRS}): the "
            f"sampling error of each correlation is about {se:.2f}; use pairs >= {MIN_PAIRS} "
            "or every pair (pairs=None / --pairs exact)")))
    out: dict[int | None, list[tuple[str, str]]] = {None: common}
    for m, r in (ranks or {}).items():
        if k < r:
            continue
        r0 = r + m
        span = max(0, min(n_distinct, n) - 1)
        if m > 0 and k < r0:
            more = (f", or more than k + ccr + 1 = {k + m + 1} distinct texts"
                    if r0 >= span else "")
            why = (f"CCR-{m} leaves rank {r} of the centred states' {r0}, and k={k} >= {r}: the "
                   "readout subspace is as large as what is left of the data, so readout and "
                   f"random frames preserve the distances alike and z is not meaningful; use "
                   f"a ccr below {r0 - k} or a smaller k{more}")
        else:
            after = "centring" + (f"/CCR-{m}" if m else "")
            same = ("the readout subspace is as large as the data's span, so readout and "
                    "random frames preserve the distances alike and z is not meaningful")
            smaller_k = f"k < {r} or " if r > 1 else ""
            if r0 >= span:  # the row count limits the rank: more (distinct) texts help
                if n_distinct < n:
                    dist = f"{n_distinct} distinct states"
                    more = (f"more than k + ccr + 1 = {k + m + 1} distinct states (more varied "
                            "texts, or pooling='mean')")
                else:
                    dist = f"n={n} rows"
                    more = f"more than k + ccr + 1 = {k + m + 1} texts"
                why = (f"k={k} >= {r}, the rank of the states after {after} ({dist} span at "
                       f"most {span} dimensions): {same}; use {smaller_k}{more}")
            else:
                why = (f"k={k} >= {r}, the numerical rank of the states after {after} (the "
                       f"{n} rows span only {r0} dimensions): {same}; use "
                       + (f"k < {r}" if r > 1 else "a smaller ccr or other texts"))
        out[m] = [("k_rank", f"{p}{why}")]
    return out
