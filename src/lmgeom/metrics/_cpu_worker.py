"""The CPU worker of the null loop: numpy/BLAS for the geometry, the compiled kernel for ranks.

A worker owns the buffers needed to evaluate one null frame: project the unique rows,
normalise, form the cosines, rank them against the reference
(``lmgeom.metrics._rank_kernel``). Two layouts of the cosines:

* **Gram** (exact pairs whose rows fit one square Gram matrix, :func:`~lmgeom.metrics._pairs.
  gram_index`): one BLAS SYRK of the unit rows fills the cosines (a numpy GEMM per row block
  where scipy's Cython BLAS is not reachable), and the kernel streams ``fl(1 - cos)`` from it
  in pair order, with no distance vector. With many duplicate rows (a
  ``lmgeom.metrics._rank_kernel.WeightedReference``) it ranks the distinct entries with their
  multiplicities; their Gram matrix comes from GEMMs.
* **distances** (sampled pairs, and exact layouts too large for one Gram matrix): the pair
  distance vector of ``lmgeom.metrics._pairs.pair_distances``, ranked by the kernel.

Everything is float64, except the per-frame projections and dot products with float32 frames.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmgeom.metrics._common import data_error
from lmgeom.metrics._pairs import (
    Layout,
    constant_error,
    gram_index,
    gram_regions,
    pair_distances,
    unit_rows,
)
from lmgeom.metrics._rank_kernel import (
    RankReference,
    SpearmanKernel,
    WeightedReference,
    weighted_reference,
)

__all__ = ["CpuWorker", "NullSpec"]

#: Largest Gram matrix (float64) per worker for the Gram layout; larger exact layouts rank
#: distance vectors.
GRAM_BYTES = 256 << 20


@dataclass(frozen=True)
class NullSpec:
    """What every null frame of one layer shares: the batch backend (:meth:`backend`), the
    frame width k, the CCR levels ``ms`` (the batch is at level ``mt``), the frames' dtype,
    the pair layout and each level's zero-norm scale."""

    be: tuple
    k: int
    ms: list[int]
    mt: int
    fdt: type
    layout: Layout
    scales: list[float]


@dataclass(frozen=True)
class _GramRefs:
    """The references of the Gram layout: each pair's Gram index, and per level the reference
    (or its weighted form) and where its values lie (``gidx[order]``, or the entries)."""

    gidx: np.ndarray
    refs: list[RankReference | WeightedReference]
    fos: list[np.ndarray]


