"""``lmgeom converge``: cross-model convergence of distance structure in the readout space."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .options import (
    add_experiment_args,
    arg,
    default_out,
    inputs_from_args,
    options_from_args,
    run_and_report,
)
from .types import int_range, nonneg_int, positive_int

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


@dataclass(frozen=True)
class ConvergeArgs:
    """The convergence options.

    Attributes:
        k: readout subspace dimension (per model); default min(100, n - CCR - 2), fitted to
            the texts like every command's k (an explicit k that does not fit is refused).
        n_null: random-frame draws.
        ccr: CCR level applied to each model's states.
        pairs: 'exact' or an integer number of sampled pairs.
        layer_map: 'depth' (nearest relative depth, plus final~final), 'all', or explicit
            10:6,20:12.
        no_heatmap: skip the all-layer-pairs heatmap.
    """

    k: int | None = field(default=None, metadata=arg(type=positive_int))
    n_null: int = field(default=100, metadata=arg(type=int_range(2)))
    ccr: int = field(default=1, metadata=arg(type=nonneg_int))
    pairs: str = "exact"
    layer_map: str = "depth"
    no_heatmap: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_args(p, (ConvergeArgs, "convergence"), multiple=True)


def run(args) -> int:
    from ..experiments.convergence import ConvergeConfig, ConvergeExperiment
    from ..experiments.layer_sweep import parse_pairs

    models = tuple(args.model or ["smollm2-135m", "gemma3-270m"])
    pairs = parse_pairs(args.pairs)
    config = options_from_args(args, ConvergeConfig, heatmap=not args.no_heatmap,
                               pairs=None if pairs in ("exact", "auto") else pairs)
    experiment = ConvergeExperiment(
        models=models, **inputs_from_args(args),
        config=config, layers=args.layers, pooling=args.pooling, max_length=args.max_length,
        batch_size=args.batch_size, cache=not args.no_cache)
    args.out = args.out or default_out("converge", models)
    run_and_report(experiment, args)
    return 0
