"""``lmgeom dispersion``: token-level dispersion vs perplexity per layer, for every model × corpus."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..models.bundled import DEFAULT_MODEL
from .options import (
    add_experiment_args,
    arg,
    default_out,
    inputs_from_args,
    options_from_args,
    progress_from_args,
)
from .types import int_range, nonneg_int, path_arg, positive_int

NAME = "dispersion"
HELP = "dispersion vs perplexity per layer on fixed-length chunks (chunk and group level, CIs)"
DESCRIPTION = (
    "Joins each corpus into one token stream (texts separated by the tokenizer's EOS), cuts it "
    "into chunks of exactly --chunk-len tokens (tail dropped; --max-chunks keeps a seeded "
    "sample) and runs each model once per batch of chunks: per chunk its perplexity and, at "
    "every requested layer, the token-level dispersion 1 - mean pairwise cosine of its token "
    "states. Then per layer the Spearman and Pearson correlations of dispersion with perplexity, "
    "over chunks (level=chunk) and over perplexity-sorted groups of --group-size chunks "
    "(level=group; the released code uses 100 on thousands of chunks; the default suits a "
    "few hundred), with seeded bootstrap 95 % intervals. Writes "
    "dispersion.parquet/.csv (tidy; setting = 'texts=SPEC;level=chunk' or "
    "'texts=SPEC;level=group;g=G'), chunks.parquet (per-chunk values), manifest.json, plots and "
    "report.html. --model and --texts repeat: every model x corpus in one call. Per-batch results "
    "are cached, so a killed run resumes and reruns are cheap."
)


@dataclass(frozen=True)
class DispersionArgs:
    """The dispersion options (defaults: :class:`~lmgeom.experiments.dispersion.DispersionConfig`'s).

    Attributes:
        chunk_len: tokens per chunk.
        layers: all | blocks | final | 0,5,10 | 3-7 | 12.attn_out (comma-separated).
        max_chunks: keep a seeded sample of at most this many chunks per corpus (0: all).
        group_size: chunks per perplexity-sorted group for level=group.
        max_groups: at most this many groups, spread evenly in perplexity.
        n_boot: bootstrap replicates per interval.
        bos: BOS before each chunk: auto = when the tokenizer prepends one.
        batch_size: chunks per forward pass.
        position_chunk: positions per readout matmul (default: 64 MiB of float32 logits).
        no_cache: do not read or write the chunk cache.
        attach: also add the results to an `lmgeom analyze` run folder and regenerate its
            report.html with a dispersion section.
    """

    chunk_len: int = field(default=512, metadata=arg(type=int_range(2)))
    layers: str = "all"
    max_chunks: int = field(default=256, metadata=arg(type=nonneg_int))
    group_size: int = field(default=10, metadata=arg(type=int_range(2)))
    max_groups: int = field(default=100, metadata=arg(type=positive_int))
    n_boot: int = field(default=1000, metadata=arg(type=int_range(10)))
    bos: str = field(default="auto", metadata=arg(choices=("auto", "on", "off")))
    batch_size: int = field(default=4, metadata=arg(type=positive_int))
    position_chunk: int | None = field(default=None, metadata=arg(type=positive_int))
    no_cache: bool = False
    attach: str | None = field(default=None, metadata=arg(type=path_arg, metavar="RUN_DIR"))


@dataclass(frozen=True)
class SamplesArgs:
    """Per-item output.

    Attributes:
        log_samples: also write samples.parquet: one row per chunk (id, start, n_tokens, NLL,
            perplexity, dispersion per layer).
    """

    log_samples: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_args(p, (DispersionArgs, "dispersion"), SamplesArgs, multiple=True,
                        texts={"default": "builtin:wiki", "n": None, "multiple": True},
                        extract=False)


def config_from_args(args):
    """The :class:`~lmgeom.experiments.dispersion.DispersionConfig` of the options."""
    from ..experiments.dispersion import DispersionConfig

    return options_from_args(args, DispersionConfig, max_chunks=args.max_chunks or None)


def run(args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.dispersion import DispersionExperiment, attach_to_run, check_attach

    models = tuple(args.model or [DEFAULT_MODEL])
    if args.attach:
        check_attach(args.attach, models)  # before any work
    corpora = tuple(args.texts or ["builtin:wiki"])
    experiment = DispersionExperiment(
        models=models, corpora=corpora, **inputs_from_args(args, corpora[0]),
        dispersion=config_from_args(args),
        cache=not args.no_cache, log_samples=args.log_samples)
    args.out = args.out or default_out("dispersion", models)
    run = run_experiment(experiment, args.out, overwrite=args.overwrite,
                         progress=progress_from_args(args))
    print(run.result.summary())
    samples = "samples.parquet, " if args.log_samples else ""
    print(f"\nwrote {run.path}/dispersion.parquet, dispersion.csv, chunks.parquet, {samples}"
          "manifest.json, plots and the report:")
    print(f"  {run.report.resolve()}")
    if args.attach:
        attached = attach_to_run(args.attach, run.result.rows())
        print(f"attached to {args.attach}: {attached.resolve()}")
    print(f"total {run.folder.manifest['timings']['total_s']:.1f} s")
    return 0
