"""Compiled (numba) Spearman of a frame's pair distances against a fixed reference, in one call.

The null loop ranks P = n(n-1)/2 distances per frame and level. :class:`SpearmanKernel` does
what :func:`~lmgeom.metrics._rank.keyed_spearman` does with torch's sort and numpy passes, in a
few compiled passes that release the GIL (so the null loop's worker threads run in parallel):

1. **keys, streamed**: pair ``t``'s value ``x_t = c0 + c1 * src[gidx[t]]`` (``src`` the flat
   scaled Gram matrix ``G' = -2**29 cos`` with ``c0 = 1, c1 = 2**-29``, so ``x = fl(1 - cos)``
   exactly, read in the pairs' own order; or a distance vector with ``c0 = 0, c1 = 1``) gives
   the int32 key ``trunc(2**29 x)`` (exact scaling: a power of two), a monotone function of
   the float64 value, carried with the pair's reference position;
2. **LSD radix sort** of (key, reference position): 3 passes of 11/10/10 bits, or 4 of 8 bits
   above 2**18 keys, where the smaller scatter fans stay in cache; each pass is compiled with
   its digit as a constant;
3. **the numerator, exactly**: twice a centred average rank is an integer (``2 r - P - 1``),
   so ``4 * sum_t cf_t cg_t`` is an int64 sum, bounded by ``P**3 < 2**63`` for
   ``P <= MAX_PAIRS``; one vectorised pass takes every position as ranked, then the runs of
   equal keys are ordered by their exact float64 values (the same values as the torch path),
   exact ties get average ranks, and their terms are replaced.

The result is independent of summation order and BLAS; it equals the torch path's to ~1e-16
in rho (tests: ``scipy.stats.spearmanr``, the 63-bit packed keys, the torch path in the null
loop). Values below 0 or of 4 and more are clamped to the end keys (still exact: those runs are
ordered by their values); a NaN makes it decline (``None``), so the caller falls back.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache

import numpy as np

__all__ = ["MAX_PAIRS", "SpearmanKernel", "kernel_available"]

log = logging.getLogger(__name__)

#: the int64 numerator is exact below this many pairs (n <= 2048 rows)
MAX_PAIRS = (1 << 21) - 1

_CONSTANT = 2


@lru_cache(maxsize=1)
def kernel_available() -> bool:
    """Whether the compiled kernel is used: numba imports and compiles it (checked once, on a
    small known case), and ``LMGEOM_RANK_KERNEL`` is not ``torch`` (which keeps the torch-sort
    path, e.g. to compare the two)."""
    from .._env import rank_kernel_enabled

    if not rank_kernel_enabled():
        return False
    try:
        import numba  # noqa: F401
    except ImportError:  # pragma: no cover - numba is a dependency
        return False
    try:
        ok = _self_check()
    except Exception as exc:  # noqa: BLE001 - a broken numba/LLVM: the torch path
        log.warning("compiled rank kernel unavailable (%s: %s); ranking with torch's sort",
                    type(exc).__name__, exc)
        return False
    if not ok:  # pragma: no cover - would be a kernel bug
        log.warning("compiled rank kernel failed its self-check; ranking with torch's sort")
    return ok


def _self_check() -> bool:
    """Spearman of (0.1, 0.3, 0.2, 0.2) against (1, 2, 3, 4) is 1 / sqrt(10): average ranks
    (1, 4, 2.5, 2.5), centred sums 1.5 / sqrt(5 * 4.5)."""
    kern = SpearmanKernel(4)
    P = 4
    posf = np.arange(P, dtype=np.int32)
    S_ref = P * (P * P - 1) / 12.0
    rho = kern.spearman(S_ref, np.array([0.1, 0.3, 0.2, 0.2]), np.arange(P), posf,
                        np.arange(P), 0.0, 1.0, np.empty(0, np.int32), np.empty(0, np.uint8))
    return isinstance(rho, float) and abs(rho - 1.0 / math.sqrt(10.0)) < 1e-15


def _make_pass(jit, shift: int, mask: int):
    """One LSD scatter pass on the digit ``(k >> shift) & mask`` (constants: compiled in)."""

    @jit
    def scatter(kin, vin, kout, vout, hist, r):
        for i in range(kin.size):
            k = kin[i]
            b = (k >> shift) & mask
            j = hist[r, b]
            hist[r, b] = j + 1
            kout[j] = k
            vout[j] = vin[i]

    return scatter


@lru_cache(maxsize=1)
def _compiled():
    import numba as nb

    jit = nb.njit(cache=True, nogil=True, boundscheck=False)

    @jit
    def keys_pass(src, gidx, posf, c0, c1, keys, vals):
        # keys of the values src[gidx[t]] in the pairs' own order (streaming reads) with their
        # reference positions as payload; False on NaN
        # values below 0 (float32 rows: cos 1 + 1 ulp) get key 0, values of 4 or more the top
        # key: clamping keeps the keys monotone, and those runs are ordered by exact values
        ok = True
        for t in range(gidx.size):
            y = (c0 + c1 * np.float64(src[gidx[t]])) * 536870912.0
            if y > -1.0 and y < 2147483648.0:
                keys[t] = np.int32(y)  # truncation toward zero, as numpy's unsafe cast
            elif y <= -1.0:
                keys[t] = 0
            elif y >= 2147483648.0:
                keys[t] = 2147483647
            else:  # NaN: no order
                keys[t] = 0
                ok = False
            vals[t] = posf[t]
        return ok

    # the digit histograms of the two radix layouts, written out with literal shifts and
    # masks: a loop over the digits with runtime shifts measured several times slower
    @jit
    def hist3(keys, hist):
        hist[:] = 0
        for i in range(keys.size):
            k = keys[i]
            hist[0, k & 2047] += 1
            hist[1, (k >> 11) & 1023] += 1
            hist[2, (k >> 21) & 1023] += 1

    @jit
    def hist4(keys, hist):
        hist[:] = 0
        for i in range(keys.size):
            k = keys[i]
            hist[0, k & 255] += 1
            hist[1, (k >> 8) & 255] += 1
            hist[2, (k >> 16) & 255] += 1
            hist[3, (k >> 24) & 255] += 1

    @jit
    def offsets(hist):
        for r in range(hist.shape[0]):
            s = 0
            for b in range(hist.shape[1]):
                c = hist[r, b]
                hist[r, b] = s
                s += c

    passes3 = (_make_pass(jit, 0, 2047), _make_pass(jit, 11, 1023), _make_pass(jit, 21, 1023))
    passes4 = tuple(_make_pass(jit, sh, 255) for sh in (0, 8, 16, 24))

    @jit
    def plain_sum(pos, cf2, tied, P, general):
        # sum over sorted positions j of 2cf(pos_j) * (2j + 1 - P), every run taken as ranked:
        # 2cf(v) = 2v + 1 - P, and (general) cf2[v] at the reference's tie positions (bit v
        # of tied)
        Pm1 = np.int64(1) - P
        num = np.int64(0)
        if not general:
            for j in range(P):
                num += (2 * np.int64(pos[j]) + Pm1) * (2 * np.int64(j) + Pm1)
        else:
            for j in range(P):
                v = pos[j]
                a = cf2[v] if (tied[v >> 3] >> (v & 7)) & 1 else 2 * np.int64(v) + Pm1
                num += a * (2 * np.int64(j) + Pm1)
        return num

    @jit
    def one_run(j, keys, pos, src, fo, c0, c1, cf2, tied, general, xs, ps, acc):
        # the run of equal keys starting at j: replace its terms in plain_sum (general or
        # not) by the exact order's (exact values src[fo[v]] of reference position v) with
        # average ranks over exact ties; acc = [numerator correction, ties sum(c**3 - c),
        # status, reference tie positions met]; returns the run's end
        P = keys.size
        plain = cf2.size == 0
        Pm1 = np.int64(1) - P
        e = j + 2
        while e < P and keys[e] == keys[j]:
            e += 1
        n = e - j
        corr = np.int64(0)
        for t in range(n):
            v = pos[j + t]
            xs[t] = c0 + c1 * np.float64(src[fo[v]])
            ps[t] = v
            a = 2 * np.int64(v) + Pm1
            if not plain and (tied[v >> 3] >> (v & 7)) & 1:
                acc[3] += 1
                if general:
                    a = cf2[v]
            corr -= a * (2 * np.int64(j + t) + Pm1)
        if n <= 32:  # insertion sort (runs are short: 2-3 keys typically)
            for t in range(1, n):
                x = xs[t]
                v = ps[t]
                u = t - 1
                while u >= 0 and xs[u] > x:
                    xs[u + 1] = xs[u]
                    ps[u + 1] = ps[u]
                    u -= 1
                xs[u + 1] = x
                ps[u + 1] = v
        else:
            o = np.argsort(xs[:n], kind="mergesort")
            xo = xs[:n][o]
            po = ps[:n][o]
            xs[:n] = xo
            ps[:n] = po
        t = 0
        while t < n:
            g = t + 1
            while g < n and xs[g] == xs[t]:
                g += 1
            c = g - t
            if c == P:
                acc[2] = 2  # _CONSTANT
                return P
            f = np.int64(j + t)
            s = np.int64(0)
            for q in range(t, g):
                v = np.int64(ps[q])
                s += (2 * v + Pm1) if plain else cf2[v]
            corr += s * (2 * f + c - P)
            if c > 1:
                cc = np.int64(c)
                acc[1] += cc * cc * cc - cc
            t = g
        acc[0] += corr
        return e

    @jit
    def fix_runs(keys, pos, src, fo, c0, c1, cf2, tied, general, xs, ps, acc):
        # every run of equal keys (one_run); acc as there, zeroed first
        P = keys.size
        acc[:] = 0
        done = 0  # elements before this are finished
        for b0 in range(0, P - 1, 64):
            b1 = min(b0 + 64, P - 1)
            hits = 0
            for j in range(b0, b1):  # a vectorised count: most blocks hold no run
                hits += keys[j + 1] == keys[j]
            if hits == 0:
                continue
            for j in range(b0, b1):
                if j >= done and keys[j + 1] == keys[j]:
                    done = one_run(j, keys, pos, src, fo, c0, c1, cf2, tied, general, xs,
                                   ps, acc)
                    if acc[2] != 0:
                        return

    return keys_pass, hist3, hist4, offsets, passes3, passes4, plain_sum, fix_runs


class SpearmanKernel:
    """Buffers of one worker thread for :meth:`spearman` on vectors of P pairs."""

    def __init__(self, P: int) -> None:
        if not 2 <= P <= MAX_PAIRS:
            raise ValueError(f"SpearmanKernel handles 2..{MAX_PAIRS} pairs, got {P}")
        self.P = int(P)
        #: 3 passes (11/10/10 bits) while the scatter targets stay in cache, else 4 x 8 bits
        self.four = P > (1 << 18)
        self.hist = np.zeros((4, 256) if self.four else (3, 2048), dtype=np.int64)
        self.kA = np.empty(P, dtype=np.int32)
        self.kB = np.empty(P, dtype=np.int32)
        self.vA = np.empty(P, dtype=np.int32)
        self.vB = np.empty(P, dtype=np.int32)
        self.xs = np.empty(P, dtype=np.float64)  # one run at a time (at most P)
        self.ps = np.empty(P, dtype=np.int32)
        self.out = np.zeros(4, dtype=np.int64)

    def iota(self) -> np.ndarray:
        """``arange(P)`` as int64 (the identity ``gidx``), computed once."""
        io = getattr(self, "_iota", None)
        if io is None:
            io = self._iota = np.arange(self.P, dtype=np.int64)
        return io

    def numerator(self, src: np.ndarray, gidx: np.ndarray, posf: np.ndarray,
                  fo: np.ndarray, c0: float, c1: float, cf2: np.ndarray,
                  tied: np.ndarray, n_tied: int | None = None) -> tuple[int, int] | str | None:
        """``(4 * sum cf cg, sum(c**3 - c))`` of the frame whose value at pair ``t`` is
        ``c0 + c1 * src[gidx[t]]``.

        Args:
            src: flat float array the values are read from.
            gidx: (P,) int64, where pair t's value lies in ``src`` (streamed in this order).
            posf: (P,) int32, pair t's position in the reference's sorted order.
            fo: (P,) int64 ``gidx[order]``: where the value at reference position v lies
                (read only inside runs of equal keys).
            cf2: (P,) int32, twice the reference's centred average ranks by position (empty:
                no ties, ``2 v + 1 - P``).
            tied: uint8 bitmap (``np.packbits(..., bitorder="little")``, P bits: it stays in L1)
                of the positions inside the reference's tie groups, where ``cf2`` differs from
                ``2 v + 1 - P``; ignored when ``cf2`` is empty.
            n_tied: the number of set bits of ``tied`` (counted when not given).

        Returns:
            ``None`` when a value is NaN (the caller takes the general path), ``"constant"``
            when the values are all equal. Values below 0 or of 4 and more share the lowest /
            highest key and are ordered exactly like any run.
        """
        keys_pass, hist3, hist4, offsets, passes3, passes4, plain_sum, fix_runs = _compiled()
        kA, kB, vA, vB, hist = self.kA, self.kB, self.vA, self.vB, self.hist
        if not keys_pass(src, gidx, posf, c0, c1, kA, vA):
            return None
        (hist4 if self.four else hist3)(kA, hist)
        offsets(hist)
        bufs = ((kA, vA), (kB, vB))
        for r, scatter in enumerate(passes4 if self.four else passes3):
            (ki, vi), (ko, vo) = bufs[r % 2], bufs[1 - r % 2]
            scatter(ki, vi, ko, vo, hist, r)
        keys, pos = bufs[len(hist) % 2]
        # first as if the reference had no ties: its tie groups (duplicate rows) are runs of
        # exact ties in every frame too, so fix_runs finishes them; if any tie position lies
        # outside the frame's runs, everything again with the tie-aware terms
        if not cf2.size:
            n_tied = 0
        elif n_tied is None:
            n_tied = int(np.unpackbits(tied).sum())
        for general in (False, True):
            num = int(plain_sum(pos, cf2, tied, self.P, general))
            fix_runs(keys, pos, src, fo, c0, c1, cf2, tied, general, self.xs, self.ps,
                     self.out)
            if self.out[2] == _CONSTANT:
                return "constant"
            if general or int(self.out[3]) == n_tied:
                break
        return num + int(self.out[0]), int(self.out[1])

    def spearman(self, S_ref: float, src: np.ndarray, gidx: np.ndarray, posf: np.ndarray,
                 fo: np.ndarray, c0: float, c1: float, cf2: np.ndarray,
                 tied: np.ndarray, n_tied: int | None = None) -> float | str | None:
        """Spearman rho against a reference with sum of squared centred ranks ``S_ref``;
        ``None`` / ``"constant"`` as :meth:`numerator`."""
        got = self.numerator(src, gidx, posf, fo, c0, c1, cf2, tied, n_tied)
        if got is None or isinstance(got, str):
            return got
        num, ties = got
        P = self.P
        S = (P * (P * P - 1) - ties) / 12.0  # exact integers: no cancellation with big ties
        return (num / 4.0) / math.sqrt(S_ref * S)
