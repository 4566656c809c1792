"""Null-loop runners for the pairwise-distance / Spearman machinery (numpy CPU, torch device).

A *worker* owns the buffers needed to evaluate one frame: project the unique rows, normalise,
fill the pair-distance vector, rank it against a reference. :class:`Runner` hands frames to
one or more workers (threads: numpy's sort, ufuncs and gathers release the GIL; BLAS is then
limited to one thread per worker) and returns results in submission order, so results do not
depend on scheduling.

Ranking: the CPU worker ranks each frame's pair distances through the compiled kernel of
:mod:`~lmgeom.metrics._rank_kernel` (numba; exact integer numerator), else through int32 keys
and torch's radix sort, else 63-bit packed keys (:mod:`~lmgeom.metrics._rank`); all three give
the same correlations (tests: to 1e-13, and against scipy). ``LMGEOM_RANK_KERNEL=torch`` keeps
the torch path.

Precision: everything is float64. The torch runner (``device="cuda"`` etc.) computes Gram
matrices with the device BLAS, whose rounding differs from the CPU's at the 1e-16 level; this
moves Spearman values by ~1e-13, i.e. PGA z agrees with the CPU result to ~1e-9.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import queue
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import numpy as np

from lmgeom.metrics._common import config_error, data_error
from lmgeom.metrics._pairs import (
    ZERO_RTOL,
    Layout,
    gram_regions,
    pair_distances,
    unit_rows,
    zero_rows_error,
)
from lmgeom.metrics._rank import (
    KEY_SCALE,
    ConstantVectorError,
    KeySorter,
    RankReference,
    Sorter,
    WeightedReference,
    keyed_available,
    keyed_spearman,
    scaled_cosine_keys,
    spearman_to_reference,
    weighted_keyed_spearman,
)
from lmgeom.metrics._rank_kernel import MAX_PAIRS, SpearmanKernel, kernel_available

log = logging.getLogger(__name__)

__all__ = ["Runner", "make_runner"]

_PARALLEL_MIN_PAIRS = 20_000


class NumpyWorker:
    """CPU worker: numpy/BLAS in float64."""

    def __init__(self, P: int, label: str | None) -> None:
        self.P = P
        self.label = label
        self.sorter = Sorter(P)
        self._d: dict[int, np.ndarray] = {}
        self._lv: dict[int, list[np.ndarray]] = {}
        self._g: np.ndarray = np.empty(0)
        self._gfull = np.empty((0, 0))
        self._kfull = np.empty((0, 0), dtype=np.int32)
        self._keys: dict[int, KeySorter] = {}
        self._kern: dict[int, SpearmanKernel] = {}
        self._gsyrk = np.empty((0, 0), order="F")
        self._dk = np.empty(0)

    def asarray(self, A: np.ndarray) -> np.ndarray:
        return A

    def project(self, Xu: np.ndarray, Q: np.ndarray | None, *, scale: float, what: str) -> np.ndarray:
        """Unit rows of ``Xu @ Q`` (of Xu itself when Q is None), in Xu's dtype."""
        if Q is None:
            Y = np.array(Xu, order="C", copy=True)
        else:
            Y = Xu @ Q.astype(Xu.dtype, copy=False)
        return unit_rows(Y, scale=scale, what=what, label=self.label)

    # batched null frames (subspace_pga_levels): one GEMM for a batch of frames, then each
    # CCR level's rows from the top level's by a float64 rank correction
    def backend(self, Xtop: np.ndarray, T: np.ndarray | None, Ptop: np.ndarray | None) -> tuple:
        return Xtop, T, Ptop

    def project_batch(self, be: tuple, chunk: list[np.ndarray]) -> tuple:
        """``(Xtop @ [Q_1 .. Q_B], Ptop @ [Q_1 .. Q_B])`` for a batch of (d, k) frames."""
        Xtop, _T, Ptop = be
        Qc = np.concatenate(chunk, axis=1)
        Yc = Xtop @ Qc.astype(Xtop.dtype, copy=False)
        return Yc, (None if Ptop is None else Ptop @ Qc)

    def level_rows(self, be: tuple, Yc: np.ndarray, PQ: np.ndarray | None, b: int, k: int,
                   m: int, mt: int, fdt: type, *, scale: float, what: str) -> np.ndarray:
        """Unit rows of frame b's projection at CCR level m (the batch is at level mt)."""
        Yb = Yc[:, b * k:(b + 1) * k]
        if m == mt:
            Y = np.array(Yb, order="C")
        else:
            Y = Yb + be[1][:, m:mt] @ PQ[m:mt, b * k:(b + 1) * k]
            if Y.dtype != fdt:
                Y = Y.astype(fdt)
        return unit_rows(Y, scale=scale, what=what, label=self.label)

    def _updates(self, be: tuple, Yc: np.ndarray, PQ: np.ndarray | None, b: int, k: int,
                 ms: list[int], mt: int, scales: list[float], what: str) -> tuple:
        """Frame b's top-level rows Y_t, and per level (1 / row norms of Y_m, (L, R) or None)."""
        Yt = np.ascontiguousarray(Yc[:, b * k:(b + 1) * k])
        Yt64 = Yt if Yt.dtype == np.float64 else Yt.astype(np.float64)
        upd = []
        for m, scale in zip(ms, scales):
            if m == mt:
                Ym, LR = Yt64, None
            else:
                A = be[1][:, m:mt]
                Bm = PQ[m:mt, b * k:(b + 1) * k]
                Ym = Yt64 + A @ Bm
                U = Yt64 @ Bm.T
                U += A @ (0.5 * (Bm @ Bm.T))
                LR = (np.hstack([U, A]), np.hstack([A, U]))
            norms = np.sqrt(np.einsum("ij,ij->i", Ym, Ym))
            bad = np.flatnonzero(~(norms > ZERO_RTOL * scale))
            if bad.size:
                raise zero_rows_error(bad, Ym.shape[0], what, self.label)
            upd.append((1.0 / norms, LR))
        return Yt, upd

    def _unit_levels(self, be: tuple, Yc: np.ndarray, PQ: np.ndarray | None, b: int, k: int,
                     ms: list[int], mt: int, scales: list[float], what: str) -> list[np.ndarray]:
        """Frame b's unit rows at every level in ``ms``: Y_m = Y_t + A B_m (A the n x r PC
        coefficients, B_m the projected directions of levels m..mt), as :func:`unit_rows`;
        float64 (float32 when the batch is)."""
        Yt = Yc[:, b * k:(b + 1) * k]
        out = []
        for m, scale in zip(ms, scales):
            if m == mt:
                Ym = np.array(Yt, order="C")
            else:
                Ym = be[1][:, m:mt] @ PQ[m:mt, b * k:(b + 1) * k]
                if Ym.dtype != Yt.dtype:
                    Ym = Ym.astype(Yt.dtype)
                Ym += Yt
            out.append(unit_rows(Ym, scale=scale, what=what, label=self.label))
        return out

    def frame_rhos(self, be: tuple, Yc: np.ndarray, PQ: np.ndarray | None, b: int, k: int,
                   ms: list[int], mt: int, layout: Layout, scales: list[float],
                   refs: list[RankReference | WeightedReference], fos: list[np.ndarray],
                   what: str, gidx: np.ndarray | None = None) -> list[float]:
        """Spearman of frame b against each level's reference (exact layouts that read one
        square Gram matrix, :func:`~lmgeom.metrics._pairs.gram_index`), with no distance
        vector. Per level the Gram matrix of the unit rows is ranked by

        * the compiled kernel (:mod:`~lmgeom.metrics._rank_kernel`; ``gidx`` given, numba
          present): one SYRK of the unit rows (:meth:`_kernel_gram`) fills the cosines that
          ``gidx`` reads, the kernel streams keys ``trunc(2**29 (1 - cos))`` from them in
          pair order, radix-sorts them with their reference positions and sums the numerator
          exactly;
        * else one GEMM per row block of the rows pre-scaled by ``-2**29`` (exact: a power of
          two) fills the lower trapezoids of ``G' = -2**29 cos``, one pass turns each into
          int32 keys ``trunc(2**29 + G')`` while it is in cache, the keys are gathered into
          the reference's order (``fos[j]`` = the Gram index of each reference position) and
          sorted by torch.

        Runs of equal keys are finished with the exact distances ``fl(1 - cos)`` either way
        (``1 + G'/2**29`` is the same float). A :class:`WeightedReference` (many duplicate
        rows) reads each distinct Gram entry once (``fos[j]`` its entries; torch path)."""
        Ys = self._unit_levels(be, Yc, PQ, b, k, ms, mt, scales, what)
        rhos = []
        for Y, ref, fo in zip(Ys, refs, fos):
            rho = None
            if (gidx is not None and not isinstance(ref, WeightedReference)
                    and self._kernel_applies(ref.P)):
                cos = self._kernel_gram(Y, layout)  # distance fl(1 - cos): c0 = 1, c1 = -1
                rho = self._kernel_spearman(ref, cos, gidx, fo, 1.0, -1.0, what)
            if rho is None:
                rho = self._torch_keyed_rho(Y, ref, fo, layout, what)
            rhos.append(rho)
        return rhos

    def _kernel_gram(self, Y: np.ndarray, layout: Layout) -> np.ndarray:
        """The cosines ``Y Y^T`` of the unit rows where :func:`~lmgeom.metrics._pairs.
        gram_index` reads them, as a flat array: one BLAS SYRK into a column-major buffer
        (its upper triangle lies where a row-major lower triangle would), called through
        ctypes so the GIL is released (scipy.linalg.blas's wrappers hold it); else one numpy
        GEMM per row block on the row-major lower trapezoids. Unique-row layouts get a
        diagonal of exactly 1 (identical rows)."""
        Y = np.ascontiguousarray(Y)
        n = Y.shape[0]
        syrk = _syrk_functions()
        fn = syrk.get(Y.dtype.str) if syrk else None
        C = self._gsyrk
        if C.shape[0] != n or C.dtype != Y.dtype or (fn is None) != C.flags.c_contiguous:
            C = self._gsyrk = np.zeros((n, n), dtype=Y.dtype, order="C" if fn is None else "F")
        if fn is not None:
            fn(Y, C)
            flat = C.reshape(-1, order="F")
        else:
            for r0, r1 in gram_regions(layout):
                np.matmul(Y[r0:r1], Y[:r1].T, out=C[r0:r1, :r1])
            flat = C.reshape(-1)
        if layout.pair_map is not None:
            flat[:: n + 1] = 1.0
        return flat

    def _torch_keyed_rho(self, Y: np.ndarray, ref: RankReference | WeightedReference,
                         fo: np.ndarray, layout: Layout, what: str) -> float:
        """One level of :meth:`frame_rhos` through int32 keys and torch's sort (``Y``: the
        level's unit rows, one per row of the Gram matrix)."""
        n_g, gdt = Y.shape[0], Y.dtype
        neg = gdt.type(-KEY_SCALE)
        if self._gfull.shape[0] != n_g or self._gfull.dtype != gdt:
            self._gfull = np.empty((n_g, n_g), dtype=gdt)
            self._kfull = np.empty((n_g, n_g), dtype=np.int32)
        G, K = self._gfull, self._kfull
        Gflat, Kflat = G.ravel(), K.ravel()
        Yn = Y * neg
        for r0, r1 in gram_regions(layout):
            Gb = G[r0:r1, :r1]
            np.matmul(Yn[r0:r1], Y[:r1].T, out=Gb)
            if layout.pair_map is not None:  # identical rows: cos exactly 1
                Gflat[r0 * (n_g + 1):r1 * (n_g + 1):n_g + 1] = neg
            scaled_cosine_keys(Gb, K[r0:r1, :r1])
        ks = self._key_sorter(fo.size)
        np.take(Kflat, fo, out=ks.keys)
        rank = weighted_keyed_spearman if isinstance(ref, WeightedReference) else keyed_spearman
        try:
            return rank(ref, ks, lambda x: 1.0 + Gflat[fo[x]].astype(np.float64) / KEY_SCALE)
        except ConstantVectorError:
            raise _constant(what, self.label) from None

    def frame_levels(self, be: tuple, Yc: np.ndarray, PQ: np.ndarray | None, b: int, k: int,
                     ms: list[int], mt: int, layout: Layout, scales: list[float],
                     what: str) -> list[np.ndarray]:
        """Pair distances of frame b at every level in ``ms`` (exact layouts without
        duplicates), from one Gram matrix of the top level's projection Y_t: with
        Y_m = Y_t + A B (A the n x r PC coefficients, B the r x k projected directions),
        ``Y_m Y_m^T = Y_t Y_t^T + L R^T``, L = [U + A M/2, A], R = [A, U + A M/2], U = Y_t B^T,
        M = B B^T: a rank-2r update in float64, scaled by the exact row norms of Y_m."""
        Yt, upd = self._updates(be, Yc, PQ, b, k, ms, mt, scales, what)
        outs = self._lv.get(len(ms))
        if outs is None or outs[0].size != layout.n_pairs:
            outs = self._lv[len(ms)] = [np.empty(layout.n_pairs) for _ in ms]
        if self._g.size < layout.max_block:
            self._g = np.empty(layout.max_block)
        if layout.pair_map is not None:  # duplicate rows: one Gram of the unique rows
            nu = layout.n_unique
            blocks = [(0, nu, 0, layout.n_pairs, layout.pair_map)]
        else:
            blocks = [(b.r0, b.r1, b.s0, b.s1, b.flat_tri) for b in layout.blocks]
        for r0, r1, s0, s1, flat in blocks:
            w = r1 - r0
            Gt = Yt[r0:r1] @ Yt[:r1].T
            G = self._g[: w * r1].reshape(w, r1)
            for (inv, LR), out in zip(upd, outs):
                if LR is None:
                    np.copyto(G, Gt)
                else:
                    np.matmul(LR[0][r0:r1], LR[1][:r1].T, out=G)
                    G += Gt
                G *= inv[r0:r1, None]
                G *= inv[None, :r1]
                if layout.pair_map is not None:
                    G.ravel()[:: r1 + 1] = 1.0  # identical rows: cos exactly 1
                np.take(G.ravel(), flat, out=out[s0:s1])
        for out in outs:
            np.subtract(1.0, out, out=out)
        return outs

    def distances(self, layout: Layout, Yu: np.ndarray, slot: int = 0) -> np.ndarray:
        out = self._d.get(slot)
        if out is None or out.size != layout.n_pairs:
            out = self._d[slot] = np.empty(layout.n_pairs)
        if self._g.size < layout.max_block:
            self._g = np.empty(layout.max_block)
        return pair_distances(layout, Yu, out, self._g)

    def reference(self, d: np.ndarray, what: str) -> RankReference:
        try:
            return RankReference(d, self.sorter)
        except ConstantVectorError:
            raise _constant(what, self.label) from None

    def spearman(self, ref: RankReference, d: np.ndarray, what: str) -> float:
        """Spearman of the distance vector ``d`` against the reference (sampled pairs, the
        readout): int32 keys ``trunc(2**29 d)`` ranked by the compiled kernel
        (:mod:`~lmgeom.metrics._rank_kernel`), else gathered into the reference's order and
        sorted by torch's radix sort, else the 63-bit packed keys."""
        try:
            if d.dtype == np.float64 and d.size == ref.P:
                rho = self._kernel_spearman(ref, d, None, ref.order_index(), 0.0, 1.0, what)
                if rho is not None:
                    return rho
                if keyed_available() and ref.P < (1 << 31):
                    return self._keyed_spearman(ref, d)
            return spearman_to_reference(ref, d, self.sorter)
        except ConstantVectorError:
            raise _constant(what, self.label) from None

    @staticmethod
    def _kernel_applies(P: int) -> bool:
        return 2 <= P <= MAX_PAIRS and kernel_available()

    def _kernel_spearman(self, ref: RankReference, src: np.ndarray, gidx: np.ndarray | None,
                         fo: np.ndarray, c0: float, c1: float, what: str) -> float | None:
        """Spearman through the compiled kernel (:mod:`~lmgeom.metrics._rank_kernel`) of the
        frame whose value at pair t is ``c0 + c1 * src[gidx[t]]`` (``gidx`` None: ``src[t]``;
        ``fo = gidx[ref.order]``); ``None`` where the kernel does not apply (no numba, too
        many pairs, a NaN)."""
        P = ref.P
        if not self._kernel_applies(P):
            return None
        kern = self._kern.get(P)
        if kern is None:
            kern = self._kern[P] = SpearmanKernel(P)
        if gidx is None:
            gidx = kern.iota()
        rho = kern.spearman(ref.S, src, gidx, ref.positions32(), fo, c0, c1,
                            *ref.centred2(), n_tied=int(ref.tie_pos.size))
        if isinstance(rho, str):
            raise _constant(what, self.label)
        return rho

    def _key_sorter(self, P: int) -> KeySorter:
        ks = self._keys.get(P)
        if ks is None:
            ks = self._keys[P] = KeySorter(P)
        return ks

    def _keyed_spearman(self, ref: RankReference, d: np.ndarray) -> float:
        P = ref.P
        ks = self._key_sorter(P)
        if self._dk.size != P:
            self._dk = np.empty(P)
        order = ref.order_index()
        tmp = self._dk
        np.take(d, order, out=tmp)  # the frame's distances in the reference's order
        tmp *= KEY_SCALE  # exact (a power of two): keys are a monotone function of d
        np.copyto(ks.keys, tmp, casting="unsafe")
        return keyed_spearman(ref, ks, lambda x: d[order[x]])