class CpuWorker:
    """CPU worker: numpy/BLAS in float64 (float32 frames where asked), kernel ranks."""

    def __init__(self, P: int, label: str | None) -> None:
        self.P = P
        self.label = label
        self._d: dict[int, np.ndarray] = {}
        self._g: np.ndarray = np.empty(0)
        self._kern: dict[int, SpearmanKernel] = {}
        self._gram_buf = np.empty((0, 0))

    def asarray(self, A: np.ndarray) -> np.ndarray:
        return A

    def project(self, Xu: np.ndarray, Q: np.ndarray | None, *, scale: float, what: str) -> np.ndarray:
        """Unit rows of ``Xu @ Q`` (of Xu itself when Q is None), in Xu's dtype."""
        Y = np.array(Xu, order="C", copy=True) if Q is None else Xu @ Q.astype(Xu.dtype,
                                                                                copy=False)
        return unit_rows(Y, scale=scale, what=what, label=self.label)

    # batched null frames: one GEMM for a batch of frames, then each CCR level's rows from
    # the top level's by a float64 rank correction
    def backend(self, Xtop: np.ndarray, T: np.ndarray | None, Ptop: np.ndarray | None) -> tuple:
        return Xtop, T, Ptop

    def project_batch(self, be: tuple, chunk: list[np.ndarray]) -> tuple:
        """``(Xtop @ [Q_1 .. Q_B], Ptop @ [Q_1 .. Q_B])`` for a batch of (d, k) frames."""
        Xtop, _T, Ptop = be
        Qc = np.concatenate(chunk, axis=1)
        Yc = Xtop @ Qc.astype(Xtop.dtype, copy=False)
        return Yc, (None if Ptop is None else Ptop @ Qc)

    def _unit_levels(self, spec: NullSpec, Yc: np.ndarray, PQ: np.ndarray | None, b: int,
                     gram: bool) -> list[np.ndarray]:
        """Frame b's unit rows at every level: Y_m = Y_t + A B_m (A the n x r PC coefficients,
        B_m the projected directions of levels m..mt), in the batch's dtype. (With float32
        frames the two layouts round the sum at different points, as they always have.)"""
        k, mt = spec.k, spec.mt
        Yt = Yc[:, b * k:(b + 1) * k]
        out = []
        for m, scale in zip(spec.ms, spec.scales):
            if m == mt:
                Ym = np.array(Yt, order="C")
            elif gram:
                Ym = spec.be[1][:, m:mt] @ PQ[m:mt, b * k:(b + 1) * k]
                if Ym.dtype != Yt.dtype:
                    Ym = Ym.astype(Yt.dtype)
                Ym += Yt
            else:
                Ym = Yt + spec.be[1][:, m:mt] @ PQ[m:mt, b * k:(b + 1) * k]
                if Ym.dtype != spec.fdt:
                    Ym = Ym.astype(spec.fdt)
            out.append(unit_rows(Ym, scale=scale, what="in a null frame", label=self.label))
        return out

    def null_refs(self, refs: list[RankReference], layout: Layout) -> Any:
        """The references as :meth:`null_rhos` reads them (computed once, shared by all
        workers): ``_GramRefs`` for the Gram layout, else ``refs`` itself."""
        gidx = gram_index(layout)
        n_g = layout.n_unique if layout.pair_map is not None else layout.n
        if gidx is None or 8 * n_g * n_g > GRAM_BYTES:
            return refs
        # many duplicate rows (e.g. layer 0: the state is the token's embedding): rank the
        # distinct Gram entries with their multiplicities instead of every pair
        wrefs = ([weighted_reference(r, gidx) for r in refs] if layout.pair_map is not None
                 else [None] * len(refs))
        if any(wr is None for wr in wrefs):
            wrefs = [None] * len(refs)
        return _GramRefs(gidx, [wr or r for wr, r in zip(wrefs, refs)],
                         [gidx[r.order] if wr is None else wr.gram for wr, r in zip(wrefs, refs)])

    def null_rhos(self, spec: NullSpec, refs: Any, Yc: np.ndarray, PQ: np.ndarray | None,
                  nb: int) -> list[list[float]]:
        """Spearman of each of the batch's ``nb`` frames against each level's reference."""
        out = []
        for b in range(nb):
            Ys = self._unit_levels(spec, Yc, PQ, b, isinstance(refs, _GramRefs))
            if isinstance(refs, _GramRefs):
                out.append([self._gram_rho(Y, ref, fo, refs.gidx, spec.layout)
                            for Y, ref, fo in zip(Ys, refs.refs, refs.fos)])
            else:
                out.append([self.spearman(ref, self.distances(spec.layout, Y), "in a null frame")
                            for Y, ref in zip(Ys, refs)])
        return out

    def _gram_rho(self, Y: np.ndarray, ref: RankReference | WeightedReference, fo: np.ndarray,
                  gidx: np.ndarray, layout: Layout) -> float:
        """One level of one frame in the Gram layout; distances ``fl(1 - cos)``: c0 = 1,
        c1 = -1 (identical rows have cos exactly 1)."""
        cos = self._gram(Y, layout, syrk=not isinstance(ref, WeightedReference))
        return self._rho(ref, cos, gidx, fo, 1.0, -1.0, "in a null frame")

    def _rho(self, ref: RankReference | WeightedReference, src: np.ndarray, gidx: np.ndarray,
             fo: np.ndarray, c0: float, c1: float, what: str) -> float:
        """Spearman of the values ``c0 + c1 * src[gidx[t]]`` against ``ref`` (``fo``: see
        :meth:`SpearmanKernel.numerator`; a weighted reference reads its entries ``src[fo]``)."""
        if isinstance(ref, WeightedReference):
            got = self._kernel(ref.U).weighted(src, fo, ref.w, ref.a2, ref.P, c0, c1)
            if got is not None and not isinstance(got, str):
                # this expression (not SpearmanKernel.rho's) keeps earlier results bit-exact
                S = ref.P * (ref.P * ref.P - 1.0) / 12.0 - got[1] / 12.0
                return (got[0] / 4.0) / math.sqrt(ref.S * S)
        else:
            kern = self._kernel(ref.P)
            got = kern.numerator(src, gidx, ref.posf, fo, c0, c1, ref.cf2, ref.tied,
                                 int(ref.tie_pos.size))
            if got is not None and not isinstance(got, str):
                return kern.rho(ref.S, *got)
        raise self._failed(got, what)

    def _gram(self, Y: np.ndarray, layout: Layout, syrk: bool = True) -> np.ndarray:
        """The cosines ``Y Y^T`` of the unit rows where :func:`~lmgeom.metrics._pairs.
        gram_index` reads them, flat: one BLAS SYRK into a column-major buffer (its upper
        triangle lies where a row-major lower triangle would), called through ctypes so the
        GIL is released; else one numpy GEMM per row block on the row-major lower
        trapezoids. Unique-row layouts get a diagonal of exactly 1 (identical rows)."""
        Y = np.ascontiguousarray(Y)
        n = Y.shape[0]
        fns = _syrk_functions() if syrk else None
        fn = fns.get(Y.dtype.str) if fns else None
        C = self._gram_buf
        if C.shape[0] != n or C.dtype != Y.dtype or (fn is None) != C.flags.c_contiguous:
            C = self._gram_buf = np.zeros((n, n), dtype=Y.dtype,
                                          order="C" if fn is None else "F")
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

    def distances(self, layout: Layout, Yu: np.ndarray, slot: int = 0) -> np.ndarray:
        out = self._d.get(slot)
        if out is None or out.size != layout.n_pairs:
            out = self._d[slot] = np.empty(layout.n_pairs)
        if self._g.size < layout.max_block:
            self._g = np.empty(layout.max_block)
        return pair_distances(layout, Yu, out, self._g)

    def _kernel(self, P: int) -> SpearmanKernel:
        kern = self._kern.get(P)
        if kern is None:
            kern = self._kern[P] = SpearmanKernel(P)
        return kern

    def reference(self, d: np.ndarray, what: str) -> RankReference:
        """The reference ranks of the distance vector ``d``."""
        try:
            got = self._kernel(d.size).order(d)
        except ValueError:
            raise constant_error(what, self.label) from None
        if got is None:
            raise self._failed(None, what)
        return RankReference(*got)

    def spearman(self, ref: RankReference, d: np.ndarray, what: str) -> float:
        """Spearman of the distance vector ``d`` (float64, pairs in the reference's order)
        against the reference."""
        return self._rho(ref, d, self._kernel(ref.P).iota(), ref.order, 0.0, 1.0, what)

    def _failed(self, got: str | None, what: str) -> Exception:
        if got == "constant":
            return constant_error(what, self.label)
        return data_error(f"a pairwise distance {what} is not a number", self.label)


@functools.lru_cache(maxsize=1)
def _syrk_functions() -> dict[str, Callable[[np.ndarray, np.ndarray], None]] | None:
    """``dtype.str -> fn(Y, C)``: ``C[upper] = Y Y^T`` for C-contiguous (n, k) ``Y`` and an
    F-ordered (n, n) ``C``, by BLAS ``?syrk`` from scipy's Cython BLAS (the same library
    scipy.linalg uses), called through ctypes, which releases the GIL during the call, so
    worker threads overlap. None when that is unavailable (numpy GEMMs are used then)."""
    try:
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
