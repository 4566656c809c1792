"""Exact, tie-aware Spearman correlation of long distance vectors against a fixed reference.

Spearman = Pearson correlation of average ranks (``scipy.stats.spearmanr``). The expensive part
is ranking a vector of P = n(n-1)/2 pair distances once per null frame; this module does it with
one sort of packed 63-bit integer keys instead of an ``argsort`` (about 4x faster):

* the high ``63 - s`` bits of a key hold a monotone fixed-point image of the value
  ``floor((d - min) * scale)``, the low ``s = bit_length(P - 1)`` bits hold a label (the pair's
  index, or its position in the reference ordering);
* after the sort, runs of equal high bits (values closer than the fixed-point resolution, and
  exact ties) are re-sorted by their exact float64 values, so the final order is exactly the
  order of the float64 values; exact ties get average ranks.

With the reference's *positions* as labels, the sorted keys directly give the reference rank of
every element in the frame's order, so no gather over P elements is needed. The correlation
sums are accumulated in float64 in chunks and combined with ``math.fsum``.

The sort itself runs in numpy (``ndarray.sort``: x86-simd-sort where numpy dispatches it) or in
torch (``torch.sort``: a radix sort for non-negative integer keys on CPU), whichever is faster on
this machine: measured once per process on 65,536 random keys (:func:`sort_backend`), or set by
``LMGEOM_SORT=numpy|torch``. The keys are distinct (every key carries its own label), so both
give the same order and the results do not depend on the choice.

The null loop's exact mode uses a cheaper variant (:class:`KeySorter`, :func:`keyed_spearman`):
int32 keys ``trunc(2**29 d)`` formed on the frame's Gram matrix and gathered straight into the
reference's order, sorted by torch's CPU radix sort (4 passes of 8 bits instead of 8) together
with their positions, which are then the reference positions in the frame's order. Runs of
equal keys are finished with the exact float64 distances as above, so the ranks, and the
correlations, are the same as the packed-key path's (tested to 1e-13). Where numba is present,
the null loop and the sampled/readout correlations go one step further, through the compiled
kernel of :mod:`~lmgeom.metrics._rank_kernel` (the same keys, its own radix sort, the numerator
summed exactly in int64); this module's paths remain for what the kernel declines and for
``LMGEOM_RANK_KERNEL=torch``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from functools import lru_cache

import numpy as np

__all__ = [
    "KEY_SCALE",
    "ConstantVectorError",
    "KeySorter",
    "RankReference",
    "Sorter",
    "WeightedReference",
    "distance_keys",
    "keyed_available",
    "keyed_spearman",
    "scaled_cosine_keys",
    "sort_backend",
    "spearman_to_reference",
    "weighted_keyed_spearman",
    "weighted_reference",
]

_CHUNK = 1 << 18


class ConstantVectorError(ValueError):
    """All values of a vector are equal, so its Spearman correlation is undefined."""


def _label_dtype(P: int) -> type:
    # uint64 labels combine with the keys without a cast; uint32 halves the memory when large
    return np.uint64 if P <= (1 << 24) or P >= (1 << 32) else np.uint32


_PROBE_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def sort_backend() -> str:
    """``"numpy"`` or ``"torch"``: the faster sort of distinct non-negative int64 keys here.

    ``LMGEOM_SORT`` overrides; otherwise both are timed (one thread, one warm-up, median of 5
    interleaved runs) on 131,072 keys, once
    per process. numpy's sort is a SIMD quicksort where numpy dispatches one (AVX-512 builds on
    some CPUs); torch sorts integer keys on CPU with a radix sort. Measured 2026-12-04 on the
    project's 2-core AMD EPYC VM: 131,072 keys 5.0 ms (numpy) vs 1.8 ms (torch, one thread).
    """
    from .._env import sort_backend_override

    forced = sort_backend_override()
    if forced in ("numpy", "torch"):
        if forced == "torch":
            try:
                import torch
            except ImportError:  # pragma: no cover
                return "numpy"
        return forced
    try:
        import torch
    except ImportError:  # pragma: no cover
        return "numpy"
    keys = np.random.default_rng(0).integers(0, 1 << 62, 1 << 17, dtype=np.int64)
    tk = torch.from_numpy(keys)
    with _PROBE_LOCK:  # one measurement at a time (worker threads may ask together)
        prev = torch.get_num_threads()
        torch.set_num_threads(1)  # as inside the null loop
        try:
            t_torch, t_numpy = [], []
            torch.sort(tk)  # first calls pay one-off costs (thread pool, page faults)
            np.sort(keys)
            for _ in range(5):  # interleaved, so a burst of load hits both
                t = time.perf_counter()
                torch.sort(tk)
                t_torch.append(time.perf_counter() - t)
                t = time.perf_counter()
                np.sort(keys)
                t_numpy.append(time.perf_counter() - t)
        finally:
            torch.set_num_threads(prev)
    return "torch" if float(np.median(t_torch)) < float(np.median(t_numpy)) else "numpy"


@lru_cache(maxsize=1)
def keyed_available() -> bool:
    """Whether the int32-key path (:class:`KeySorter`, torch's radix sort) is used: torch is
    importable and ``LMGEOM_SORT`` does not force ``numpy`` (which keeps every sort in numpy)."""
    from .._env import sort_backend_override

    if sort_backend_override() == "numpy":
        return False
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


class Sorter:
    """Reusable buffers for sorting vectors of length P (one per worker thread)."""

    def __init__(self, P: int) -> None:
        self.P = int(P)
        self.s = max(1, int(self.P - 1).bit_length())
        self.kb = 63 - self.s  # the top bit stays 0: keys are non-negative as int64 too
        self.key = np.empty(self.P, dtype=np.uint64)
        self._sorted: np.ndarray | None = None
        self._torch: tuple | None = None
        self._tmp = np.empty(min(self.P, _CHUNK))
        self._x = np.empty(min(self.P, _CHUNK), dtype=np.uint64)
        self._ids: np.ndarray | None = None
        self._cpos: np.ndarray | None = None

    def sort(self, d: np.ndarray, labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Sort ``d`` approximately by value, carrying ``labels`` (default: indices).

        Returns:
            ``(lab, e)``: ``lab`` (P,) int64 view of the internal buffer, the labels in an order
            that is correct except inside collision runs; ``e`` the positions t at which
            element t and t+1 share the same high bits (to be fixed by :func:`fix_runs`).
        """
        P, s = self.P, self.s
        lo = float(d.min())
        hi = float(d.max())
        if not hi > lo:
            raise ConstantVectorError("all values are equal")
        if lo >= 0.0 and d.dtype == np.float64 and d.flags.c_contiguous \
                and int(d.view(np.int64).min()) >= 0:
            self._bits_keys(d, labels)
        else:
            self._fixed_point_keys(d, labels, lo, hi)
        key = self._sort_keys()
        parts = []
        x = self._x
        limit = np.uint64(1 << s)
        for c0 in range(0, P - 1, _CHUNK):
            c1 = min(P - 1, c0 + _CHUNK)
            xx = x[: c1 - c0]
            np.bitwise_xor(key[c0 + 1:c1 + 1], key[c0:c1], out=xx)
            hit = np.flatnonzero(xx < limit)
            if hit.size:
                parts.append(hit + c0)
        e = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        np.bitwise_and(key, np.uint64((1 << s) - 1), out=key)
        return key.view(np.int64), e

    def _sort_keys(self) -> np.ndarray:
        """The keys in ascending order (``self.key`` itself, or the torch output buffer)."""
        if sort_backend() == "numpy":
            self.key.sort()
            return self.key
        import torch

        if self._torch is None:
            self._sorted = np.empty(self.P, dtype=np.uint64)
            self._torch = (torch.from_numpy(self.key.view(np.int64)),
                           torch.from_numpy(self._sorted.view(np.int64)),
                           torch.empty(self.P, dtype=torch.int64))
        src, dst, idx = self._torch
        torch.sort(src, out=(dst, idx))
        return self._sorted

    def _bits_keys(self, d: np.ndarray, labels: np.ndarray | None) -> None:
        """Keys from the IEEE bits of non-negative float64 values (monotone in the value):
        the low s mantissa bits are replaced by the label (2 passes instead of 6)."""
        P, key = self.P, self.key
        np.bitwise_and(d.view(np.uint64), np.uint64(~((1 << self.s) - 1) & ((1 << 64) - 1)),
                       out=key)
        if labels is None:
            np.bitwise_or(key, self._iota(), out=key)
        elif labels.dtype == np.uint64:
            np.bitwise_or(key, labels, out=key)
        else:
            for c0 in range(0, P, _CHUNK):
                c1 = min(P, c0 + _CHUNK)
                np.bitwise_or(key[c0:c1], labels[c0:c1], out=key[c0:c1], casting="unsafe")

    def _iota(self) -> np.ndarray:
        if self._ids is None:
            self._ids = np.arange(self.P, dtype=np.uint64)
        return self._ids

    def _fixed_point_keys(self, d: np.ndarray, labels: np.ndarray | None, lo: float,
                          hi: float) -> None:
        """Keys from a fixed-point image of ``(d - min)`` (any sign; the general path)."""
        P, s, kb = self.P, self.s, self.kb
        scale = (2.0 ** kb - 1.0) / (hi - lo) * (1.0 - 1e-12)
        if not math.isfinite(scale):  # pragma: no cover - spread below 1e-290
            scale = 1.0
        key, tmp = self.key, self._tmp
        sh = np.uint64(s)
        for c0 in range(0, P, _CHUNK):
            c1 = min(P, c0 + _CHUNK)
            t = tmp[: c1 - c0]
            np.subtract(d[c0:c1], lo, out=t)
            t *= scale
            kk = key[c0:c1]
            np.copyto(kk, t, casting="unsafe")
            np.left_shift(kk, sh, out=kk)
            if labels is None:
                np.bitwise_or(kk, np.arange(c0, c1, dtype=np.uint64), out=kk)
            else:
                np.bitwise_or(kk, labels[c0:c1], out=kk, casting="unsafe")

    def centred_positions(self) -> np.ndarray | None:
        """``t + 1 - (P + 1) / 2`` for t in range(P), cached (None above 2**24 elements)."""
        if self.P > (1 << 24):
            return None
        if self._cpos is None:
            self._cpos = np.arange(self.P, dtype=np.float64) + (1.0 - (self.P + 1) / 2.0)
        return self._cpos


def run_positions(e: np.ndarray, P: int) -> np.ndarray:
    """Every position inside a collision run (``e`` and ``e + 1``), ascending, unique."""
    if 16 * e.size < P:
        pos = np.concatenate([e, e + 1])
        pos.sort()
        if pos.size > 1:
            keep = np.empty(pos.size, dtype=bool)
            keep[0] = True
            np.not_equal(pos[1:], pos[:-1], out=keep[1:])
            pos = pos[keep]
        return pos
    flag = np.zeros(P, dtype=bool)
    flag[e] = True
    flag[e + 1] = True
    return np.flatnonzero(flag)


def fix_runs(lab: np.ndarray, e: np.ndarray,
             values_of: Callable[[np.ndarray], np.ndarray],
             pos: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Finish the sort inside collision runs and find the exact ties.

    Args:
        lab: (P,) labels as left by :meth:`Sorter.sort`; reordered in place.
        e: collision positions from :meth:`Sorter.sort`.
        values_of: maps labels to their exact float64 values.
        pos: :func:`run_positions` of ``e`` when the caller has them.

    Returns:
        ``(first, count)``: start position and size of every group of exactly equal values
        (size >= 2), in sorted-order coordinates.
    """
    empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    if e.size == 0:
        return empty
    if pos is None:  # every position inside a collision run, ascending
        pos = run_positions(e, lab.size)
    lab_p = lab[pos]
    vals = values_of(lab_p)
    # runs have distinct high key bits, so values of different runs are already in run order
    # and equal values only occur inside one run: one stable sort by value (nearly sorted,
    # timsort) finishes every run at once
    o = np.argsort(vals, kind="stable")
    lab_p = lab_p[o]
    vals = vals[o]
    lab[pos] = lab_p
    same = vals[1:] == vals[:-1]
    if not same.any():
        return empty
    start = np.ones(pos.size, dtype=bool)
    start[1:] = ~same
    gid = np.cumsum(start) - 1
    count = np.bincount(gid)
    first = pos[start]
    multi = count > 1
    return first[multi].astype(np.int64), count[multi].astype(np.int64)


def _expand_groups(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions covered by tie groups and each position's group-average (1-based) rank."""
    total = int(count.sum())
    offs = np.repeat(np.cumsum(count) - count, count)
    positions = np.repeat(first, count) + (np.arange(total) - offs)
    avg = np.repeat(first + (count + 1) / 2.0, count)
    return positions, avg


def _tie_term(count: np.ndarray) -> float:
    c = count.astype(np.float64)
    return math.fsum((c ** 3 - c).tolist()) / 12.0


class RankReference:
    """Average ranks of a fixed vector (the full-space distances), prepared for fast Spearman.

    Attributes:
        P: length.
        posf: (P,) position of each element in the reference's sorted order (uint32/uint64).
        order: (P,) element at each sorted position (inverse of ``posf``).
        cpos: None when the reference has no ties (its centred rank at position t is then
            ``t + 1 - (P + 1) / 2``), else (P,) centred average rank at each position.
        S: sum of squared centred ranks.
    """

    def __init__(self, d: np.ndarray, sorter: Sorter) -> None:
        P = d.size
        self.P = P
        self.m = (P + 1) / 2.0
        lab, e = sorter.sort(d, None)
        first, count = fix_runs(lab, e, lambda x: d[x])
        ldt = _label_dtype(P)
        self.order = lab.astype(ldt)
        posf = np.empty(P, dtype=ldt)
        for c0 in range(0, P, _CHUNK):
            c1 = min(P, c0 + _CHUNK)
            posf[self.order[c0:c1]] = np.arange(c0, c1, dtype=ldt)
        self.posf = posf
        S = P * (P * P - 1.0) / 12.0
        self.cpos: np.ndarray | None = None
        #: positions inside tie groups, and cpos minus the plain centred rank there
        self.tie_pos = np.empty(0, dtype=np.int64)
        self.tie_delta = np.empty(0)
        if first.size:
            cpos = np.arange(1.0 - self.m, P + 1.0 - self.m)
            positions, avg = _expand_groups(first, count)
            cpos[positions] = avg - self.m
            S -= _tie_term(count)
            self.cpos = cpos
            self.tie_pos = positions
            self.tie_delta = avg - (positions + 1.0)
        self.S = S

    def order_index(self) -> np.ndarray:
        """``order`` as int64 (a gather index), computed once."""
        idx = getattr(self, "_order_index", None)
        if idx is None:
            idx = self._order_index = self.order.astype(np.int64)
        return idx

    def positions32(self) -> np.ndarray:
        """``posf`` as int32 (the compiled kernel's payload; P < 2**31), computed once."""
        p32 = getattr(self, "_positions32", None)
        if p32 is None:
            p32 = self._positions32 = self.posf.astype(np.int32)
        return p32

    def centred2(self) -> tuple[np.ndarray, np.ndarray]:
        """For the compiled kernel: twice the centred average rank at each position as int32
        (integers: ``2 r - P - 1``) and a bitmap (uint8, little bit order) of the positions
        inside tie groups, where it differs from ``2 t + 1 - P``; both empty when the
        reference has no ties. Computed once."""
        c2 = getattr(self, "_centred2", None)
        if c2 is None:
            if self.cpos is None:
                c2 = (np.empty(0, dtype=np.int32), np.empty(0, dtype=np.uint8))
            else:
                tied = np.zeros(self.P, dtype=np.uint8)
                tied[self.tie_pos] = 1
                c2 = (np.rint(2.0 * self.cpos).astype(np.int32),
                      np.packbits(tied, bitorder="little"))
            self._centred2 = c2
        return c2

    def centred_at(self, positions: np.ndarray) -> np.ndarray:
        """Centred average ranks at reference positions."""
        if self.cpos is None:
            out = positions.astype(np.float64)
            out -= self.m - 1.0
            return out
        return self.cpos[positions]


def spearman_to_reference(ref: RankReference, d: np.ndarray, sorter: Sorter) -> float:
    """Spearman correlation between ``d`` and the reference vector (exact, tie-aware).

    Raises:
        ConstantVectorError: ``d`` is constant.
    """
    lab, e = sorter.sort(d, ref.posf)
    order = ref.order
    first, count = fix_runs(lab, e, lambda x: d[order[x]])
    return _correlation(ref, lab, first, count, sorter.centred_positions())


def _correlation(ref: RankReference, lab: np.ndarray, first: np.ndarray, count: np.ndarray,
                 tc: np.ndarray | None, main: float | None = None) -> float:
    """Spearman from the frame's order ``lab`` (reference positions in ascending order of the
    frame's values) and the frame's tie groups ``(first, count)``; ``tc`` the centred
    positions ``t + 1 - (P + 1) / 2`` (or None above 2**24 elements); ``main`` the sum
    ``sum_t cf(lab_t) (t + 1 - m)`` when the caller has it."""
    P, m = ref.P, ref.m
    parts = []
    if main is not None:  # the caller summed sum_t cf(lab_t) (t + 1 - m)
        parts.append(main)
    elif tc is not None and ref.cpos is None:
        # no ties in the reference: sum_t (lab_t + 1 - m)(t + 1 - m) = sum_t lab_t (t + 1 - m)
        # (the centred positions sum to 0), one BLAS dot
        parts.append(float(np.dot(lab.astype(np.float64), tc)))
    elif tc is not None:
        parts.append(float(np.dot(np.take(ref.cpos, lab), tc)))
    else:
        for c0 in range(0, P, _CHUNK):
            c1 = min(P, c0 + _CHUNK)
            cf = ref.centred_at(lab[c0:c1])
            parts.append(float(np.dot(cf, np.arange(c0 + 1.0 - m, c1 + 1.0 - m))))
    S = P * (P * P - 1.0) / 12.0
    if first.size:
        positions, avg = _expand_groups(first, count)
        cf = ref.centred_at(lab[positions])
        parts.append(float(np.dot(cf, avg - (positions + 1.0))))
        S -= _tie_term(count)
    return math.fsum(parts) / math.sqrt(ref.S * S)


class KeySorter:
    """Sorts int32 keys together with their positions (torch's CPU radix sort: 4 passes of
    8 bits, about half the time of the 63-bit packed keys of :class:`Sorter`).

    The caller writes ``keys`` (a monotone int32 image of the values, e.g. from
    :func:`distance_keys`, laid out in the *reference's* order), then :func:`keyed_spearman`
    sorts them; the positions that come back are directly reference positions, and runs of
    equal keys are finished with the exact float64 values. Needs torch (one per worker thread).
    """

    def __init__(self, P: int) -> None:
        import torch

        self.P = int(P)
        self.keys = np.empty(self.P, dtype=np.int32)
        self._src = torch.from_numpy(self.keys)
        self._vals = torch.empty(self.P, dtype=torch.int32)
        self._idx = torch.empty(self.P, dtype=torch.int64)
        self.vals = self._vals.numpy()
        self.idx = self._idx.numpy()
        self._eq = np.empty(max(self.P - 1, 0), dtype=bool)
        self._cpos: np.ndarray | None = None
        self._labf: np.ndarray | None = None
        self._torch = torch

    def sort(self) -> tuple[np.ndarray, np.ndarray]:
        """``(sorted keys, their positions)`` (views of internal buffers)."""
        self._torch.sort(self._src, out=(self._vals, self._idx))
        return self.vals, self.idx

    def float_buffer(self) -> np.ndarray:
        """(P,) float64 scratch (the sorted positions as floats, for one BLAS dot)."""
        if self._labf is None:
            self._labf = np.empty(self.P)
        return self._labf

    def centred_positions(self) -> np.ndarray | None:
        if self.P > (1 << 24):
            return None
        if self._cpos is None:
            self._cpos = np.arange(self.P, dtype=np.float64) + (1.0 - (self.P + 1) / 2.0)
        return self._cpos


#: Fixed-point scale of :func:`distance_keys`: 2**29 levels per unit of distance (cosine
#: distances lie in [0, 2], so keys stay below 2**31).
KEY_SCALE = float(1 << 29)


def distance_keys(G: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> None:
    """int32 keys ``trunc(2**29 * (1 - G))`` of the distances ``d = 1 - G`` (G: cosines).

    ``2**29 - 2**29 G`` rounds exactly like ``2**29 (1 - G)`` (a power-of-two scale commutes
    with rounding), so the key is a function of the float64 distance ``fl(1 - G)`` itself:
    equal distances get equal keys and larger distances never get smaller ones. ``tmp`` is
    float64 scratch of G's shape.
    """
    np.multiply(G, -KEY_SCALE, out=tmp)
    scaled_cosine_keys(tmp, out)


def scaled_cosine_keys(Gs: np.ndarray, out: np.ndarray) -> None:
    """The keys of :func:`distance_keys` from ``Gs = -2**29 G`` (exactly scaled cosines, as
    a GEMM of rows pre-scaled by ``-2**29`` gives them): ``trunc(2**29 + Gs)``, in one pass."""
    np.add(Gs, KEY_SCALE, out=out, casting="unsafe", dtype=np.float64)


def _sort_keys(ks: KeySorter, values_of: Callable[[np.ndarray], np.ndarray]) -> tuple:
    """Sort ``ks.keys`` and finish the runs of equal keys with the exact values.

    Returns:
        ``(lab, runpos, first, count)``: the positions in ascending order of the values, every
        position inside a run of equal keys, and the exact tie groups (:func:`fix_runs`).

    Raises:
        ConstantVectorError: all values are equal.
    """
    vals, lab = ks.sort()
    eq = ks._eq
    np.equal(vals[1:], vals[:-1], out=eq)
    e = np.flatnonzero(eq)
    runpos = run_positions(e, ks.P)
    first, count = fix_runs(lab, e, values_of, runpos)
    if count.size and int(count.max()) == ks.P:
        raise ConstantVectorError("all values are equal")
    return lab, runpos, first, count


def keyed_spearman(ref: RankReference, ks: KeySorter,
                   values_of: Callable[[np.ndarray], np.ndarray]) -> float:
    """Spearman correlation between a frame and the reference from the int32 keys in
    ``ks.keys`` (position t: the key of the frame's value at reference position t).

    Args:
        values_of: maps reference positions to the frame's exact float64 values (used only
            inside runs of equal keys, to finish the order and find exact ties).

    Raises:
        ConstantVectorError: the frame's values are all equal.
    """
    lab, runpos, first, count = _sort_keys(ks, values_of)
    tc = ks.centred_positions()
    if tc is None or ref.cpos is None or 8 * ref.tie_pos.size > ref.P:
        return _correlation(ref, lab, first, count, tc)
    # few ties in the reference: the plain ranks in one BLAS dot, plus the tie groups'
    # deviation from them where those elements sit in the frame's order. Ties that come from
    # duplicate rows are ties in every frame too, so they sit inside the frame's runs of equal
    # keys; any that do not (an accidental tie in the reference only) -> the general sum.
    labs = lab[runpos]
    j = np.searchsorted(ref.tie_pos, labs)
    j[j == ref.tie_pos.size] = 0
    hit = ref.tie_pos[j] == labs
    if int(np.count_nonzero(hit)) != ref.tie_pos.size:
        return _correlation(ref, lab, first, count, tc)
    labf = ks.float_buffer()
    np.copyto(labf, lab)
    main = float(np.dot(labf, tc))
    corr = float(np.dot(ref.tie_delta[j[hit]], tc[runpos[hit]]))
    return _correlation(ref, lab, first, count, tc, main=math.fsum([main, corr]))


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
        a: (U,) float64 ``w`` times the reference's centred average rank of the entry.
        P, m, S: as :class:`RankReference` (over the P pairs).
        self_ties: ``sum(w**3 - w)`` (int), the tie term of the entries on their own.
    """

    def __init__(self, ref: RankReference, gram: np.ndarray, w: np.ndarray,
                 cref: np.ndarray) -> None:
        self.P, self.m, self.S = ref.P, ref.m, ref.S
        self.gram = gram
        self.U = int(gram.size)
        self.w = w.astype(np.int64)
        self.a = self.w * cref
        self.self_ties = int(np.sum(self.w ** 3 - self.w))


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
    return WeightedReference(ref, gram, w, cref)


def weighted_keyed_spearman(wr: WeightedReference, ks: KeySorter,
                            values_of: Callable[[np.ndarray], np.ndarray]) -> float:
    """Spearman correlation over the P pairs from the int32 keys of the U distinct entries
    (``ks.keys[u]``: the key of entry ``wr.gram[u]``); ``values_of`` maps entry indices to the
    frame's exact float64 values (used inside runs of equal keys).

    Raises:
        ConstantVectorError: the frame's values are all equal.
    """
    lab, _, first, count = _sort_keys(ks, values_of)
    wp = wr.w[lab]
    cw = np.cumsum(wp)  # weight up to and including each sorted entry
    # centred average rank of each entry: (cw - w) + (w + 1) / 2 - m
    r = cw.astype(np.float64)
    r -= 0.5 * wp
    r += 0.5 - wr.m
    ap = wr.a[lab]
    parts = [float(np.dot(ap, r))]
    ties = wr.self_ties
    if first.size:  # distinct entries with exactly equal values: one tie group each
        positions, _ = _expand_groups(first, count)
        gid = np.repeat(np.arange(first.size), count)
        wpos = wp[positions]
        Wg = np.bincount(gid, weights=wpos).astype(np.int64)
        below = cw[first] - wp[first]
        centre = below + (Wg + 1) / 2.0 - wr.m
        parts.append(float(np.dot(ap[positions], centre[gid] - r[positions])))
        ties += int(np.sum(Wg ** 3 - Wg)) - int(np.sum(wpos ** 3 - wpos))
    P = wr.P
    S = P * (P * P - 1.0) / 12.0 - ties / 12.0
    return math.fsum(parts) / math.sqrt(wr.S * S)
