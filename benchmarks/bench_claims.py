"""Where the time of ``make claims`` goes, how far each stage is from this machine's floor, and
whether bfloat16 extraction would be admissible (issue 34).

Three parts, each printed as a Markdown table (``benchmarks/RESULTS.md`` keeps the latest):

``--run DIR``  the stages of a finished ``lmgeom claims`` run, per model, from its
    ``manifest.json`` (the timings every stage records): layer sweep (load, extraction,
    per-layer metrics, probes, the n-ladder's rungs), convergence, and each dispersion claim.
``--floor``    this machine's GEMM rate (``torch.mm`` on 2048² float32 and bfloat16, every
    thread), and per model the extraction's floor: ``2 × parameters × tokens`` FLOPs (the
    matmuls of one forward pass over the run's texts; attention at ~100 tokens is a few % more)
    over that rate, beside the measured extraction time.
``--dtype``    PGA z of every layer and CCR level at float32 and bfloat16 extraction (same texts,
    seed, batches), per model: max |Δz| over layers. bfloat16 is admissible for a model only
    where this is below 0.5 (issue 34).

    python benchmarks/bench_claims.py --run runs/claims --floor [--dtype] [--n 256]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np

STAGES = (("load_s", "load"), ("extract_s", "extraction"), ("metrics_s", "layer metrics"),
          ("probes_s", "probes (P8)"), ("ladder_s", "n-ladder rungs"),
          ("logit_lens_s", "logit lens"))


def stage_table(run: Path) -> str:
    """The per-model stage times of a claims run, and the run-level ones."""
    man = json.loads((run / "manifest.json").read_text())
    tm = man["timings"]
    models = [m["name"] if isinstance(m, dict) else m for m in man.get("loaded_models", [])]
    specs = sorted({k.split("[", 1)[1].rstrip("]") for k in tm if "[" in k})
    out = ["| stage | " + " | ".join(specs) + " |", "|---|" + "---|" * len(specs)]
    for key, name in STAGES:
        vals = [tm.get(f"pga.sweep.{key}[{s}]") for s in specs]
        if any(v is not None for v in vals):
            out.append(f"| {name} | " + " | ".join("" if v is None else f"{v:.0f} s"
                                                  for v in vals) + " |")
    seconds: dict[str, dict[str, float]] = {}
    for claim, c in man["claims"].items():
        for key, v in (c.get("details") or {}).get("seconds", {}).items():
            m = re.match(r"(.+)\[(.+)\]", key)
            if m and isinstance(v, dict):
                seconds.setdefault(m.group(1), {})[m.group(2)] = float(v.get("wall_s", 0.0))
    for stage, per in sorted(seconds.items()):
        out.append(f"| {stage} | " + " | ".join(f"{per[s]:.0f} s" if s in per else ""
                                               for s in specs) + " |")
    run_level = [("layer sweep, all models", "pga.layer_sweep_s"),
                 ("convergence (P7), all pairs", "pga.converge_s"),
                 ("PGA claims in all", "pga_claims_s"),
                 ("dispersion claims in all", "dispersion_claims_s"),
                 ("report", "report_s"), ("**total**", "total_s")]
    out += ["", "| run | seconds |", "|---|---|"]
    out += [f"| {name} | {tm[key]:.0f} |" for name, key in run_level if key in tm]
    out.append(f"\nmodels: {', '.join(map(str, models))}; n = {man.get('n_texts')}; "
               f"k = {man.get('readout_k', {}).get('k')}")
    return "\n".join(out)


def gemm_rate(dtype, size: int = 2048, reps: int = 5) -> float:
    """FLOP/s of ``torch.mm`` on ``size``² matrices of ``dtype`` (best of ``reps``)."""
    import torch

    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def floor_table(run: Path | None, n: int) -> str:
    import torch

    import lmgeom

    rates = {"float32": gemm_rate(torch.float32), "bfloat16": gemm_rate(torch.bfloat16)}
    out = [f"GEMM rate ({torch.get_num_threads()} threads): float32 {rates['float32'] / 1e9:.0f}"
           f" GFLOP/s, bfloat16 {rates['bfloat16'] / 1e9:.0f} GFLOP/s", "",
           "| model | parameters (no embedding) | tokens | forward GFLOP | floor fp32 | "
           "measured extraction | measured / floor |", "|---|---|---|---|---|---|---|"]
    tm = json.loads((run / "manifest.json").read_text())["timings"] if run else {}
    texts = lmgeom.load_texts("builtin:domains", limit=n, seed=0)
    from lmgeom.experiments.claims import installed_bundled

    for spec in installed_bundled():
        model = lmgeom.load_model(spec)
        hf = model.hf_model
        emb = hf.get_input_embeddings().weight.numel()
        params = sum(p.numel() for p in hf.parameters()) - emb  # the readout is not run
        tok = model.tokenizer(list(texts), truncation=True, max_length=128)["input_ids"]
        tokens = int(sum(len(t) for t in tok))
        flops = 2 * params * tokens
        floor = flops / rates["float32"]
        meas = tm.get(f"pga.sweep.extract_s[{spec}]")
        out.append(f"| {spec} | {params / 1e6:.0f} M | {tokens} | {flops / 1e9:.0f} | "
                   f"{floor:.1f} s | " + (f"{meas:.0f} s | {meas / floor:.1f}× |" if meas
                                          else "| |"))
        del model, hf
    return "\n".join(out)


def dtype_table(n: int) -> str:
    """max |Δz| fp32 vs bf16 per model (every layer, CCR 0/1/5/10), and the time of each."""
    import lmgeom
    from lmgeom import metrics as M
    from lmgeom.experiments.claims import installed_bundled
    from lmgeom.experiments.layer_sweep import LayerSweepConfig, model_basis

    texts = lmgeom.load_texts("builtin:domains", limit=n, seed=0)
    cfg = LayerSweepConfig().fitted(n)[0]
    out = [f"n = {n}, k = {cfg.k}, {cfg.n_null} null frames, seed 0, CCR {list(cfg.ccr)}", "",
           "| model | max \\|Δz\\| (layer, CCR) | median \\|Δz\\| | extraction fp32 | bf16 | "
           "bf16 admissible (< 0.5) |", "|---|---|---|---|---|---|"]
    for spec in installed_bundled():
        z, secs = {}, {}
        for dtype in ("float32", "bfloat16"):
            model = lmgeom.load_model(spec, dtype=dtype)
            t = time.perf_counter()
            acts = lmgeom.extract(model, texts, layers="all", pooling="last", max_length=128,
                                  cache=False, progress=False)
            secs[dtype] = time.perf_counter() - t
            basis = model_basis(model, cfg)
            for label in acts.layers:
                for c in cfg.ccr:
                    z[(dtype, label, c)] = M.subspace_pga(acts.layer(label), basis, ccr=c,
                                                          n_null=cfg.n_null, seed=0,
                                                          warn=False).z
            del model, acts
        keys = [(lab, c) for (d, lab, c) in z if d == "float32"]
        dz = {k: abs(z[("float32", *k)] - z[("bfloat16", *k)]) for k in keys}
        worst = max(dz, key=dz.get)
        out.append(f"| {spec} | {dz[worst]:.2f} (layer {worst[0]}, CCR-{worst[1]}) | "
                   f"{np.median(list(dz.values())):.3f} | {secs['float32']:.0f} s | "
                   f"{secs['bfloat16']:.0f} s | {'yes' if dz[worst] < 0.5 else 'no'} |")
        print(out[-1], flush=True)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, help="a finished `lmgeom claims` run folder")
    ap.add_argument("--floor", action="store_true", help="GEMM rate and extraction floors")
    ap.add_argument("--dtype", action="store_true", help="fp32 vs bf16 |Δz| per model")
    ap.add_argument("--n", type=int, default=256)
    args = ap.parse_args()
    if args.run:
        print(stage_table(args.run), "\n", flush=True)
    if args.floor:
        print(floor_table(args.run, args.n), "\n", flush=True)
    if args.dtype:
        print(dtype_table(args.n), flush=True)


if __name__ == "__main__":
    main()
