"""``lmgeom converge``: cross-model convergence of distance structure in the readout space."""

from __future__ import annotations

import argparse
import itertools
import time

from .options import (
    add_extract_args,
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    load_model_from_args,
    load_texts_from_args,
    print_table,
    progress_from_args,
)

NAME = "converge"
HELP = "cross-model convergence: Spearman of pairwise distances, full vs readout vs random spaces"
DESCRIPTION = (
    "Two or more models on the same texts (per-text pooled states, so different tokenizers are "
    "fine). For each model pair and matched layer pair: Spearman between the two models' pairwise "
    "cosine-distance vectors in (a) the full spaces, (b) each model's own readout space, (c) random "
    "k-frames (null), with a z of (b) against (c). Writes converge.parquet/.csv, a heatmap of "
    "readout-space Spearman over all layer pairs, a bar plot of full vs readout vs null for the "
    "matched layers, manifest.json and report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p)
    add_extract_args(p)
    g = p.add_argument_group("convergence")
    g.add_argument("--k", type=int, default=100, help="readout subspace dimension (per model)")
    g.add_argument("--n-null", type=int, default=100, help="random-frame draws")
    g.add_argument("--ccr", type=int, default=1, help="CCR level applied to each model's states")
    g.add_argument("--pairs", default="exact", help="'exact' or an integer number of sampled pairs")
    g.add_argument("--layer-map", default="depth",
                   help="'depth' (nearest relative depth, plus final~final), 'all', or explicit 10:6,20:12")
    g.add_argument("--no-heatmap", action="store_true", help="skip the all-layer-pairs heatmap")
    add_run_args(p, out=None)


def run(args) -> int:

    from .._io import write_json
    from ..activations import extract
    from ..errors import ConfigError
    from ..experiments.convergence import (
        ConvergeConfig,
        converge_pair,
        plot_bars,
        plot_heatmap,
        summary_rows,
    )
    from ..experiments.layer_sweep import SweepConfig, model_basis
    from ..report.html import write_report
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now

    t0 = time.perf_counter()
    progress = progress_from_args(args)
    models = args.model or ["smollm2-135m", "gemma3-270m"]
    if len(models) < 2:
        raise ConfigError("give at least two models (--model A --model B)")
    pairs = None if args.pairs == "exact" else int(args.pairs)
    config = ConvergeConfig(k=args.k, n_null=args.n_null, ccr=args.ccr, pairs=pairs, seed=args.seed,
                            layer_map=args.layer_map, heatmap=not args.no_heatmap)
    settings = {"models": models, "texts": args.texts, "n": args.n, "dtype": args.dtype,
                "config": config.__dict__, "pooling": args.pooling, "max_length": args.max_length}
    sig = run_signature(settings)
    out = prepare_out_dir(args.out or default_out("converge", models), sig,
                          overwrite=args.overwrite)
    manifest = base_manifest("converge", settings, sig)
    texts = load_texts_from_args(args)
    loaded = []
    for spec in models:
        m = load_model_from_args(args, spec)
        acts = extract(m, texts, layers=args.layers, pooling=args.pooling, max_length=args.max_length,
                       batch_size=args.batch_size, cache=not args.no_cache, progress=progress)
        basis = model_basis(m, SweepConfig(k=args.k))
        loaded.append((m, acts, basis))
    rows, figures = [], []
    for (ma, aa, ba), (mb, ab, bb) in itertools.combinations(loaded, 2):
        r, matrix = converge_pair(ma, aa, ba, mb, ab, bb, config, progress=progress)
        rows += r
        stem = f"converge-{len(figures)}"
        if matrix is not None:
            figures.append((f"Readout-space Spearman, {ma.name} × {mb.name}",
                            plot_heatmap(matrix, list(aa.layers), list(ab.layers), ma.name, mb.name,
                                         out / "plots", stem + "-heatmap"),
                            "Every layer pair; brighter = the two models' distance structures agree "
                            "more inside their readout subspaces."))
        df_pair = table.frame(r)
        figures.append((f"Full vs readout vs null, {ma.name} × {mb.name}",
                        plot_bars(df_pair, ma.name, mb.name, out / "plots", stem + "-bars"),
                        "Matched layers (nearest relative depth, plus final~final)."))
    df = table.frame(rows)
    table.write_table(df, out, "converge")
    manifest.update({"models": [m.describe() for m, _, _ in loaded], "texts": texts.source,
                     "n_texts": len(texts), "texts_hash": texts.hash, "seeds": {"null_and_pairs": args.seed},
                     "timings": {"total_s": time.perf_counter() - t0}, "finished": now()})
    report = write_report(out, df, manifest, title="lmgeom converge — " + " vs ".join(models),
                          extra_figures=figures)
    write_json(out / "manifest.json", manifest)
    print(f"Cross-model convergence on {texts.source} ({len(texts)} texts), k={args.k}, CCR-{args.ccr}, "
          f"n_null={args.n_null}, seed={args.seed}")
    print_table(summary_rows(df), floatfmt="{:.3f}")
    print(f"\nwrote {out}/converge.parquet, converge.csv, plots, manifest.json and {report}")
    return 0
