"""The device worker of the null loop: torch in float64 on ``device`` (cuda, or the CPU when
the compiled kernel is unavailable).

Gram matrices, distances, sort and ranks all run on the device: the frame's pair distances
are sorted with ``torch.sort`` (one batched sort per level for a batch of frames), exact ties
get average ranks, and the correlation is summed in float64. The device BLAS rounds Gram
matrices differently from the CPU's at the 1e-16 level; this moves Spearman values by ~1e-13,
i.e. PGA z agrees with the CPU result to ~1e-9.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lmgeom.metrics._pairs import Layout, constant_error, zero_rows_error
from lmgeom.metrics.geometry import ZERO_RTOL

__all__ = ["TorchWorker"]


class TorchWorker:
    """Device worker (torch, float64): Gram matrices, sort and ranks on ``device``."""

    def __init__(self, P: int, device: Any, label: str | None) -> None:
        import torch

        self.torch = torch
        self.P = P
        self.device = device
        self.label = label
        self._cache: dict[int, Any] = {}

    def _t(self, a: Any, dtype: Any = None) -> Any:
        """``a`` as a tensor on the device (float64 unless ``dtype``); None stays None."""
        if a is None:
            return None
        return self.torch.as_tensor(np.ascontiguousarray(a), device=self.device,
                                    dtype=self.torch.float64 if dtype is None else dtype)

    def asarray(self, A: np.ndarray) -> Any:
        hit = self._cache.get(id(A))
        if hit is not None and hit[0] is A:
            return hit[1]
        t = self._t(A)
        self._cache[id(A)] = (A, t)
        return t

    def _unit(self, Y: Any, scale: float, what: str) -> Any:
        norms = self.torch.linalg.vector_norm(Y, dim=1)
        bad = self.torch.nonzero(~(norms > ZERO_RTOL * scale)).flatten()
        if bad.numel():
            raise zero_rows_error(bad.cpu().numpy(), Y.shape[0], what, self.label)
        return Y / norms[:, None]

    def project(self, Xu: np.ndarray, Q: np.ndarray | None, *, scale: float, what: str) -> Any:
        Xt = self.asarray(Xu)
        # torch.tensor copies: cached null frames are read-only numpy arrays (shared across calls)
        Y = Xt.clone() if Q is None else \
            Xt @ self.torch.tensor(Q, dtype=self.torch.float64, device=self.device)
        return self._unit(Y, scale, what)

    def backend(self, Xtop: np.ndarray, T: np.ndarray | None, Ptop: np.ndarray | None) -> tuple:
        return self._t(Xtop), self._t(T), self._t(Ptop)

    def project_batch(self, be: tuple, chunk: list[np.ndarray]) -> tuple:
        Qc = self._t(np.concatenate(chunk, axis=1))
        return be[0] @ Qc, (None if be[2] is None else be[2] @ Qc)

    def level_rows(self, be: tuple, Yc: Any, PQ: Any, b: int, k: int, m: int, mt: int, *,
                   scale: float, what: str = "in a null frame") -> Any:
        Y = Yc[:, b * k:(b + 1) * k]
        if m != mt:
            Y = Y + be[1][:, m:mt] @ PQ[m:mt, b * k:(b + 1) * k]
        return self._unit(Y, scale, what)

    def _layout_tensors(self, layout: Layout) -> dict:
        key = str(self.device)
        c = layout._torch_cache.get(key)
        if c is None:
            def T(a: Any) -> Any:
                return a if not isinstance(a, np.ndarray) else \
                    self._t(a, self.torch.bool if a.dtype == bool else self.torch.int64)

            c = layout._torch_cache[key] = {
                "blocks": [{f: T(getattr(b, f)) for f in
                            ("r0", "r1", "s0", "s1", "mask", "uu", "uinv", "cols", "flat")}
                           for b in layout.blocks],
                **{f: T(getattr(layout, f)) for f in ("a", "b", "expand", "same")},
            }
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
            tmp = out if c["expand"] is None else \
                torch.empty(L, dtype=torch.float64, device=self.device)
            if kind == "gram":
                for b in c["blocks"]:
                    if b["s1"] > b["s0"]:
                        G = Yu[b["r0"]:b["r1"]] @ Yu[: b["r1"]].T
                        tmp[b["s0"]:b["s1"]] = G.reshape(-1)[b["flat"]]
            else:
                a, bb, step = c["a"], c["b"], 1 << 16
                for c0 in range(0, L, step):
                    tmp[c0:c0 + step] = (Yu[a[c0:c0 + step]] * Yu[bb[c0:c0 + step]]).sum(1)
            if c["expand"] is not None:
                out = tmp[c["expand"]]
        out = 1.0 - out
        if c["same"] is not None and c["same"].numel():
            out[c["same"]] = 0.0
        return out

    def _ranked(self, d: Any, what: str) -> tuple[Any, Any, float]:
        """The order of ``d``, the centred average ranks at each sorted position and
        ``S = sum of squared centred ranks`` (``P (P^2 - 1) / 12`` less the tie term)."""
        torch = self.torch
        vals, idx = torch.sort(d)
        if not bool(vals[-1] > vals[0]):
            raise constant_error(what, self.label)
        P = vals.numel()
        m = (P + 1) / 2.0
        S = P * (P * P - 1.0) / 12.0
        new = torch.ones(P, dtype=torch.bool, device=self.device)
        new[1:] = vals[1:] != vals[:-1]
        if bool(new.all()):
            return idx, torch.arange(P, dtype=torch.float64, device=self.device) + (1.0 - m), S
        gid = torch.cumsum(new.to(torch.int64), 0) - 1
        counts = torch.bincount(gid)
        ends = torch.cumsum(counts, 0)
        avg = (ends - counts + 1 + ends).to(torch.float64) / 2.0
        cf = counts.to(torch.float64)
        return idx, avg[gid] - m, S - float((cf ** 3 - cf).sum()) / 12.0

    def reference(self, d: Any, what: str) -> tuple[Any, float]:
        idx, r, S = self._ranked(d, what)
        cf = self.torch.empty_like(r)
        cf[idx] = r
        return cf, S

    def spearman(self, ref: tuple[Any, float], d: Any, what: str) -> float:
        cf, S_ref = ref
        idx, r, S = self._ranked(d, what)
        return float(self.torch.dot(cf[idx], r)) / math.sqrt(S_ref * S)

    def spearman_many(self, ref: tuple[Any, float], D: Any, what: str) -> list[float]:
        """Spearman of each row of ``D`` (B, P) against the reference: one batched sort;
        rows with exact ties are redone one by one with average ranks."""
        torch = self.torch
        cf, S_ref = ref
        vals, idx = torch.sort(D, dim=1)
        if not bool((vals[:, -1] > vals[:, 0]).all()):
            raise constant_error(what, self.label)
        P = D.shape[1]
        r = torch.arange(P, dtype=torch.float64, device=self.device) + (1.0 - (P + 1) / 2.0)
        num = (cf[idx] * r).sum(dim=1)
        rho = (num / math.sqrt(S_ref * (P * (P * P - 1.0) / 12.0))).cpu().tolist()
        tied = torch.nonzero((vals[:, 1:] == vals[:, :-1]).any(dim=1)).flatten().cpu().tolist()
        for b in tied:
            rho[b] = self.spearman(ref, D[b], what)
        return rho

    def null_refs(self, refs: list, layout: Layout) -> list:
        return refs

    def null_rhos(self, spec: Any, refs: list, Yc: Any, PQ: Any, nb: int) -> list[list[float]]:
        """Spearman of each of the batch's ``nb`` frames against each level's reference: one
        batched sort per level."""
        cols = []
        for m, scale, ref in zip(spec.ms, spec.scales, refs):
            D = self.torch.stack([
                self.distances(spec.layout, self.level_rows(spec.be, Yc, PQ, b, spec.k, m,
                                                            spec.mt, scale=scale))
                for b in range(nb)])
            cols.append(self.spearman_many(ref, D, "in a null frame"))
        return [list(r) for r in zip(*cols)]
