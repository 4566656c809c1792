"""The CPU ranking path: exact, tie-aware Spearman against a fixed reference, compiled (numba).

The null loop ranks P = n(n-1)/2 distances per frame and level. :class:`SpearmanKernel` does it
in a few compiled passes that release the GIL (so the null loop's worker threads overlap):

1. **keys, streamed**: value t is ``x_t = c0 + c1 * src[gidx[t]]`` (``src``: the flat Gram
   matrix of the unit rows with ``c0 = 1, c1 = -1``, so ``x = fl(1 - cos)``, read in the pairs'
   own order; or a distance vector with ``c0 = 0, c1 = 1``); its int32 key ``trunc(2**29 x)``
   (exact scaling: a power of two) is a monotone function of the float64 value and travels
   with a payload (the pair's reference position, or the element's own index);
2. **LSD radix sort** of (key, payload): 3 passes of 11/10/10 bits, or 4 of 8 bits above
   2**18 keys, where the smaller scatter fans stay in cache;
3. **runs of equal keys** are ordered by their exact float64 values (insertion sort; a
   merge sort for long runs) and their groups of exactly equal values (ties) recorded;
4. **the numerator, exactly**: twice a centred average rank is an integer (``2 r - P - 1``),
   so ``4 * sum_t cf_t cg_t`` is a sum of integers. It is summed in int64 chunks small enough
   never to overflow and carried in a two-word accumulator (``hi * 2**32 + lo``), so any
   P < 2**31 is exact; the tie term ``sum(c**3 - c)`` likewise.

Weighted references (many duplicate rows: P pairs that read only U distinct Gram entries)
sort the U entries once and weigh each by its multiplicity. The null loop correlates many
frames against one reference (the full-space distances), so the reference is ranked once
(:class:`RankReference`, :class:`WeightedReference`) and kept in the forms the kernel reads.
The result does not depend on summation order or BLAS. Values below 0 or of 4 and more are
clamped to the end keys (still exact: those runs are ordered by their values); a NaN makes
the call return ``None``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

__all__ = [
    "MAX_PAIRS",
    "RankReference",
    "SpearmanKernel",
    "WeightedReference",
    "kernel_available",
    "weighted_reference",
]

log = logging.getLogger(__name__)

#: int32 payloads and positions: at most this many values per vector (n <= 65 536 rows exact)
MAX_PAIRS = (1 << 31) - 1


@lru_cache(maxsize=1)
def kernel_available() -> bool:
    """Whether numba imports and compiles the kernel (checked once, on a small known case).
    When not, the caller ranks with torch's sort on the CPU instead; this logs it once."""
    try:
        ok = _self_check()
    except Exception as exc:  # noqa: BLE001 - a missing or broken numba/LLVM
        log.warning("compiled rank kernel unavailable (%s: %s); ranking with torch's sort on "
                    "the CPU (slower, same numbers to ~1e-15)", type(exc).__name__, exc)
        return False
    if not ok:  # pragma: no cover - would be a kernel bug
        log.warning("compiled rank kernel failed its self-check; ranking with torch's sort")
    return ok


def _self_check() -> bool:
    """Spearman of (0.1, 0.3, 0.2, 0.2) against (1, 2, 3, 4) is 1 / sqrt(10): average ranks
    (1, 4, 2.5, 2.5), centred sums 1.5 / sqrt(5 * 4.5)."""
    kern = SpearmanKernel(4)
    posf = np.arange(4, dtype=np.int32)
    got = kern.numerator(np.array([0.1, 0.3, 0.2, 0.2]), kern.iota(), posf, kern.iota(),
                         0.0, 1.0, np.empty(0, np.int32), np.empty(0, np.uint8), 0)
    return got == (6, 6) and abs(kern.rho(5.0, *got) - 1.0 / math.sqrt(10.0)) < 1e-15