@functools.lru_cache(maxsize=1)
def _syrk_functions() -> dict[str, Callable[[np.ndarray, np.ndarray], None]] | None:
    """``dtype.str -> fn(Y, C)``: ``C[upper] = Y Y^T`` for C-contiguous (n, k) ``Y`` and an
    F-ordered (n, n) ``C``, by BLAS ``?syrk`` from scipy's Cython BLAS (the same library
    scipy.linalg uses), called through ctypes, which releases the GIL during the call, so
    worker threads overlap. None when that is unavailable (numpy GEMMs are used then)."""
    try:
        import ctypes

        from numba.extending import get_cython_function_address

        ptr, ci = ctypes.POINTER, ctypes.c_int
        out = {}
        for name, dt, cf in (("dsyrk", "<f8", ctypes.c_double), ("ssyrk", "<f4", ctypes.c_float)):
            proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ptr(ci), ptr(ci),
                                     ptr(cf), ctypes.c_void_p, ptr(ci), ptr(cf),
                                     ctypes.c_void_p, ptr(ci))
            f = proto(get_cython_function_address("scipy.linalg.cython_blas", name))

            def call(Y: np.ndarray, C: np.ndarray, f=f, cf=cf) -> None:
                n, k = Y.shape
                nn, kk, one, zero = ci(n), ci(k), cf(1.0), cf(0.0)
                # Fortran view: A = Y^T is (k, n), lda = k; C = A^T A = Y Y^T (upper)
                f(b"U", b"T", ctypes.byref(nn), ctypes.byref(kk), ctypes.byref(one),
                  Y.ctypes.data, ctypes.byref(kk), ctypes.byref(zero), C.ctypes.data,
                  ctypes.byref(nn))

            out[dt] = call
        return out
    except Exception:  # noqa: BLE001 - any failure: the numpy GEMM path
        return None


