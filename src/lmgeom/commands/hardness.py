"""``lmgeom hardness``: rank texts by dispersion (low first = likely hard), checked against
perplexity."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .options import (
    add_experiment_args,
    arg,
    default_out,
    inputs_from_args,
    options_from_args,
    progress_from_args,
)
from .types import float_range, int_range, nonneg_int, positive_int

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
    add_experiment_args(p, (HardnessArgs, "hardness"), SamplesArgs,
                        texts={"default": "builtin:domains", "n": 500}, extract=False)


def run(args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.hardness import HardnessConfig, HardnessExperiment

    experiment = HardnessExperiment(spec=args.model, **inputs_from_args(args),
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
