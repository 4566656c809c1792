"""``lmgeom clusters``: within-cluster dispersion of contexts that share their next 10 tokens."""

from __future__ import annotations

import argparse

from .options import (
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    int_range,
    model_options_from_args,
    positive_int,
    progress_from_args,
    text_options_from_args,
)

NAME = "clusters"
HELP = "cluster dispersion: contexts followed by the same next N tokens, per layer and model"
DESCRIPTION = (
    "Scans the corpus (tokenized by the first model's tokenizer) for repeated --ngram-token "
    "continuations; the different contexts before one continuation form a cluster (rule: at "
    "least --min-context tokens before it, non-overlapping occurrences, distinct context windows "
    "of --window tokens, left-maximal repeats only, >= 2 contexts; see "
    "lmgeom.experiments.clusters). Each context string is fed to every model; the state of its "
    "last token at each layer is its representation. Per layer: the dispersion within each "
    "cluster, averaged weighted by cluster size, with a bootstrap 95 % CI over clusters, and the "
    "dispersion of all contexts pooled; with several models, the paired difference to the first "
    "at 'final'. Boilerplate-rich text such as builtin:code has many clusters. Writes "
    "clusters.parquet/.csv, manifest.json, plots and report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p, default="builtin:code", n=None)
    g = p.add_argument_group("clusters")
    g.add_argument("--ngram", type=positive_int, default=10, help="length of the shared continuation")
    g.add_argument("--window", type=positive_int, default=64, help="context tokens kept before it")
    g.add_argument("--min-context", type=positive_int, default=8, help="context tokens needed before it")
    g.add_argument("--max-clusters", type=positive_int, default=500, help="seeded sample of clusters")
    g.add_argument("--max-members", type=int_range(2), default=16, help="seeded sample of contexts per cluster")
    g.add_argument("--layers", default="all", help="all | blocks | final | 0,5,10 | 3-7")
    g.add_argument("--batch-size", type=positive_int, default=16, help="contexts per forward pass")
    g.add_argument("--n-boot", type=int_range(2), default=1000, help="bootstrap replicates")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    add_run_args(p, out=None)


def run(args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.clusters import ClusterConfig, ClustersExperiment
    from ..models.bundled import DEFAULT_MODEL

    models = tuple(args.model or [DEFAULT_MODEL])
    config = ClusterConfig(ngram=args.ngram, window=args.window, min_context=args.min_context,
                           max_clusters=args.max_clusters, max_members=args.max_members,
                           layers=args.layers, batch_size=args.batch_size, n_boot=args.n_boot,
                           seed=args.seed)
    experiment = ClustersExperiment(models=models, texts=text_options_from_args(args),
                                    model=model_options_from_args(args), clusters=config,
                                    cache=not args.no_cache)
    args.out = args.out or default_out("clusters", models)
    run = run_experiment(experiment, args.out, overwrite=args.overwrite,
                         progress=progress_from_args(args))
    print(run.result.summary())
    print(f"\nwrote {run.path}/clusters.parquet, clusters.csv, manifest.json and "
          f"{run.report.name}")
    return 0
