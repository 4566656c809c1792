"""dtype evidence: how much do PGA z and dispersion move between fp32 and bf16 forward passes
on the real model, and how much faster is bf16? Same texts, same seeds, same batches.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def run(profile: str = "quick") -> list[dict]:
    import lmgeom
    from lmgeom import metrics as M
    from lmgeom.experiments.layer_sweep import LayerSweepConfig, model_basis

    n = 512 if profile == "full" else 128
    texts = lmgeom.load_texts("builtin:domains", limit=n, seed=0)
    states, secs = {}, {}
    for dtype in ("float32", "bfloat16"):
        model = lmgeom.load_model("smollm2-135m", dtype=dtype)
        t = time.perf_counter()
        acts = lmgeom.extract(model, texts, pooling="last", cache=False)
        secs[dtype] = time.perf_counter() - t
        states[dtype] = acts
        basis = model_basis(model, LayerSweepConfig())  # W_U in the model dtype, basis in float64
        states[dtype + "_basis"] = basis
    rows = [dict(bench="dtype", name="extract seconds fp32 / bf16", n_texts=n,
                 seconds=secs["float32"], ratio=secs["float32"] / secs["bfloat16"],
                 notes=f"bf16 {secs['bfloat16']:.1f} s")]
    layers = states["float32"].layers
    dz = {1: [], 5: []}
    dd = []
    for label in layers:
        z = {}
        for dtype in ("float32", "bfloat16"):
            X = states[dtype].layer(label)
            for m in (1, 5):
                z[(dtype, m)] = M.subspace_pga(X, states[dtype + "_basis"], ccr=m, seed=0).z
            z[(dtype, "disp")] = M.dispersion(X)
        for m in (1, 5):
            dz[m].append(abs(z[("float32", m)] - z[("bfloat16", m)]))
        dd.append(abs(z[("float32", "disp")] - z[("bfloat16", "disp")]))
        rows.append(dict(bench="dtype", name=f"layer {label}", n_texts=n,
                         notes=(f"z1 fp32 {z[('float32', 1)]:.2f} bf16 {z[('bfloat16', 1)]:.2f}; "
                                f"z5 fp32 {z[('float32', 5)]:.2f} bf16 {z[('bfloat16', 5)]:.2f}; "
                                f"D fp32 {z[('float32', 'disp')]:.4f} bf16 {z[('bfloat16', 'disp')]:.4f}")))
    rows.insert(1, dict(bench="dtype", name="max |Δz| over layers (CCR-1 / CCR-5)", n_texts=n,
                        ratio=float(max(dz[1])), notes=f"CCR-5: {max(dz[5]):.3f}; median CCR-1 {np.median(dz[1]):.3f}"))
    rows.insert(2, dict(bench="dtype", name="max |Δ dispersion| over layers", n_texts=n,
                        ratio=float(max(dd)), notes=f"median {np.median(dd):.2e}"))
    return rows


if __name__ == "__main__":
    for r in run(sys.argv[1] if len(sys.argv) > 1 else "quick"):
        print(r)
