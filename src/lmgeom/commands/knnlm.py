"""``lmgeom knnlm``: kNN-LM perplexity from a datastore of one measurement point, and the
dispersion-based choice of that point (``--select``)."""

from __future__ import annotations

import argparse

from ..experiments import knnlm as kx  # the experiment's defaults
from ..lm import knnlm as kl  # the kNN-LM's defaults
from .options import (
    add_model_args,
    add_run_args,
    default_out,
    float_list,
    float_or_auto,
    float_or_auto_list,
    int_range,
    model_options_from_args,
    open_fraction,
    positive_int,
    run_and_report,
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
    f"it), last.ffn_in, ... (default {kx.DEFAULT_POINT}: the input of the last FFN after its norm, "
    "the key of the original kNN-LM). --select measures the token-level dispersion of every "
    "--candidates point on about --select-tokens training tokens, ranks them, evaluates the "
    "real kNN-LM for each (or the --top N) and reports whether the dispersion pick is the best. "
    "Without --eval-texts a seeded --eval-fraction of the training texts is held out. "
    "Datastores are cached by content key under $LMGEOM_CACHE/knnlm (keys.npy memory-mapped, "
    "values.npy, trained IVF/PQ index files). Writes knnlm.parquet/.csv (tidy), manifest.json, "
    "plots and report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    g = p.add_argument_group("texts")
    g.add_argument("--train-texts", default=kx.DEFAULT_TRAIN_TEXTS, metavar="SPEC",
                   help="corpus of the datastore: builtin:NAME, a file, or hf:NAME")
    g.add_argument("--eval-texts", default=None, metavar="SPEC",
                   help="held-out corpus to score (default: --eval-fraction of the training "
                        "texts, held out)")
    g.add_argument("--eval-fraction", type=open_fraction, default=kx.DEFAULT_EVAL_FRACTION,
                   help="share of the training texts held out when no --eval-texts")
    g.add_argument("--n", type=positive_int, default=None, help="texts per corpus (a seeded sample)")
    g.add_argument("--chunk-len", type=int_range(2), default=kx.DEFAULT_CHUNK_LEN, help="tokens per chunk")
    g.add_argument("--max-train-tokens", type=positive_int, default=kx.DEFAULT_MAX_TRAIN_TOKENS,
                   help="datastore size (a seeded sample of chunks)")
    g.add_argument("--max-eval-tokens", type=positive_int, default=kx.DEFAULT_MAX_EVAL_TOKENS,
                   help="held-out tokens scored")
    g.add_argument("--bos", default="auto", choices=["auto", "on", "off"],
                   help="BOS before each chunk: auto = when the tokenizer prepends one")
    k = p.add_argument_group("kNN-LM")
    k.add_argument("--point", default=kx.DEFAULT_POINT,
                   help="measurement point(s) of keys and queries, comma-separated")
    k.add_argument("--select", action="store_true",
                   help="rank --candidates by dispersion and check the ranking against the "
                        "measured kNN-LM perplexity")
    k.add_argument("--candidates", default=kx.DEFAULT_CANDIDATES, help="points compared by --select")
    k.add_argument("--top", type=positive_int, default=None,
                   help="with --select: evaluate only the N highest-dispersion points")
    k.add_argument("--select-tokens", type=int_range(2), default=kx.DEFAULT_SELECT_TOKENS,
                   help="training tokens the dispersion is measured on")
    k.add_argument("--k", type=positive_int, default=kl.DEFAULT_K, help="neighbours per query")
    k.add_argument("--lambda", dest="lam", type=unit_float, default=kl.DEFAULT_LAMBDA,
                   help="interpolation weight of p_kNN (the headline setting)")
    k.add_argument("--lambdas", type=float_list, default=kl.DEFAULT_LAMBDAS,
                   help="lambda sweep computed from the same retrieval, comma-separated")
    k.add_argument("--temperature", type=float_or_auto, default=kl.DEFAULT_TEMPERATURE,
                   help="T in exp(-d/T): a number, or auto = the median nearest-neighbour "
                        "distance of each point's queries (scale-free)")
    k.add_argument("--temperatures", type=float_or_auto_list, default=(),
                   help="more T values evaluated from the same retrieval, e.g. 1,10,auto")
    k.add_argument("--distance", default="sqeuclidean", choices=["sqeuclidean", "euclidean"],
                   help="d: FAISS's squared L2 as is (the kNN-LM reference) or its square root")
    k.add_argument("--index", default="flat", choices=["flat", "ivf", "ivfpq"],
                   help="FAISS index: exact IndexFlatL2, IndexIVFFlat, or IndexIVFPQ (large stores)")
    k.add_argument("--nlist", type=positive_int, default=None, help="IVF cells (default 4 sqrt(n))")
    k.add_argument("--nprobe", type=positive_int, default=None, help="IVF cells searched (default 32)")
    k.add_argument("--pq-m", type=positive_int, default=None,
                   help="PQ sub-quantizers (must divide d; default the largest divisor <= 64)")
    k.add_argument("--recompute-distances", action="store_true",
                   help="exact distances to the stored keys for the neighbours an "
                        "approximate index returns")
    k.add_argument("--faiss-threads", type=positive_int, default=None, help="FAISS OpenMP threads")
    k.add_argument("--batch-size", type=positive_int, default=4, help="chunks per forward pass")
    k.add_argument("--datastore-dir", default=None,
                   help="where datastores live (default $LMGEOM_CACHE/knnlm)")
    k.add_argument("--no-cache", action="store_true",
                   help="temporary datastores, no forward cache")
    add_run_args(p, out=None)


def config_from_args(args):
    return kx.KnnConfig(point=args.point, select=args.select, candidates=args.candidates,
                     top=args.top, select_tokens=args.select_tokens, k=args.k, lam=args.lam,
                     lambdas=tuple(args.lambdas), temperature=args.temperature,
                     temperatures=tuple(args.temperatures),
                     distance=args.distance, index=args.index, nlist=args.nlist,
                     nprobe=args.nprobe, pq_m=args.pq_m, recompute=args.recompute_distances,
                     chunk_len=args.chunk_len, max_train_tokens=args.max_train_tokens,
                     max_eval_tokens=args.max_eval_tokens, eval_fraction=args.eval_fraction,
                     batch_size=args.batch_size, bos=args.bos, seed=args.seed)


def run(args) -> int:
    from ..experiments.knnlm import KnnlmExperiment
    from ..lm.knnlm import require_faiss

    require_faiss()
    experiment = KnnlmExperiment(
        spec=args.model, train_texts=args.train_texts, eval_texts=args.eval_texts, n=args.n,
        texts_seed=args.seed, model=model_options_from_args(args), knnlm=config_from_args(args),
        cache=not args.no_cache, datastore_dir=args.datastore_dir, threads=args.faiss_threads)
    args.out = args.out or default_out("knnlm", args.model)
    run_and_report(experiment, args)
    return 0
