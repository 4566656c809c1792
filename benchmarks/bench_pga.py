"""Subspace PGA: the naive scipy reference (``pdist(metric="cosine")`` + ``spearmanr`` for the
readout and every null frame) vs lmgeom's exact mode (every pair; default float64, and
precision="float32" frames) and sampled-pairs mode (default precision "auto": float32 frame
projections; and precision="float64"), on
the same synthetic anisotropic states (d = 576, k = 100, n_null = 100, CCR-1, identical
preprocessing and null frames). ``ratio_vs_naive`` = naive wall seconds / lmgeom wall seconds
in the same run; ``cpu_ratio`` the same with CPU seconds (all threads), which is the fairer
figure when other jobs share the machine. Then: cost vs N at a fixed pair budget (the pair
work is constant; the per-frame projection X @ Q is O(N d k)), and the exact mode's cost vs k
and vs n_null at N = 1000, with log-log growth exponents. Null frames are projected in batches
of 10 frames per GEMM; each frame's Gram matrix (BLAS SYRK) is ranked by the compiled kernel of
``lmgeom.metrics._rank_kernel`` (int32 keys, LSD radix sort, exact numerator). Last, the ranking
floor: one sort of the P keys alone (numpy, torch), which bounds any sort-based null loop from
below, and the kernel's whole per-frame Spearman.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks._util import loglog_slope

D, K, N_NULL, PAIRS = 576, 100, 100, 200_000


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Anisotropic states with a large common offset and clusters, and a readout basis."""
    from lmgeom.metrics import readout_basis

    rng = np.random.default_rng(seed)
    spectrum = np.geomspace(6.0, 0.05, D)
    centres = rng.standard_normal((12, D)) * spectrum
    X = centres[rng.integers(0, 12, n)] + rng.standard_normal((n, D)) * spectrum
    X += 20.0 * rng.standard_normal(D)
    W = rng.standard_normal((4000, D)) * np.geomspace(0.2, 3.0, D)[rng.permutation(D)]
    return X, readout_basis(W, K)


class _Clock:
    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c


def naive_pga(X: np.ndarray, V: np.ndarray, n_null: int, seed: int, timed_nulls: int) -> dict:
    """The obvious implementation; the null loop is timed on ``timed_nulls`` frames and
    extrapolated linearly to ``n_null``."""
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    from lmgeom.metrics import ccr, null_frames

    with _Clock() as setup:
        Xp = ccr(X, 1)
        d_full = pdist(Xp, "cosine")
        rho = spearmanr(d_full, pdist(Xp @ V, "cosine"))[0]
    with _Clock() as loop:
        frames = null_frames(X.shape[1], V.shape[1], timed_nulls, seed)
        null = np.array([spearmanr(d_full, pdist(Xp @ Q, "cosine"))[0] for Q in frames])
    f = n_null / timed_nulls
    z = (rho - null.mean()) / null.std(ddof=1) if timed_nulls == n_null else float("nan")
    return {"wall": setup.wall + f * loop.wall, "cpu": setup.cpu + f * loop.cpu,
            "rho": float(rho), "null": null, "z": z}


def _row(name, n, clock, naive=None, z=float("nan"), notes=""):
    row = {"bench": "pga", "name": name, "N": n, "seconds": clock.wall}
    if naive is not None:
        row["ratio_vs_naive"] = naive["wall"] / clock.wall
        row["cpu_ratio"] = naive["cpu"] / clock.cpu
    row["z"] = z
    row["notes"] = notes
    return row


