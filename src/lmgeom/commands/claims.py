"""``lmgeom claims``: a measured verdict on every claim of the two papers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError
from .analyze import add_pga_args, layer_config_from_args
from .options import (
    add_experiment_args,
    arg,
    default_out,
    model_options_from_args,
    run_and_report,
    text_options_from_args,
)
from .types import int_range

NAME = "claims"
#: the papers' number of texts, ``--n``'s default
DEFAULT_N = 256
HELP = "test each claim of the two papers (PGA P1-P8, dispersion D1-D8): a verdict per claim"
DESCRIPTION = (
    "Tests every claim of the Subspace PGA paper (P1-P8) and the representation dispersion "
    "paper (D1-D8) on the models given (default: every installed bundled model) and writes "
    "claims.parquet/.csv — one row per claim: statement, models (width, family, tuning), the "
    "measured quantity with its 95 % interval, the threshold the claim implies and a verdict "
    "(supported / contradicted / inconclusive / underpowered / unstable / not testable here, with the "
    "reason) — the layer sweep and convergence tables it rests on, manifest.json and "
    "report.html with PGA z against relative depth. What the texts can support is decided "
    "before any model loads: k is the papers' 100 where n leaves room for it, else "
    "n - max(CCR) - 2 (said once, recorded in the manifest and in each verdict it touches); an "
    "explicit --k that does not fit is refused at once. A PGA decision this n cannot make "
    "(z inside its null band, or a band wider than an effect of the papers' size would be at "
    "this n) is 'underpowered', with the n it would need. The layer sweep is kept in the "
    "cache, so a rerun with other options reuses it. --n and --model make a quick look "
    "possible; --only P1,D3 runs a subset."
)


@dataclass(frozen=True)
class ClaimsArgs:
    """What ``claims`` adds.

    Attributes:
        suite: a trained width suite folder (from `lmgeom suite train --out DIR`) for P6 (and
            the dispersion claims that need checkpoints); without it P6 is not testable here.
        only: only these claims, comma-separated (e.g. P1,P7,D3).
        folds: CV folds of the linear probes (P8).
        n_ladder: decide the PGA claims (P1-P5, P7, P8) at several n in one run, e.g.
            64,128,256: one forward pass per model at the largest n (which is the run's --n),
            its states sliced into nested seeded subsets for the smaller ones; the growth of
            abs(z) with n is measured per model, a verdict that differs between the two largest n
            is marked 'unstable' (a verdict 'underpowered' at the smaller n that the larger
            decides is not a change), and claims_ladder.parquet has every n's verdicts. The
            dispersion claims (D1-D8) run at the largest n only.
    """

    suite: str | None = field(default=None, metadata=arg(metavar="DIR"))
    only: str | None = field(default=None, metadata=arg(metavar="IDS"))
    folds: int = field(default=5, metadata=arg(type=int_range(2)))
    n_ladder: str | None = field(default=None, metadata=arg(metavar="N,N,..."))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_args(p, add_pga_args, (ClaimsArgs, "claims"), multiple=True,
                        texts={"n": DEFAULT_N})


def run(args) -> int:
    from ..experiments.claims import ClaimsConfig, parse_ladder, parse_only

    if args.suite is not None:
        if not Path(args.suite).is_dir():
            raise ConfigError(f"--suite {args.suite}: no such folder; give a suite folder from "
                              "`lmgeom suite train --out DIR`")
    texts = text_options_from_args(args)
    ladder = parse_ladder(args.n_ladder) if args.n_ladder else ()
    if ladder and texts.n != ladder[-1]:
        if texts.n != DEFAULT_N:  # an --n of the user's that the ladder contradicts
            raise ConfigError(f"--n {texts.n} and --n-ladder {args.n_ladder}: the ladder's "
                              f"largest n is the run's n; leave --n out or give --n {ladder[-1]}")
        texts = replace(texts, n=ladder[-1])
    config = ClaimsConfig(
        models=tuple(args.model or ()), texts=texts, ladder=ladder,
        model=model_options_from_args(args), layers=layer_config_from_args(args),
        folds=args.folds, suite=args.suite, only=parse_only(args.only))
    args.out = args.out or default_out("claims", list(config.models))
    run_and_report(config, args)
    return 0