def _constant(what: str, label: str | None) -> Exception:
    return data_error(
        f"all pairwise distances are equal {what}, so their Spearman correlation is undefined "
        "(are the rows all identical up to scale?)",
        label,
    )


class TorchWorker:
    """Device worker (torch, float64): Gram matrices, sort and ranks on ``device``."""

    def __init__(self, P: int, device: Any, label: str | None) -> None:
        import torch

        self.torch = torch
        self.P = P
        self.device = device
        self.label = label
        self._cache: dict[int, Any] = {}

    def asarray(self, A: np.ndarray) -> Any:
        key = id(A)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is A:
            return hit[1]
        t = self.torch.as_tensor(np.ascontiguousarray(A), dtype=self.torch.float64, device=self.device)
        self._cache[key] = (A, t)
        return t

    def project(self, Xu: np.ndarray, Q: np.ndarray | None, *, scale: float, what: str) -> Any:
        torch = self.torch
        Xt = self.asarray(Xu)
        # torch.tensor copies: cached null frames are read-only numpy arrays (shared across calls)
        Y = Xt.clone() if Q is None else Xt @ torch.tensor(Q, dtype=torch.float64, device=self.device)
        norms = torch.linalg.vector_norm(Y, dim=1)
        bad = torch.nonzero(~(norms > ZERO_RTOL * scale)).flatten()
        if bad.numel():
            raise zero_rows_error(bad.cpu().numpy(), Y.shape[0], what, self.label)
        return Y / norms[:, None]

    def backend(self, Xtop: np.ndarray, T: np.ndarray | None, Ptop: np.ndarray | None) -> tuple:
        torch = self.torch

        def t(a: Any) -> Any:
            if a is None:
                return None
            return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64,
                                   device=self.device)

        return t(Xtop), t(T), t(Ptop)

    def project_batch(self, be: tuple, chunk: list[np.ndarray]) -> tuple:
        torch = self.torch
        Qc = torch.as_tensor(np.concatenate(chunk, axis=1), dtype=torch.float64,
                             device=self.device)
        return be[0] @ Qc, (None if be[2] is None else be[2] @ Qc)

    def level_rows(self, be: tuple, Yc: Any, PQ: Any, b: int, k: int, m: int, mt: int,
                   fdt: type, *, scale: float, what: str) -> Any:
        Y = Yc[:, b * k:(b + 1) * k]
        if m != mt:
            Y = Y + be[1][:, m:mt] @ PQ[m:mt, b * k:(b + 1) * k]
        norms = self.torch.linalg.vector_norm(Y, dim=1)
        bad = self.torch.nonzero(~(norms > ZERO_RTOL * scale)).flatten()
        if bad.numel():
            raise zero_rows_error(bad.cpu().numpy(), Y.shape[0], what, self.label)
        return Y / norms[:, None]

    def _layout_tensors(self, layout: Layout) -> dict:
        key = str(self.device)
        c = layout._torch_cache.get(key)
        if c is not None:
            return c
        torch = self.torch

        def T(a: Any) -> Any:
            if a is None:
                return None
            dt = torch.bool if a.dtype == bool else torch.int64
            return torch.as_tensor(np.asarray(a), dtype=dt, device=self.device)

        c = {
            "blocks": [
                {
                    "r0": b.r0, "r1": b.r1, "s0": b.s0, "s1": b.s1,
                    "mask": T(b.mask), "uu": T(b.uu), "uinv": T(b.uinv),
                    "cols": T(b.cols), "flat": T(b.flat),
                }
                for b in layout.blocks
            ],
            "a": T(layout.a), "b": T(layout.b), "expand": T(layout.expand), "same": T(layout.same),
        }
        layout._torch_cache[key] = c
        return c

    def distances(self, layout: Layout, Yu: Any, slot: int = 0) -> Any:
        torch = self.torch
        c = self._layout_tensors(layout)
        out = torch.empty(layout.n_pairs, dtype=torch.float64, device=self.device)
        kind = layout.kind
        if kind in ("tri", "tri_dup"):
            for b in c["blocks"]:
                if kind == "tri":
                    G = Yu[b["r0"]:b["r1"]] @ Yu[: b["r1"]].T
                else:
                    uu = b["uu"]
                    Gu = Yu[uu] @ Yu.T
                    Gu[torch.arange(uu.numel(), device=self.device), uu] = 1.0
                    G = Gu[b["uinv"]][:, b["cols"]]
                out[b["s0"]:b["s1"]] = G[b["mask"]]
        else:
            L = int(layout.a.size)
            tmp = out if c["expand"] is None else torch.empty(L, dtype=torch.float64, device=self.device)
            if kind == "gram":
                for b in c["blocks"]:
                    if b["s1"] == b["s0"]:
                        continue
                    G = Yu[b["r0"]:b["r1"]] @ Yu[: b["r1"]].T
                    tmp[b["s0"]:b["s1"]] = G.reshape(-1)[b["flat"]]
            else:
                a, bb = c["a"], c["b"]
                step = 1 << 16
                for c0 in range(0, L, step):
                    tmp[c0:c0 + step] = (Yu[a[c0:c0 + step]] * Yu[bb[c0:c0 + step]]).sum(1)
            if c["expand"] is not None:
                out = tmp[c["expand"]]
        out = 1.0 - out
        if c["same"] is not None and c["same"].numel():
            out[c["same"]] = 0.0
        return out

    def _ranks_sorted(self, vals: Any) -> tuple[Any, float]:
        """Centred average ranks at each sorted position, and the tie term sum(t^3 - t)/12."""
        torch = self.torch
        P = vals.numel()
        m = (P + 1) / 2.0
        new = torch.ones(P, dtype=torch.bool, device=self.device)
        new[1:] = vals[1:] != vals[:-1]
        if bool(new.all()):
            return torch.arange(P, dtype=torch.float64, device=self.device) + (1.0 - m), 0.0
        gid = torch.cumsum(new.to(torch.int64), 0) - 1
        counts = torch.bincount(gid)
        ends = torch.cumsum(counts, 0)
        starts = ends - counts
        avg = (starts + 1 + ends).to(torch.float64) / 2.0
        cf = counts.to(torch.float64)
        return avg[gid] - m, float((cf ** 3 - cf).sum()) / 12.0

    def reference(self, d: Any, what: str) -> tuple[Any, float]:
        torch = self.torch
        vals, idx = torch.sort(d)
        if not bool(vals[-1] > vals[0]):
            raise _constant(what, self.label)
        r, tie = self._ranks_sorted(vals)
        cf = torch.empty_like(r)
        cf[idx] = r
        P = d.numel()
        return cf, P * (P * P - 1.0) / 12.0 - tie

    def spearman(self, ref: tuple[Any, float], d: Any, what: str) -> float:
        torch = self.torch
        cf, S_ref = ref
        vals, idx = torch.sort(d)
        if not bool(vals[-1] > vals[0]):
            raise _constant(what, self.label)
        r, tie = self._ranks_sorted(vals)
        P = d.numel()
        num = float(torch.dot(cf[idx], r))
        return num / math.sqrt(S_ref * (P * (P * P - 1.0) / 12.0 - tie))


    def spearman_many(self, ref: tuple[Any, float], D: Any, what: str) -> list[float]:
        """Spearman of each row of ``D`` (B, P) against the reference: one batched sort;
        rows with exact ties are redone one by one with average ranks."""
        torch = self.torch
        cf, S_ref = ref
        vals, idx = torch.sort(D, dim=1)
        if not bool((vals[:, -1] > vals[:, 0]).all()):
            raise _constant(what, self.label)
        P = D.shape[1]
        r = torch.arange(P, dtype=torch.float64, device=self.device) + (1.0 - (P + 1) / 2.0)
        num = (cf[idx] * r).sum(dim=1)
        rho = (num / math.sqrt(S_ref * (P * (P * P - 1.0) / 12.0))).cpu().tolist()
        tied = torch.nonzero((vals[:, 1:] == vals[:, :-1]).any(dim=1)).flatten().cpu().tolist()
        for b in tied:
            rho[b] = self.spearman(ref, D[b], what)
        return rho


