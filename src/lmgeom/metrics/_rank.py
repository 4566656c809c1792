"""The fixed side of an exact, tie-aware Spearman correlation: the reference's average ranks.

Spearman = Pearson correlation of average ranks (``scipy.stats.spearmanr``). The null loop
correlates many frames against one reference (the full-space distances), so the reference is
ranked once (:class:`RankReference`, from the compiled kernel's exact order,
:mod:`~lmgeom.metrics._rank_kernel`) and kept in the forms the kernel reads: each element's
position in the sorted order, and twice the centred average rank at each position (an
integer). With many duplicate rows, :class:`WeightedReference` describes the same reference
through the distinct Gram entries the pairs read, with their multiplicities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["RankReference", "WeightedReference", "weighted_reference"]


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
