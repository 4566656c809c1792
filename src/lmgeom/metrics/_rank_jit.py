"""The compiled passes of :mod:`lmgeom.metrics._rank_kernel` (numba; imported only when the
kernel is first used, so ``import lmgeom`` never imports numba).

Every function is compiled with ``cache=True``, and the ones that call each other are
module-level functions that find each other as module globals. numba keys a cached function by
its bytecode *and the pickled contents of its closure cells*, and a compiled function in a
closure cell pickles with a fresh uuid in every process: when these were nested functions that
called each other, every ``lmgeom`` process compiled them again (a few seconds per process;
13-14 s from an empty cache; the cache folder grew by one entry per process). Only the radix passes stay closures: their cells hold
their digit's shift and mask, plain ints that pickle the same in every process.
"""

from __future__ import annotations

import numba as nb
import numpy as np

jit = nb.njit(cache=True, nogil=True, boundscheck=False)


def _make_pass(shift: int, mask: int):
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


def radix(shifts: tuple[int, ...], masks: tuple[int, ...]):
    """The histogram of every digit (as scatter offsets) and one scatter pass per digit; the
    shifts and masks are compiled-in constants (runtime shifts measured several times
    slower)."""
    R = len(shifts)

    @jit
    def offsets(keys, hist):
        hist[:] = 0
        for i in range(keys.size):
            k = keys[i]
            for r in range(R):
                hist[r, (k >> shifts[r]) & masks[r]] += 1
        for r in range(R):
            s = 0
            for b in range(hist.shape[1]):
                c = hist[r, b]
                hist[r, b] = s
                s += c

    return offsets, tuple(_make_pass(sh, mk) for sh, mk in zip(shifts, masks))


@jit
def keys_pass(src, gidx, payload, c0, c1, keys, vals):
    # keys of the values c0 + c1 src[gidx[t]] in order t (streaming reads) with their
    # payloads; values below 0 (float32 rows: cos 1 + 1 ulp) get key 0, of 4 or more the
    # top key (monotone; those runs are ordered by exact values); False on NaN
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
        vals[t] = payload[t]
    return ok


# --- exact integer sums past int64: acc[i] (hi) and acc[i + 1] (lo) hold hi * 2**32 + lo;
# every argument stays below 2**62 in magnitude

@jit
def add(acc, i, x):
    acc[i] += x >> 32
    acc[i + 1] += x & 0xFFFFFFFF
    if acc[i + 1] >= 0x4000000000000000:
        acc[i] += acc[i + 1] >> 32
        acc[i + 1] &= 0xFFFFFFFF


@jit
def mul_add(acc, i, a, x):
    # a * x for |a| < 2**62, |x| < 2**31: a = ah 2**31 + al, each partial product < 2**62
    add(acc, i, (a & 0x7FFFFFFF) * x)
    h = (a >> 31) * x  # adds h * 2**31 = (h >> 1) 2**32 + (h & 1) 2**31
    acc[i] += h >> 1
    add(acc, i, (h & 1) << 31)


# --- finish: order every run of equal keys by exact value and record the tie groups

@jit
def one_run(j, e, pos, src, fo, c0, c1, xs, ps):
    n = e - j
    for t in range(n):
        v = pos[j + t]
        xs[t] = c0 + c1 * np.float64(src[fo[v]])
        ps[t] = v
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
        xs[:n] = xs[:n][o]
        ps[:n] = ps[:n][o]
    for t in range(n):
        pos[j + t] = ps[t]


@jit
def finish(keys, pos, src, fo, c0, c1, xs, ps, gfirst, gcount):
    # returns the number of tie groups (first sorted position, size >= 2), -1 if constant
    P = keys.size
    ng = 0
    done = 0  # elements before this are finished
    for b0 in range(0, P - 1, 64):
        b1 = min(b0 + 64, P - 1)
        hits = 0
        for j in range(b0, b1):  # a vectorised count: most blocks hold no run
            hits += keys[j + 1] == keys[j]
        if hits == 0:
            continue
        for j in range(b0, b1):
            if j < done or keys[j + 1] != keys[j]:
                continue
            e = j + 2
            while e < P and keys[e] == keys[j]:
                e += 1
            one_run(j, e, pos, src, fo, c0, c1, xs, ps)
            t = 0
            while t < e - j:
                g = t + 1
                while g < e - j and xs[g] == xs[t]:
                    g += 1
                if g - t == P:
                    return -1
                if g - t > 1:
                    gfirst[ng] = j + t
                    gcount[ng] = g - t
                    ng += 1
                t = g
            done = e
    return ng


# --- the numerators: plain/general (one reference position per element) and weighted

@jit
def is_tied(v, cf2, tied):  # position v lies in one of the reference's tie groups
    return cf2.size > 0 and (tied[v >> 3] >> (v & 7)) & 1 == 1


@jit
def centred2(v, cf2, tied, P):  # twice the reference's centred rank at position v
    if is_tied(v, cf2, tied):
        return np.int64(cf2[v])
    return 2 * np.int64(v) + 1 - P


@jit
def numerator(pos, cf2, tied, general, gfirst, gcount, ng, acc):
    # acc[0:2] += 4 sum cf cg, acc[2:4] += sum(c**3 - c); general: the reference's tie
    # ranks everywhere, else only inside the frame's tie groups (valid when every tied
    # reference position lies in one); returns the tied positions met in the groups
    P = pos.size
    Pm1 = np.int64(1) - P
    step = max(1, (1 << 62) // (P * P))  # terms <= P**2: chunk sums stay below 2**62
    for c0 in range(0, P, step):
        s = np.int64(0)
        if general:
            for j in range(c0, min(P, c0 + step)):
                s += centred2(pos[j], cf2, tied, P) * (2 * np.int64(j) + Pm1)
        else:
            for j in range(c0, min(P, c0 + step)):
                s += (2 * np.int64(pos[j]) + Pm1) * (2 * np.int64(j) + Pm1)
        add(acc, 0, s)
    met = 0
    for g in range(ng):
        f = np.int64(gfirst[g])
        c = np.int64(gcount[g])
        S = np.int64(0)
        for q in range(c):
            v = pos[f + q]
            a = 2 * np.int64(v) + Pm1
            if is_tied(v, cf2, tied):
                met += 1
                S += cf2[v]
                if general:
                    a = np.int64(cf2[v])
            else:
                S += a
            add(acc, 0, -a * (2 * (f + q) + Pm1))
        mul_add(acc, 0, S, 2 * f + c - P)
        mul_add(acc, 2, c * c - 1, c)
    return met


@jit
def weighted(pos, w, a2, P, gfirst, gcount, ng, acc):
    # entries in the frame's order with multiplicities w and w * (twice the reference's
    # centred rank) a2: acc as numerator's, over the P pairs
    U = pos.size
    below = np.int64(0)
    g = 0
    j = 0
    while j < U:
        c = 1
        if g < ng and gfirst[g] == j:
            c = gcount[g]
            g += 1
        W = np.int64(0)
        S = np.int64(0)
        for q in range(j, j + c):
            W += w[pos[q]]
            S += a2[pos[q]]
        j += c
        mul_add(acc, 0, S, 2 * below + W - P)
        if W > 1:
            mul_add(acc, 2, W * W - 1, W)
        below += W