def run(profile: str = "quick") -> list[dict]:
    from lmgeom.metrics import subspace_pga

    full = profile == "full"
    rows: list[dict] = []
    # warm-up outside the timings: imports (torch for the sampled pair path) and first-call costs
    Xw, Vw = _data(300)
    subspace_pga(Xw, Vw, n_null=2, pairs=5000)
    timed = {500: 100, 1000: 100, 2000: 100} if full else {500: 30, 1000: 12, 2000: 6}
    for n in (500, 1000, 2000):
        X, V = _data(n)
        nv = naive_pga(X, V, N_NULL, 0, timed[n])
        c = _Clock()
        c.wall, c.cpu = nv["wall"], nv["cpu"]
        note = ("all 100 nulls timed" if timed[n] == N_NULL
                else f"timed on {timed[n]} of 100 nulls, extrapolated linearly")
        rows.append(_row("naive scipy (pdist + spearmanr)", n, c, nv, nv["z"], note))
        with _Clock() as c:
            ex = subspace_pga(X, V, n_null=N_NULL, ccr=1, seed=0)
        dnull = float(np.max(np.abs(ex.null[: timed[n]] - nv["null"])))
        agree = (f"|Δz| vs naive {abs(ex.z - nv['z']):.1e}" if timed[n] == N_NULL
                 else f"max |Δρ| vs naive over the {timed[n]} timed nulls {dnull:.1e}")
        rows.append(_row("lmgeom exact (all pairs)", n, c, nv, ex.z,
                         f"{ex.pairs} pairs; |Δρ_readout| {abs(ex.rho_readout - nv['rho']):.1e}; "
                         f"{agree}"))
        with _Clock() as c:
            ex32 = subspace_pga(X, V, n_null=N_NULL, ccr=1, seed=0, precision="float32")
        rows.append(_row("lmgeom exact (all pairs, float32 frames)", n, c, nv, ex32.z,
                         f"z - z_exact(float64) = {ex32.z - ex.z:+.1e}"))
        for precision in ("auto", "float64"):
            with _Clock() as c:
                sa = subspace_pga(X, V, n_null=N_NULL, ccr=1, seed=0, pairs=PAIRS,
                                  precision=precision)
            if sa.exact and precision == "float64":
                continue  # identical to the row above
            rows.append(_row(f"lmgeom sampled (pairs={PAIRS}, {sa.precision} frames)", n, c, nv,
                             sa.z, f"{sa.pairs} pairs{' (= all pairs: exact)' if sa.exact else ''}"
                             f"; z - z_exact = {sa.z - ex.z:+.2f}"))
    base = None
    for n in (1000, 2000, 4000, 8000, 16000) if full else (1000, 2000, 4000, 8000):
        X, V = _data(n, seed=1)
        with _Clock() as c:
            sa = subspace_pga(X, V, n_null=N_NULL, ccr=1, seed=0, pairs=PAIRS)
        base = base or c.wall
        rows.append(_row(f"sampled vs N (pairs={PAIRS})", n, c, z=sa.z,
                         notes=f"time / time(N=1000) = {c.wall / base:.2f}"))
    ex_rows = [r for r in rows if r["name"] == "lmgeom exact (all pairs)"]
    sa_rows = [r for r in rows if r["name"].startswith("sampled vs N")]
    for label, rr in (("exact (all pairs)", ex_rows), (f"sampled (pairs={PAIRS})", sa_rows)):
        rows.append({"bench": "pga", "name": f"growth exponent in N: {label}",
                     "N": f"{rr[0]['N']}-{rr[-1]['N']}", "seconds": float("nan"),
                     "z": float("nan"), "ratio_vs_naive": float("nan"),
                     "notes": f"time ~ N^{loglog_slope([r['N'] for r in rr], [r['seconds'] for r in rr]):.2f} "
                              "(log-log fit; pairs alone would give 2 for exact, 0 for sampled; the "
                              "sampled mode keeps the O(N d k) projection onto each null frame)"})
    # growth of the exact-mode cost (CCR-1, float64) in k and n_null at N = 1000
    X, V0 = _data(1000, seed=3)
    from lmgeom.metrics import readout_basis

    rng = np.random.default_rng(3)
    W = rng.standard_normal((4000, D)) * np.geomspace(0.2, 3.0, D)[rng.permutation(D)]
    kk, tk = [], []
    for k in (25, 50, 100, 200):
        Vk = readout_basis(W, k)
        subspace_pga(X, Vk, n_null=N_NULL, ccr=1, seed=0)  # null frames into the cache
        with _Clock() as c:
            sa = subspace_pga(X, Vk, n_null=N_NULL, ccr=1, seed=0)
        kk.append(k)
        tk.append(c.wall)
        rows.append(_row(f"exact vs k={k}", 1000, c, z=sa.z, notes="frames cached"))
    nn_, tn = [], []
    for nn in (25, 50, 100, 200):
        subspace_pga(X, V0, n_null=nn, ccr=1, seed=0)
        with _Clock() as c:
            sa = subspace_pga(X, V0, n_null=nn, ccr=1, seed=0)
        nn_.append(nn)
        tn.append(c.wall)
        rows.append(_row(f"exact vs n_null={nn}", 1000, c, z=sa.z,
                         notes=f"seconds per null {c.wall / nn:.4f} (frames cached)"))
    for label, xs, ts in (("k (exact, N=1000)", kk, tk), ("n_null (exact, N=1000)", nn_, tn)):
        rows.append({"bench": "pga", "name": f"growth exponent in {label}",
                     "N": f"{xs[0]}-{xs[-1]}", "seconds": float("nan"), "z": float("nan"),
                     "ratio_vs_naive": float("nan"),
                     "notes": f"time ~ {label.split()[0]}^{loglog_slope(xs, ts):.2f} "
                              "(log-log fit)"})
    X, V = _data(2000, seed=2)
    for nn in (25, 50, 100, 200) if full else (25, 100):
        with _Clock() as c:
            sa = subspace_pga(X, V, n_null=nn, ccr=1, seed=0, pairs=PAIRS)
        rows.append(_row(f"sampled vs n_null={nn}", 2000, c, z=sa.z,
                         notes=f"seconds per null {c.wall / nn:.4f}"))
    rows += sort_floor_rows()
    return rows


