"""``lmgeom converge``: cross-model convergence of distance structure in the readout space."""

from __future__ import annotations

import argparse

from .options import (
    add_extract_args,
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    int_range,
    nonneg_int,
    positive_int,
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
    g.add_argument("--k", type=positive_int, default=100, help="readout subspace dimension (per model)")
    g.add_argument("--n-null", type=int_range(2), default=100, help="random-frame draws")
    g.add_argument("--ccr", type=nonneg_int, default=1, help="CCR level applied to each model's states")
    g.add_argument("--pairs", default="exact", help="'exact' or an integer number of sampled pairs")
    g.add_argument("--layer-map", default="depth",
                   help="'depth' (nearest relative depth, plus final~final), 'all', or explicit 10:6,20:12")
    g.add_argument("--no-heatmap", action="store_true", help="skip the all-layer-pairs heatmap")
    add_run_args(p, out=None)


def run(args) -> int:
    from ..experiments.convergence import ConvergeConfig, ConvergeExperiment
    from .options import model_options_from_args, run_and_report, text_options_from_args

    models = tuple(args.model or ["smollm2-135m", "gemma3-270m"])
    from ..experiments.layer_sweep import parse_pairs

    pairs = parse_pairs(args.pairs)
    pairs = None if pairs in ("exact", "auto") else pairs
    config = ConvergeConfig(k=args.k, n_null=args.n_null, ccr=args.ccr, pairs=pairs, seed=args.seed,
                            layer_map=args.layer_map, heatmap=not args.no_heatmap)
    experiment = ConvergeExperiment(
        models=models, texts=text_options_from_args(args), model=model_options_from_args(args),
        config=config, layers=args.layers, pooling=args.pooling, max_length=args.max_length,
        batch_size=args.batch_size, cache=not args.no_cache)
    args.out = args.out or default_out("converge", models)
    run_and_report(experiment, args)
    return 0
