"""``lmgeom knnlm``: kNN-LM perplexity from a datastore of one measurement point, and the
dispersion-based choice of that point (``--select``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .options import (
    add_model_args,
    add_options,
    add_run_args,
    arg,
    default_out,
    model_options_from_args,
    options_from_args,
    run_and_report,
)
from .types import (
    float_list,
    float_or_auto,
    float_or_auto_list,
    int_range,
    open_fraction,
    positive_int,
    unit_float,
)

NAME = "knnlm"
HELP = "kNN-LM perplexity per measurement point; --select: does dispersion pick the best point?"
DESCRIPTION = (
    "Builds a kNN-LM datastore (keys: the states of one measurement point at every position of "
    "the training chunks; values: the next token) with FAISS, and scores held-out text with "
    "p = lambda p_kNN + (1 - lambda) p_LM, p_kNN proportional to sum exp(-d/T) over the k "
    "neighbours, d = the squared L2 distance FAISS returns (--distance euclidean: its square "
    "root). One retrieval serves the whole --lambdas sweep. --point takes 30.attn_out, "
    "30.ffn_in, 30.ffn_out, 30 (residual after block 30, before the final norm), final (after "
    "it), last.ffn_in, ... (default last.ffn_in: the input of the last FFN after its norm, "
    "the key of the original kNN-LM). --select measures the token-level dispersion of every "
    "--candidates point on about --select-tokens training tokens, ranks them, evaluates the "
    "real kNN-LM for each (or the --top N) and reports whether the dispersion pick is the best. "
    "Without --eval-texts a seeded --eval-fraction of the training texts is held out. "
    "Datastores are cached by content key under $LMGEOM_CACHE/knnlm (keys.npy memory-mapped, "
    "values.npy, trained IVF/PQ index files). Writes knnlm.parquet/.csv (tidy), manifest.json, "
    "plots and report.html."
)


@dataclass(frozen=True)
class KnnTextsArgs:
    """The corpora (defaults: :class:`~lmgeom.experiments.knnlm.KnnConfig`'s and
    :mod:`lmgeom.experiments.knnlm`'s).

    Attributes:
        train_texts: corpus of the datastore: builtin:NAME, a file, or hf:NAME.
        eval_texts: held-out corpus to score (default: --eval-fraction of the training texts,
            held out).
        eval_fraction: share of the training texts held out when no --eval-texts.
        n: texts per corpus (a seeded sample).
        chunk_len: tokens per chunk.
        max_train_tokens: datastore size (a seeded sample of chunks).
        max_eval_tokens: held-out tokens scored.
        bos: BOS before each chunk: auto = when the tokenizer prepends one.
    """

    train_texts: str = field(default="builtin:wiki", metadata=arg(metavar="SPEC"))
    eval_texts: str | None = field(default=None, metadata=arg(metavar="SPEC"))
    eval_fraction: float = field(default=0.1, metadata=arg(type=open_fraction))
    n: int | None = field(default=None, metadata=arg(type=positive_int))
    chunk_len: int = field(default=512, metadata=arg(type=int_range(2)))
    max_train_tokens: int = field(default=100_000, metadata=arg(type=positive_int))
    max_eval_tokens: int = field(default=4096, metadata=arg(type=positive_int))
    bos: str = field(default="auto", metadata=arg(choices=("auto", "on", "off")))


@dataclass(frozen=True)
class KnnArgs:
    """The kNN-LM (defaults: :class:`~lmgeom.experiments.knnlm.KnnConfig`'s).

    Attributes:
        point: measurement point(s) of keys and queries, comma-separated.
        select: rank --candidates by dispersion and check the ranking against the measured
            kNN-LM perplexity.
        candidates: points compared by --select.
        top: with --select: evaluate only the N highest-dispersion points.
        select_tokens: training tokens the dispersion is measured on.
        k: neighbours per query.
        lam: interpolation weight of p_kNN (the headline setting).
        lambdas: lambda sweep computed from the same retrieval, comma-separated.
        temperature: T in exp(-d/T): a number, or auto = the median nearest-neighbour distance
            of each point's queries (scale-free).
        temperatures: more T values evaluated from the same retrieval, e.g. 1,10,auto.
        distance: d: FAISS's squared L2 as is (the kNN-LM reference) or its square root.
        index: FAISS index: exact IndexFlatL2, IndexIVFFlat, or IndexIVFPQ (large stores).
        nlist: IVF cells (default 4 sqrt(n)).
        nprobe: IVF cells searched (default 32).
        pq_m: PQ sub-quantizers (must divide d; default the largest divisor <= 64).
        recompute_distances: exact distances to the stored keys for the neighbours an
            approximate index returns.
        faiss_threads: FAISS OpenMP threads.
        batch_size: chunks per forward pass.
        datastore_dir: where datastores live (default $LMGEOM_CACHE/knnlm).
        no_cache: temporary datastores, no forward cache.
    """

    point: str = "last.ffn_in"
    select: bool = False
    candidates: str = "last.attn_out,last.ffn_in,last.ffn_out,last,final"
    top: int | None = field(default=None, metadata=arg(type=positive_int))
    select_tokens: int = field(default=5000, metadata=arg(type=int_range(2)))
    k: int = field(default=1024, metadata=arg(type=positive_int))
    lam: float = field(default=0.25, metadata=arg(flag="--lambda", dest="lam", type=unit_float))
    lambdas: tuple[float, ...] = field(default=(0.0, 0.1, 0.25, 0.5),
                                       metadata=arg(type=float_list))
    temperature: float | str = field(default=1.0, metadata=arg(type=float_or_auto))
    temperatures: tuple[float | str, ...] = field(default=(),
                                                  metadata=arg(type=float_or_auto_list))
    distance: str = field(default="sqeuclidean",
                          metadata=arg(choices=("sqeuclidean", "euclidean")))
    index: str = field(default="flat", metadata=arg(choices=("flat", "ivf", "ivfpq")))
    nlist: int | None = field(default=None, metadata=arg(type=positive_int))
    nprobe: int | None = field(default=None, metadata=arg(type=positive_int))
    pq_m: int | None = field(default=None, metadata=arg(type=positive_int))
    recompute_distances: bool = False
    faiss_threads: int | None = field(default=None, metadata=arg(type=positive_int))
    batch_size: int = field(default=4, metadata=arg(type=positive_int))
    datastore_dir: str | None = None
    no_cache: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_options(p, KnnTextsArgs, title="texts")
    add_options(p, KnnArgs, title="kNN-LM")
    add_run_args(p, out=None)


def config_from_args(args):
    """The :class:`~lmgeom.experiments.knnlm.KnnConfig` of the options."""
    from ..experiments.knnlm import KnnConfig

    return options_from_args(args, KnnConfig, recompute=args.recompute_distances,
                             lambdas=tuple(args.lambdas), temperatures=tuple(args.temperatures))


def run(args) -> int:
    from ..experiments.knnlm import KnnlmExperiment
    from ..lm.datastore import require_faiss

    require_faiss()
    experiment = KnnlmExperiment(
        spec=args.model, train_texts=args.train_texts, eval_texts=args.eval_texts, n=args.n,
        texts_seed=args.seed, model=model_options_from_args(args), knnlm=config_from_args(args),
        cache=not args.no_cache, datastore_dir=args.datastore_dir, threads=args.faiss_threads)
    args.out = args.out or default_out("knnlm", args.model)
    run_and_report(experiment, args)
    return 0
