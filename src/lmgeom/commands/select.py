"""``lmgeom select``: label-free ranking of models / checkpoints for a domain by the dispersion
gap, checked against measured domain perplexity."""

from __future__ import annotations

import argparse

from ..experiments.select import DEFAULT_GENERAL_TEXTS
from .options import add_run_args, int_range, positive_int

NAME = "select"
HELP = "rank models / checkpoints for a domain by the dispersion gap (no labels), vs perplexity"
DESCRIPTION = (
    "Per candidate (--model, repeatable, or every checkpoint of --suite DIR) the dispersion gap "
    "G = D(T) + D(T, T-bar): D(T) the dispersion among the domain tokens' rows of W_U, D(T, "
    "T-bar) their mean cosine distance to general tokens' rows (variant=W_U, no forward pass). "
    "--domain math uses the digits 0-9, code Python's keywords, anything else is a comma list "
    "of words; each word's forms 'w' and ' w' (--forms) are kept when the candidate's own "
    "tokenizer encodes them to exactly one id (others are dropped and listed). T-bar is a "
    "seeded sample of --n-general of the --general-pool most frequent non-special ids of "
    f"--general-texts (default {DEFAULT_GENERAL_TEXTS}) outside T. With --domain-texts the "
    "forward-pass variant (variant=states) runs too: the same formula on sampled token states "
    "of domain vs general text at --state-layer. Where held-out domain text exists (--eval-texts; "
    "default: --domain-texts, else builtin:math / builtin:code) each candidate's perplexity and bits "
    "per byte are measured and the Spearman correlation between G and -bits/byte is reported "
    "(bootstrap CI from 5 candidates on). Writes select.parquet/.csv, manifest.json, plots and "
    "report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("candidates")
    g.add_argument("--model", action="append", default=None, metavar="SPEC",
                   help="candidate model; repeat for several (bundled name, hub id, folder, .gguf)")
    g.add_argument("--suite", default=None, metavar="DIR",
                   help="every checkpoint of a suite trained with `lmgeom suite train --out DIR`")
    g.add_argument("--widths", default=None,
                   help="with --suite: only these widths, comma-separated (64,128 or w64)")
    g.add_argument("--steps", default=None,
                   help="with --suite: only these checkpoint steps, comma-separated")
    g.add_argument("--revision", default=None, help="hub revision for --model hub ids")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the forward passes (W_U is compared in float64 either way)")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps")
    d = p.add_argument_group("dispersion gap")
    d.add_argument("--domain", default="math",
                   help="math (digits) | code (Python keywords) | comma-separated words")
    d.add_argument("--forms", default="both", choices=["both", "bare", "space"],
                   help="which forms of each word to try: 'w', ' w' or both")
    d.add_argument("--n-general", type=positive_int, default=500, help="size of the general token set")
    d.add_argument("--general-pool", type=positive_int, default=5000,
                   help="T-bar is drawn from this many most frequent ids")
    d.add_argument("--general-texts", default=DEFAULT_GENERAL_TEXTS,
                   help="corpus that defines token frequency (and general states)")
    d.add_argument("--n-general-texts", type=positive_int, default=300,
                   help="texts of --general-texts counted for frequency")
    d.add_argument("--domain-texts", default=None, metavar="SPEC",
                   help="also run the forward-pass variant on states of this domain text "
                        "(e.g. builtin:math)")
    d.add_argument("--state-layer", default="final",
                   help="layer / point of the states variant (final = post-norm)")
    d.add_argument("--state-tokens", type=int_range(2), default=2000,
                   help="sampled token states per corpus for the states variant")
    d.add_argument("--n-state-texts", type=positive_int, default=64,
                   help="texts per corpus for the states variant")
    d.add_argument("--state-max-length", type=positive_int, default=256, help="tokens kept per text")
    e = p.add_argument_group("measured quality")
    e.add_argument("--eval-texts", default=None, metavar="SPEC",
                   help="held-out domain text for perplexity (default: --domain-texts, split "
                        "in two disjoint halves; else builtin:math / builtin:code)")
    e.add_argument("--n-eval", type=positive_int, default=48, help="texts scored")
    e.add_argument("--max-length", type=int_range(2), default=512, help="window length")
    e.add_argument("--stride", type=positive_int, default=256, help="sliding-window stride")
    e.add_argument("--no-perplexity", action="store_true", help="rank only; measure nothing")
    e.add_argument("--batch-size", type=positive_int, default=8, help="texts / windows per forward pass")
    e.add_argument("--n-boot", type=int_range(2), default=1000, help="bootstrap replicates")
    e.add_argument("--no-cache", action="store_true", help="do not use the activation cache")
    add_run_args(p, out=None)


def config_from_args(args):
    from ..experiments.select import SelectConfig

    return SelectConfig(domain=args.domain, forms=args.forms, n_general=args.n_general,
                        general_pool=args.general_pool, general_texts=args.general_texts,
                        n_general_texts=args.n_general_texts, domain_texts=args.domain_texts,
                        state_layer=args.state_layer, state_tokens=args.state_tokens,
                        n_state_texts=args.n_state_texts,
                        state_max_length=args.state_max_length, eval_texts=args.eval_texts,
                        n_eval=args.n_eval, max_length=args.max_length, stride=args.stride,
                        perplexity=not args.no_perplexity, batch_size=args.batch_size,
                        n_boot=args.n_boot, seed=args.seed)


def run(args) -> int:
    from ..errors import ConfigError
    from ..experiments.select import (
        SelectExperiment,
        filter_candidates,
        model_candidates,
        suite_candidates,
    )
    from .options import int_list, run_and_report

    if args.suite and args.model:
        raise ConfigError("give either --model (repeatable) or --suite DIR, not both")
    if args.suite:
        cands = filter_candidates(
            suite_candidates(args.suite),
            widths=[w for w in (args.widths or "").split(",") if w.strip()] or None,
            steps=int_list(args.steps, "--steps"))
    elif args.model:
        cands = model_candidates(args.model)
    else:
        raise ConfigError("no candidates: give --model A --model B ... or --suite DIR")
    config = config_from_args(args)
    name = "suite" if args.suite else "_".join(c.label.replace("/", "_") for c in cands)[:80]
    if (args.widths or args.steps) and not args.suite:
        raise ConfigError("--widths / --steps filter the checkpoints of --suite")
    experiment = SelectExperiment(candidates=tuple(cands), select=config, suite=args.suite,
                                  revision=args.revision, dtype=args.dtype, device=args.device,
                                  cache=not args.no_cache)
    args.out = args.out or f"runs/select-{config.domain_name}-{name}"
    run_and_report(experiment, args)
    return 0