def _kernel_frame(P: int):
    """One frame's Spearman through the compiled kernel (a distance vector of P values
    correlated with a random reference), as the CPU worker runs it."""
    from lmgeom.metrics._cpu_worker import CpuWorker

    rng = np.random.default_rng(1)
    a = rng.random(P)
    d = 0.5 * a + 0.5 * rng.random(P)
    w = CpuWorker(P, None)
    ref = w.reference(a, "x")
    w.spearman(ref, d, "x")  # compiled / loaded from numba's cache outside the timing
    return lambda: w.spearman(ref, d, "x")


def sort_floor_rows() -> list[dict]:
    """The ranking floor: one sort of P int32 keys by numpy and by torch (one thread, as
    inside the null loop), against one frame's whole Spearman through the compiled kernel
    (keys, radix sort, runs of equal keys, exact numerator: what the null loop runs per frame
    and level), best of 5, at the pair counts of analyze's default (N = 512) and of the
    N = 2000 exact rows."""
    import torch

    rows = []
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in (512, 2000):
            P = n * (n - 1) // 2
            keys = np.random.default_rng(0).integers(0, 1 << 30, P, dtype=np.int32)
            tk = torch.from_numpy(keys)
            fns = [("numpy sort of int32 keys", lambda keys=keys: np.sort(keys)),
                   ("torch.sort of int32 keys (1 thread)", lambda tk=tk: torch.sort(tk)),
                   ("compiled rank kernel: a frame's whole Spearman", _kernel_frame(P))]
            for name, fn in fns:
                best = float("inf")
                for _ in range(5):
                    t = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t)
                rows.append({"bench": "pga", "name": f"rank floor: {name}", "N": n,
                             "seconds": best, "z": float("nan"), "ratio_vs_naive": float("nan"),
                             "notes": f"{P:,} values; x {N_NULL} nulls on 2 cores = "
                                      f"{best * N_NULL / 2:.2f} s wall at best"})
    finally:
        torch.set_num_threads(prev)
    return rows


def _markdown(rows: list[dict]) -> str:
    cols = ["name", "N", "seconds", "ratio_vs_naive", "cpu_ratio", "z", "notes"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for col in cols:
            v = r.get(col, "")
            if isinstance(v, float):
                v = "" if np.isnan(v) else (f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}")
            cells.append(str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(_markdown(run(sys.argv[1] if len(sys.argv) > 1 else "quick")))