@contextlib.contextmanager
def _torch_single_thread() -> Iterator[None]:
    """One torch intra-op thread while several worker threads run (restored afterwards)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _resolve_device(device: Any, label: str | None) -> Any:
    """None / "cpu" -> numpy runner (returns None); anything else -> a torch.device."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return None
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise config_error(f"device={device!r} needs torch, which is not installed", label) from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise config_error(f"device={device!r} is not a valid torch device: {exc}", label) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise config_error(
            f"device={device!r} requested but torch.cuda.is_available() is False; "
            "use device=None (CPU)",
            label,
        )
    if dev.type == "mps":
        raise config_error("device='mps' has no float64 support; use device=None (CPU)", label)
    return dev


class Runner:
    """Runs frame jobs on one or more workers and returns results in order."""

    def __init__(self, P: int, *, device: Any = None, workers: int | None = None,
                 label: str | None = None) -> None:
        dev = _resolve_device(device, label)
        self.torch_device = dev
        if dev is not None:
            self.workers = 1
            self.main = TorchWorker(P, dev, label)
            self._pool: list[Any] = []
        else:
            if workers is None:
                workers = min(2, os.cpu_count() or 1) if P >= _PARALLEL_MIN_PAIRS else 1
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
                raise config_error(f"workers must be a positive integer; got {workers!r}", label)
            self.workers = workers
            self.main = NumpyWorker(P, label)
            self._pool = [NumpyWorker(P, label) for _ in range(workers - 1)]
            if workers > 1:
                log.debug("pairwise machinery: %d worker threads, ~%.1f GB buffers each",
                          workers, 16 * P / 1e9)

    def map(self, fn: Callable[[Any, Any], float], jobs: Iterable[Any]) -> list[float]:
        """``[fn(worker, job) for job in jobs]``, in parallel over workers when > 1.

        BLAS (and torch's intra-op pool) run single-threaded meanwhile: each frame's matrix
        products are small, and multi-threaded BLAS on them costs more than it gains
        (measured 2-4x more CPU time on a 2-core machine).
        """
        with ExitStack() as stack:
            if self.torch_device is None:
                try:
                    from threadpoolctl import threadpool_limits

                    stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
                except ImportError:  # pragma: no cover
                    pass
                stack.enter_context(_torch_single_thread())
            if self.workers == 1:
                return [fn(self.main, job) for job in jobs]
            free: queue.Queue = queue.Queue()
            for w in [self.main, *self._pool]:
                free.put(w)

            def call(job: Any) -> float:
                w = free.get()
                try:
                    return fn(w, job)
                finally:
                    free.put(w)

            results: list[float] = []
            ex = stack.enter_context(ThreadPoolExecutor(max_workers=self.workers))
            pending: deque = deque()
            for job in jobs:
                pending.append(ex.submit(call, job))
                if len(pending) >= 2 * self.workers:
                    results.append(pending.popleft().result())
            while pending:
                results.append(pending.popleft().result())
            return results


def make_runner(P: int, device: Any, workers: int | None, label: str | None) -> Runner:
    return Runner(P, device=device, workers=workers, label=label)
