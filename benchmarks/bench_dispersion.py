"""Dispersion: lmgeom's O(n d) unit-vector-sum identity vs the O(n^2) pairwise cosine matrix a
user would write (``1 - mean off-diagonal of U U^T``), n = 512 and 4096 token states, d = 576.
Also the torch path (what the push-away loss calls) on CPU. Ratios are naive / lmgeom.
"""

from __future__ import annotations

import sys
import time

import numpy as np

D = 576


def naive_dispersion(H: np.ndarray) -> float:
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    C = U @ U.T
    n = H.shape[0]
    return float(1.0 - (C.sum() - np.trace(C)) / (n * (n - 1)))


def _best(fn, reps: int) -> tuple[float, float]:
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, float(out)


def run(profile: str = "quick") -> list[dict]:
    import torch

    from lmgeom.metrics import dispersion

    reps = 20 if profile == "full" else 7
    rows = []
    rng = np.random.default_rng(0)
    for n in (512, 4096):
        H = rng.standard_normal((n, D)) + 3.0 * rng.standard_normal(D)
        t_naive, v_naive = _best(lambda H=H: naive_dispersion(H), reps)
        t_lm, v_lm = _best(lambda H=H: dispersion(H), reps)
        Ht = torch.tensor(H, dtype=torch.float32)
        t_t, v_t = _best(lambda Ht=Ht: dispersion(Ht, check=False), reps)
        rows.append(
            {
                "bench": "dispersion",
                "name": "naive pairwise matrix",
                "N": n,
                "seconds": t_naive,
                "ratio_vs_naive": 1.0,
                "notes": f"D = {v_naive:.6f}",
            }
        )
        rows.append(
            {
                "bench": "dispersion",
                "name": "lmgeom dispersion (numpy, float64)",
                "N": n,
                "seconds": t_lm,
                "ratio_vs_naive": t_naive / t_lm,
                "notes": f"|ΔD| vs naive {abs(v_lm - v_naive):.1e}",
            }
        )
        rows.append(
            {
                "bench": "dispersion",
                "name": "lmgeom dispersion (torch float32, check=False)",
                "N": n,
                "seconds": t_t,
                "ratio_vs_naive": t_naive / t_t,
                "notes": f"|ΔD| vs naive {abs(v_t - v_naive):.1e}",
            }
        )
    return rows


if __name__ == "__main__":
    from bench_pga import _markdown  # type: ignore[import-not-found]

    print(_markdown(run(sys.argv[1] if len(sys.argv) > 1 else "quick")))
