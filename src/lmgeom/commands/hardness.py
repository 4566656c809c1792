"""``lmgeom hardness``: rank texts by dispersion (low first = likely hard), checked against
perplexity."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .options import (
    add_model_args,
    add_options,
    add_run_args,
    add_texts_args,
    arg,
    default_out,
    float_range,
    int_range,
    model_options_from_args,
    nonneg_int,
    options_from_args,
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


@dataclass(frozen=True)
class HardnessArgs:
    """The hardness options (defaults: :class:`~lmgeom.experiments.hardness.HardnessConfig`'s).

    Attributes:
        layer: the point whose token states are used.
        max_length: tokens kept per text.
        batch_size: texts per forward pass.
        quantile: fraction of texts in the 'hardest' sets compared (0.1 = deciles).
        n_boot: bootstrap replicates.
        n_perm: random rankings in the null.
        show: texts to print from each end.
        no_cache: do not read or write the cache.
    """

    layer: str = "final"
    max_length: int = field(default=256, metadata=arg(type=positive_int))
    batch_size: int = field(default=8, metadata=arg(type=positive_int))
    quantile: float = field(default=0.1, metadata=arg(type=float_range(0, 0.5, lo_open=True)))
    n_boot: int = field(default=1000, metadata=arg(type=int_range(2)))
    n_perm: int = field(default=1000, metadata=arg(type=int_range(10)))
    show: int = field(default=10, metadata=arg(type=nonneg_int))
    no_cache: bool = False


@dataclass(frozen=True)
class SamplesArgs:
    """Per-item output.

    Attributes:
        log_samples: also write samples.parquet: one row per text (id, label, n_tokens,
            truncated, NLL, perplexity, dispersion, rank).
    """

    log_samples: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p, default="builtin:domains", n=500)
    add_options(p, HardnessArgs, title="hardness")
    add_options(p, SamplesArgs)
    add_run_args(p, out=None)


def run(args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.hardness import HardnessConfig, HardnessExperiment

    experiment = HardnessExperiment(spec=args.model, texts=text_options_from_args(args),
                                    model=model_options_from_args(args),
                                    hardness=options_from_args(args, HardnessConfig),
                                    cache=not args.no_cache, log_samples=args.log_samples)
    args.out = args.out or default_out("hardness", args.model)
    run = run_experiment(experiment, args.out, overwrite=args.overwrite,
                         progress=progress_from_args(args))
    print(run.result.summary(show=args.show))
    samples = ", samples.parquet" if args.log_samples else ""
    print(f"\nwrote {run.path}/hardness.csv, hardness.parquet{samples}, manifest.json and "
          f"{run.report.name}")
    return 0
