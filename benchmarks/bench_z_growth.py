"""How |PGA z| grows with the number of texts n, on a real model: the exponent ``a`` of
``|z| ∝ n^a`` behind the claims' power rule (``lmgeom.metrics.claims.DEFAULT_Z_GROWTH``).

One extraction of the largest n (``builtin:domains``, last pooling, every layer); the smaller
n are nested seeded subsets of the same states, so only n changes. k and the CCR level are
the same at every n (k must fit the smallest n). Per layer whose effect is clear at the
largest n (|z| > 3), the slope of log|z| against log n; the table gives each layer's z per n
and the slope, and the last line the median slope over those layers.

    python benchmarks/bench_z_growth.py [--model smollm2-135m] [--ns 32,64,128,256] [--k 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import lmgeom
from lmgeom import metrics as M


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ns", default="32,64,128,256")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--ccr", type=int, default=1)
    ap.add_argument("--n-null", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ns = sorted(int(x) for x in args.ns.split(","))
    t0 = time.perf_counter()
    model = lmgeom.load_model(args.model)
    texts = lmgeom.load_texts("builtin:domains", limit=ns[-1], seed=args.seed)
    acts = lmgeom.extract(model, texts, layers="all", pooling="last", max_length=128)
    t_extract = time.perf_counter() - t0
    basis = M.readout_basis(model.W_U.detach().float().numpy(), k=args.k)
    order = np.random.default_rng(args.seed).permutation(len(texts))
    print(f"model {model.name}, d = {model.width}, builtin:domains, last pooling, k = {args.k}, "
          f"CCR-{args.ccr}, {args.n_null} null frames, seed {args.seed}; extraction "
          f"{t_extract:.0f} s")
    print("\n| layer | " + " | ".join(f"z n={n}" for n in ns) + " | slope a |")
    print("|---|" + "---|" * (len(ns) + 1))
    slopes = []
    for label in acts.layers:
        X = acts.layer(label)
        zs = []
        for n in ns:
            r = M.subspace_pga(X[order[:n]], basis, ccr=args.ccr, n_null=args.n_null,
                               seed=args.seed, warn=False)
            zs.append(float(r.z))
        za = np.abs(np.array(zs))
        a = float(np.polyfit(np.log(ns), np.log(np.maximum(za, 1e-6)), 1)[0])
        clear = za[-1] > 3
        if clear:
            slopes.append(a)
        print(f"| {label} | " + " | ".join(f"{z:.2f}" for z in zs)
              + f" | {a:.2f}{'' if clear else ' (|z| < 3 at the largest n: left out)'} |")
    print(f"\nmedian slope over the {len(slopes)} layers with |z| > 3 at n = {ns[-1]}: "
          f"a = {np.median(slopes):.2f} (quartiles {np.quantile(slopes, 0.25):.2f} – "
          f"{np.quantile(slopes, 0.75):.2f}); total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