#: LSD digits ``(k >> shift) & mask`` of the int32 keys: 3 passes of 11/10/10 bits while the
#: scatter fans stay in cache (P <= 2**18), else 4 of 8 bits
DIGITS = {3: ((0, 11, 21), (2047, 1023, 1023)), 4: ((0, 8, 16, 24), (255, 255, 255, 255))}


@lru_cache(maxsize=1)
def _compiled():
    """The compiled passes (:mod:`lmgeom.metrics._rank_jit`, cached on disk by numba, so only
    the first process on a machine compiles them)."""
    from . import _rank_jit as jit

    return SimpleNamespace(keys_pass=jit.keys_pass, finish=jit.finish, numerator=jit.numerator,
                           weighted=jit.weighted,
                           radix={R: jit.radix(*DIGITS[R]) for R in DIGITS})


class SpearmanKernel:
    """Buffers of one worker thread for ranking vectors of P values (2 <= P <= MAX_PAIRS)."""

    def __init__(self, P: int) -> None:
        if not 2 <= P <= MAX_PAIRS:
            raise ValueError(f"SpearmanKernel handles 2..{MAX_PAIRS} values, got {P}")
        self.P = P = int(P)
        self.digits = 4 if P > (1 << 18) else 3  # see DIGITS
        self.hist = np.zeros((self.digits, 2048 if self.digits == 3 else 256), dtype=np.int64)
        self.k = (np.empty(P, dtype=np.int32), np.empty(P, dtype=np.int32))
        self.v = (np.empty(P, dtype=np.int32), np.empty(P, dtype=np.int32))
        self.xs = np.empty(P, dtype=np.float64)  # one run at a time (at most P)
        self.ps = np.empty(P, dtype=np.int32)
        self.gfirst = np.empty(P // 2 + 1, dtype=np.int32)
        self.gcount = np.empty(P // 2 + 1, dtype=np.int32)
        self.acc = np.zeros(4, dtype=np.int64)
        self._iota: np.ndarray | None = None

    def iota(self) -> np.ndarray:
        """``arange(P)`` as int32 (the identity ``gidx`` / payload), computed once."""
        if self._iota is None:
            self._iota = np.arange(self.P, dtype=np.int32)
        return self._iota

    def sort(self, src: np.ndarray, gidx: np.ndarray, payload: np.ndarray, fo: np.ndarray,
             c0: float, c1: float) -> tuple[np.ndarray, int] | str | None:
        """The payloads in ascending order of the values ``c0 + c1 * src[gidx[t]]`` (exact:
        runs of equal keys ordered by the values ``c0 + c1 * src[fo[payload]]``), and the
        number of tie groups (``gfirst[:ng]``, ``gcount[:ng]``). None when a value is NaN,
        ``"constant"`` when all values are equal. The order is a view of an internal buffer."""
        fns = _compiled()
        offsets, passes = fns.radix[self.digits]
        (kA, kB), (vA, vB) = self.k, self.v
        if not fns.keys_pass(src, gidx, payload, c0, c1, kA, vA):
            return None
        offsets(kA, self.hist)
        bufs = ((kA, vA), (kB, vB))
        for r, scatter in enumerate(passes):
            (ki, vi), (ko, vo) = bufs[r % 2], bufs[1 - r % 2]
            scatter(ki, vi, ko, vo, self.hist, r)
        keys, pos = bufs[len(passes) % 2]
        ng = fns.finish(keys, pos, src, fo, c0, c1, self.xs, self.ps, self.gfirst, self.gcount)
        return "constant" if ng < 0 else (pos, int(ng))

    def _result(self) -> tuple[int, int]:
        a = self.acc.tolist()
        return (a[0] << 32) + a[1], (a[2] << 32) + a[3]

    def numerator(self, src: np.ndarray, gidx: np.ndarray, posf: np.ndarray, fo: np.ndarray,
                  c0: float, c1: float, cf2: np.ndarray, tied: np.ndarray,
                  n_tied: int) -> tuple[int, int] | str | None:
        """``(4 * sum cf cg, sum(c**3 - c))`` (exact integers) of the frame whose value at
        pair t is ``c0 + c1 * src[gidx[t]]``.

        Args:
            src: flat float array the values are read from.
            gidx: (P,) int, where pair t's value lies in ``src`` (streamed in this order).
            posf: (P,) int32, pair t's position in the reference's sorted order.
            fo: (P,) int ``gidx[order]``: where the value at reference position v lies (read
                only inside runs of equal keys).
            cf2: (P,) int32, twice the reference's centred average ranks by position (empty:
                no ties, ``2 v + 1 - P``).
            tied: uint8 bitmap (``np.packbits(..., bitorder="little")``) of the positions
                inside the reference's tie groups, where ``cf2`` differs from ``2 v + 1 - P``.
            n_tied: the number of set bits of ``tied``.

        Returns:
            ``None`` when a value is NaN, ``"constant"`` when the values are all equal.
        """
        got = self.sort(src, gidx, posf, fo, c0, c1)
        if got is None or isinstance(got, str):
            return got
        pos, ng = got
        numerator = _compiled().numerator
        # first as if the reference had no ties: its tie groups (duplicate rows) are tie
        # groups in every frame too; if a tied reference position lies outside them, again
        # with the reference's tie ranks everywhere
        for general in (False, True):
            self.acc[:] = 0
            met = numerator(pos, cf2, tied, general, self.gfirst, self.gcount, ng, self.acc)
            if general or met == n_tied:
                return self._result()
        raise AssertionError  # pragma: no cover

    def weighted(self, src: np.ndarray, fo: np.ndarray, w: np.ndarray, a2: np.ndarray, P: int,
                 c0: float, c1: float) -> tuple[int, int] | str | None:
        """As :meth:`numerator` over P pairs that read only the ``self.P`` entries
        ``src[fo[u]]``, entry u ``w[u]`` times; ``a2[u]``: ``w[u]`` times twice the
        reference's centred average rank of entry u (all int64)."""
        io = self.iota()
        got = self.sort(src, fo, io, fo, c0, c1)
        if got is None or isinstance(got, str):
            return got
        pos, ng = got
        self.acc[:] = 0
        _compiled().weighted(pos, w, a2, P, self.gfirst, self.gcount, ng, self.acc)
        return self._result()

    def rho(self, S_ref: float, num: int, ties: int, P: int | None = None) -> float:
        """Spearman rho from :meth:`numerator`'s integers against a reference with sum of
        squared centred ranks ``S_ref`` (P defaults to the kernel's length)."""
        P = self.P if P is None else P
        S = (P * (P * P - 1) - ties) / 12.0  # exact integers: no cancellation with big ties
        return (num / 4.0) / math.sqrt(S_ref * S)

    def order(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The exact ascending order of ``d`` (int64) and its tie groups ``(first, count)``
        in sorted coordinates; None on NaN. Raises ValueError when ``d`` is constant."""
        io = self.iota()
        got = self.sort(d, io, io, io, 0.0, 1.0)
        if got == "constant":
            raise ValueError("all values are equal")
        if got is None:
            return None
        pos, ng = got
        return (pos.astype(np.int64), self.gfirst[:ng].astype(np.int64),
                self.gcount[:ng].astype(np.int64))


# --------------------------------------------------- the reference's ranks, computed once

class RankReference:
    """Average ranks of a fixed vector of P values, prepared for the compiled kernel.

    Args:
        order: (P,) the elements in ascending order of value (exact; any order inside ties).
        first, count: start (in sorted coordinates) and size of every group of equal values.

    Attributes:
        P, m: length and mean rank ``(P + 1) / 2``.
        order: (P,) int64 element at each sorted position.
        posf: (P,) int32 position of each element in the sorted order (inverse of ``order``).
        cpos: None when there are no ties (the centred rank at position t is then
            ``t + 1 - m``), else (P,) the centred average rank at each position.
        tie_pos: positions inside tie groups.
        S: sum of squared centred ranks.
        cf2, tied: the ties as the kernel reads them (see ``__init__``).
    """

    def __init__(self, order: np.ndarray, first: np.ndarray, count: np.ndarray) -> None:
        P = order.size
        self.P = P
        self.m = (P + 1) / 2.0
        self.order = order
        self.posf = np.empty(P, dtype=np.int32)
        self.posf[order] = np.arange(P, dtype=np.int32)
        S = P * (P * P - 1.0) / 12.0
        self.cpos: np.ndarray | None = None
        self.tie_pos = np.empty(0, dtype=np.int64)
        if first.size:
            total = int(count.sum())
            offs = np.repeat(np.cumsum(count) - count, count)
            self.tie_pos = np.repeat(first, count) + (np.arange(total) - offs)
            cpos = np.arange(1.0 - self.m, P + 1.0 - self.m)
            cpos[self.tie_pos] = np.repeat(first + (count + 1) / 2.0, count) - self.m
            c = count.astype(np.float64)
            S -= math.fsum((c ** 3 - c).tolist()) / 12.0
            self.cpos = cpos
        self.S = S
        #: for the kernel: twice the centred average rank at each position as int32
        #: (``2 r - P - 1``) and a bitmap (uint8, little bit order) of the positions inside
        #: tie groups, where it differs from ``2 t + 1 - P``; both empty without ties
        self.cf2 = np.empty(0, dtype=np.int32)
        self.tied = np.empty(0, dtype=np.uint8)
        if self.cpos is not None:
            tied = np.zeros(P, dtype=np.uint8)
            tied[self.tie_pos] = 1
            self.cf2 = np.rint(2.0 * self.cpos).astype(np.int32)
            self.tied = np.packbits(tied, bitorder="little")

    def centred_at(self, positions: np.ndarray) -> np.ndarray:
        """Centred average ranks at sorted positions."""
        if self.cpos is None:
            return positions.astype(np.float64) - (self.m - 1.0)
        return self.cpos[positions]


@dataclass(frozen=True)
class WeightedReference:
    """The reference seen through the distinct entries of a duplicate-row layout.

    With duplicate rows, every pair maps to one entry ``gidx[p]`` of the unique rows' Gram
    matrix, and both the reference and every frame are functions of that entry: the P pairs
    are U distinct values with multiplicities ``w``. Average ranks over the P pairs follow
    from the U values and their weights (an entry's rank is the weight below it plus
    ``(w + 1) / 2``), so a frame needs one sort of U keys instead of P.

    Attributes:
        gram: (U,) the distinct Gram entries, ascending.
        w: (U,) int64 how many pairs read each.
        a2: (U,) int64 ``w`` times twice the reference's centred average rank of the entry.
        P, S: as :class:`RankReference` (over the P pairs).
    """

    gram: np.ndarray
    w: np.ndarray
    a2: np.ndarray
    P: int
    S: float

    @property
    def U(self) -> int:
        return int(self.gram.size)


def weighted_reference(ref: RankReference, gidx: np.ndarray,
                       max_fraction: float = 0.5) -> WeightedReference | None:
    """:class:`WeightedReference` of ``ref`` over the entries ``gidx`` (one per pair), or None
    when it would not pay (more than ``max_fraction`` of the pairs are distinct entries) or
    when the reference is not a function of the entry (then it does not describe the data)."""
    gram, first, inverse, w = np.unique(gidx, return_index=True, return_inverse=True,
                                        return_counts=True)
    if gram.size > max_fraction * ref.P:
        return None
    c_all = ref.centred_at(ref.posf)
    cref = c_all[first]
    if not np.array_equal(c_all, cref[inverse.ravel()]):
        return None
    w = w.astype(np.int64)
    return WeightedReference(gram, w, w * np.rint(2.0 * cref).astype(np.int64), ref.P, ref.S)
