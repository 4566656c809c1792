"""``lmgeom dispersion``: token-level dispersion vs perplexity per layer, for every model × corpus."""

from __future__ import annotations

import argparse

from ..experiments.dispersion import DEFAULT_GROUP_SIZE, DEFAULT_MAX_GROUPS
from ..texts.chunks import DEFAULT_CHUNK_LEN
from .options import (
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    int_range,
    model_options_from_args,
    nonneg_int,
    path_arg,
    positive_int,
    progress_from_args,
    text_options_from_args,
)

NAME = "dispersion"
HELP = "dispersion vs perplexity per layer on fixed-length chunks (chunk and group level, CIs)"
DESCRIPTION = (
    "Joins each corpus into one token stream (texts separated by the tokenizer's EOS), cuts it "
    "into chunks of exactly --chunk-len tokens (tail dropped; --max-chunks keeps a seeded "
    "sample) and runs each model once per batch of chunks: per chunk its perplexity and, at "
    "every requested layer, the token-level dispersion 1 - mean pairwise cosine of its token "
    "states. Then per layer the Spearman and Pearson correlations of dispersion with perplexity, "
    "over chunks (level=chunk) and over perplexity-sorted groups of --group-size chunks "
    "(level=group; the released code uses 100 on thousands of chunks; default "
    f"{DEFAULT_GROUP_SIZE} suits a few hundred), with seeded bootstrap 95 % intervals. Writes "
    "dispersion.parquet/.csv (tidy; setting = 'texts=SPEC;level=chunk' or "
    "'texts=SPEC;level=group;g=G'), chunks.parquet (per-chunk values), manifest.json, plots and "
    "report.html. --model and --texts repeat: every model x corpus in one call. Per-batch results "
    "are cached, so a killed run resumes and reruns are cheap."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p, default="builtin:wiki", n=None, multiple=True)
    g = p.add_argument_group("dispersion")
    g.add_argument("--chunk-len", type=int_range(2), default=DEFAULT_CHUNK_LEN, help="tokens per chunk")
    g.add_argument("--layers", default="all",
                   help="all | blocks | final | 0,5,10 | 3-7 | 12.attn_out (comma-separated)")
    g.add_argument("--max-chunks", type=nonneg_int, default=256,
                   help="keep a seeded sample of at most this many chunks per corpus (0: all)")
    g.add_argument("--group-size", type=int_range(2), default=DEFAULT_GROUP_SIZE,
                   help="chunks per perplexity-sorted group for level=group")
    g.add_argument("--max-groups", type=positive_int, default=DEFAULT_MAX_GROUPS,
                   help="at most this many groups, spread evenly in perplexity")
    g.add_argument("--n-boot", type=int_range(10), default=1000, help="bootstrap replicates per interval")
    g.add_argument("--bos", default="auto", choices=["auto", "on", "off"],
                   help="BOS before each chunk: auto = when the tokenizer prepends one")
    g.add_argument("--batch-size", type=positive_int, default=4, help="chunks per forward pass")
    g.add_argument("--position-chunk", type=positive_int, default=None,
                   help="positions per readout matmul (default: 64 MiB of float32 logits)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the chunk cache")
    g.add_argument("--attach", default=None, type=path_arg, metavar="RUN_DIR",
                   help="also add the results to an `lmgeom analyze` run folder and regenerate "
                        "its report.html with a dispersion section")
    p.add_argument("--log-samples", action="store_true",
                   help="also write samples.parquet: one row per chunk (id, start, n_tokens, NLL, perplexity, dispersion per layer)")
    add_run_args(p, out=None)


def config_from_args(args):
    from ..experiments.dispersion import DispersionConfig

    return DispersionConfig(chunk_len=args.chunk_len, layers=args.layers,
                            max_chunks=args.max_chunks or None, group_size=args.group_size,
                            max_groups=args.max_groups, n_boot=args.n_boot, seed=args.seed,
                            bos=args.bos, batch_size=args.batch_size,
                            position_chunk=args.position_chunk)


def run(args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.dispersion import DispersionExperiment, attach_to_run, check_attach
    from ..models.bundled import DEFAULT_MODEL

    if args.attach:
        check_attach(args.attach)  # before any work

    models = tuple(args.model or [DEFAULT_MODEL])
    corpora = tuple(args.texts or ["builtin:wiki"])
    experiment = DispersionExperiment(
        models=models, corpora=corpora, texts=text_options_from_args(args, corpora[0]),
        model=model_options_from_args(args), dispersion=config_from_args(args),
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
