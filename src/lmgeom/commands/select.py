"""``lmgeom select``: label-free ranking of models / checkpoints for a domain by the dispersion
gap, checked against measured domain perplexity."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..experiments.options import ModelOptions
from .options import (
    CandidateArgs,
    add_options,
    add_run_args,
    arg,
    options_from_args,
    run_and_report,
)
from .types import int_list, int_range, positive_int

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
    "--general-texts outside T. With --domain-texts the "
    "forward-pass variant (variant=states) runs too: the same formula on sampled token states "
    "of domain vs general text at --state-layer. Where held-out domain text exists (--eval-texts; "
    "default: --domain-texts, else builtin:math / builtin:code) each candidate's perplexity and bits "
    "per byte are measured and the Spearman correlation between G and -bits/byte is reported "
    "(bootstrap CI from 5 candidates on). Writes select.parquet/.csv, manifest.json, plots and "
    "report.html."
)


@dataclass(frozen=True)
class GapArgs:
    """The dispersion gap (defaults: :class:`~lmgeom.experiments.select.SelectConfig`'s).

    Attributes:
        domain: math (digits) | code (Python keywords) | comma-separated words.
        forms: which forms of each word to try: 'w', ' w' or both.
        n_general: size of the general token set.
        general_pool: T-bar is drawn from this many most frequent ids.
        general_texts: corpus that defines token frequency (and general states).
        n_general_texts: texts of --general-texts counted for frequency.
        domain_texts: also run the forward-pass variant on states of this domain text (e.g.
            builtin:math).
        state_layer: layer / point of the states variant (final = post-norm).
        state_tokens: sampled token states per corpus for the states variant.
        n_state_texts: texts per corpus for the states variant.
        state_max_length: tokens kept per text.
    """

    domain: str = "math"
    forms: str = field(default="both", metadata=arg(choices=("both", "bare", "space")))
    n_general: int = field(default=500, metadata=arg(type=positive_int))
    general_pool: int = field(default=5000, metadata=arg(type=positive_int))
    general_texts: str = "builtin:wiki"
    n_general_texts: int = field(default=300, metadata=arg(type=positive_int))
    domain_texts: str | None = field(default=None, metadata=arg(metavar="SPEC"))
    state_layer: str = "final"
    state_tokens: int = field(default=2000, metadata=arg(type=int_range(2)))
    n_state_texts: int = field(default=64, metadata=arg(type=positive_int))
    state_max_length: int = field(default=256, metadata=arg(type=positive_int))


@dataclass(frozen=True)
class QualityArgs:
    """The measured quality (defaults: :class:`~lmgeom.experiments.select.SelectConfig`'s).

    Attributes:
        eval_texts: held-out domain text for perplexity (default: --domain-texts, split in two
            disjoint halves; else builtin:math / builtin:code).
        n_eval: texts scored.
        max_length: window length.
        stride: sliding-window stride.
        no_perplexity: rank only; measure nothing.
        batch_size: texts / windows per forward pass.
        n_boot: bootstrap replicates.
        no_cache: do not use the activation cache.
    """

    eval_texts: str | None = field(default=None, metadata=arg(metavar="SPEC"))
    n_eval: int = field(default=48, metadata=arg(type=positive_int))
    max_length: int = field(default=512, metadata=arg(type=int_range(2)))
    stride: int = field(default=256, metadata=arg(type=positive_int))
    no_perplexity: bool = False
    batch_size: int = field(default=8, metadata=arg(type=positive_int))
    n_boot: int = field(default=1000, metadata=arg(type=int_range(2)))
    no_cache: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = add_options(p, CandidateArgs, title="candidates")
    add_options(g, ModelOptions, only=("revision", "dtype", "device"))
    add_options(p, GapArgs, title="dispersion gap")
    add_options(p, QualityArgs, title="measured quality")
    add_run_args(p, out=None)


def config_from_args(args):
    """The :class:`~lmgeom.experiments.select.SelectConfig` of the options."""
    from ..experiments.select import SelectConfig

    return options_from_args(args, SelectConfig, perplexity=not args.no_perplexity)


def run(args) -> int:
    from ..experiments.select import (
        SelectExperiment,
        filter_candidates,
        model_candidates,
        suite_candidates,
    )
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
