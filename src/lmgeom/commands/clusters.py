"""``lmgeom clusters``: within-cluster dispersion of contexts that share their next 10 tokens."""

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
from .types import int_range, positive_int

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


@dataclass(frozen=True)
class ClustersArgs:
    """The cluster options (defaults: :class:`~lmgeom.experiments.clusters.ClusterConfig`'s).

    Attributes:
        ngram: length of the shared continuation.
        window: context tokens kept before it.
        min_context: context tokens needed before it.
        max_clusters: seeded sample of clusters.
        max_members: seeded sample of contexts per cluster.
        layers: all | blocks | final | 0,5,10 | 3-7.
        batch_size: contexts per forward pass.
        n_boot: bootstrap replicates.
        no_cache: do not read or write the cache.
    """

    ngram: int = field(default=10, metadata=arg(type=positive_int))
    window: int = field(default=64, metadata=arg(type=positive_int))
    min_context: int = field(default=8, metadata=arg(type=positive_int))
    max_clusters: int = field(default=500, metadata=arg(type=positive_int))
    max_members: int = field(default=16, metadata=arg(type=int_range(2)))
    layers: str = "all"
    batch_size: int = field(default=16, metadata=arg(type=positive_int))
    n_boot: int = field(default=1000, metadata=arg(type=int_range(2)))
    no_cache: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_args(p, (ClustersArgs, "clusters"), multiple=True,
                        texts={"default": "builtin:code", "n": None}, extract=False)


def run(args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.clusters import ClusterConfig, ClustersExperiment

    models = tuple(args.model or [DEFAULT_MODEL])
    experiment = ClustersExperiment(models=models, **inputs_from_args(args),
                                    clusters=options_from_args(args, ClusterConfig),
                                    cache=not args.no_cache)
    args.out = args.out or default_out("clusters", models)
    run = run_experiment(experiment, args.out, overwrite=args.overwrite,
                         progress=progress_from_args(args))
    print(run.result.summary())
    print(f"\nwrote {run.path}/clusters.parquet, clusters.csv, manifest.json and "
          f"{run.report.name}")
    return 0
