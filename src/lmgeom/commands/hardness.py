"""``lmgeom hardness``: rank texts by dispersion (low first = likely hard), checked against
perplexity."""

from __future__ import annotations

import argparse

from ..experiments.base import run_experiment
from .options import (
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    float_range,
    int_range,
    model_options_from_args,
    nonneg_int,
    positive_int,
    progress_from_args,
    text_options_from_args,
)

NAME = "hardness"
HELP = "label-free hardness ranking: texts ranked by token-level dispersion, checked vs perplexity"
DESCRIPTION = (
    "Per text, one forward pass gives the dispersion of its token states at --layer (default "
    "'final', the post-norm states the readout reads; a prepended BOS is left out) and its "
    "perplexity. Texts are ranked by dispersion, lowest first (rank 1 = predicted hardest). "
    "Evaluation: Spearman of dispersion with perplexity (bootstrap 95 % CI; the papers expect it "
    "negative) and the share of the top-perplexity decile found in the lowest-dispersion decile, "
    "against random rankings (expected 10 %; seeded permutation interval and p-value). Writes "
    "hardness.csv (id, label, rank, dispersion, perplexity, n_tokens, snippet), "
    "hardness.parquet (tidy, model-level rows), manifest.json and report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p, default="builtin:domains", n=500)
    g = p.add_argument_group("hardness")
    g.add_argument("--layer", default="final", help="the point whose token states are used")
    g.add_argument("--max-length", type=positive_int, default=256, help="tokens kept per text")
    g.add_argument("--batch-size", type=positive_int, default=8, help="texts per forward pass")
    g.add_argument("--quantile", type=float_range(0, 0.5, lo_open=True), default=0.1,
                   help="fraction of texts in the 'hardest' sets compared (0.1 = deciles)")
    g.add_argument("--n-boot", type=int_range(2), default=1000, help="bootstrap replicates")
    g.add_argument("--n-perm", type=int_range(10), default=1000, help="random rankings in the null")
    g.add_argument("--show", type=nonneg_int, default=10, help="texts to print from each end")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    p.add_argument("--log-samples", action="store_true",
                   help="also write samples.parquet: one row per text (id, label, n_tokens, truncated, NLL, perplexity, dispersion, rank)")
    add_run_args(p, out=None)


def run(args) -> int:
    from ..experiments.hardness import HardnessConfig, HardnessExperiment

    config = HardnessConfig(layer=args.layer, max_length=args.max_length,
                            batch_size=args.batch_size, n_boot=args.n_boot, n_perm=args.n_perm,
                            quantile=args.quantile, seed=args.seed)
    experiment = HardnessExperiment(spec=args.model, texts=text_options_from_args(args),
                                    model=model_options_from_args(args), hardness=config,
                                    cache=not args.no_cache, log_samples=args.log_samples)
    args.out = args.out or default_out("hardness", args.model)
    run = run_experiment(experiment, args.out, overwrite=args.overwrite,
                         progress=progress_from_args(args))
    print(run.result.summary(show=args.show))
    samples = ", samples.parquet" if args.log_samples else ""
    print(f"\nwrote {run.path}/hardness.csv, hardness.parquet{samples}, manifest.json and "
          f"{run.report.name}")
    return 0
