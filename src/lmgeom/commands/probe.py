"""``lmgeom probe``: per-layer linear-probe accuracy beside the PGA z, one picture."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

from .analyze import add_pga_args, layer_config_from_args
from .options import (
    add_experiment_args,
    arg,
    default_out,
    inputs_from_args,
    run_and_report,
)
from .types import int_range, positive_float

NAME = "probe"
HELP = "per-layer linear probes (logistic regression, stratified CV) with the PGA z beside them"
DESCRIPTION = (
    "For a labeled text set (builtin:domains, a file with a label column, or an hf: dataset): per "
    "layer, standardised features, multinomial logistic regression, stratified k-fold CV with a "
    "fixed seed; accuracy mean ± std and the majority baseline, plotted on the same layer axis as "
    "the Subspace PGA z (CCR-1 by default), so probe accuracy vs z is one picture."
)


@dataclass(frozen=True)
class ProbeArgs:
    """The linear probes.

    Attributes:
        folds: stratified CV folds.
        C: inverse L2 regularisation strength.
    """

    folds: int = field(default=5, metadata=arg(type=int_range(2)))
    C: float = field(default=1.0, metadata=arg(type=positive_float))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_args(p, lambda q: add_pga_args(q, ccr="1"), (ProbeArgs, "probe"))


def run(args) -> int:
    from ..experiments.probes import ProbeExperiment

    experiment = ProbeExperiment(
        spec=args.model, **inputs_from_args(args),
        layers=replace(layer_config_from_args(args, logit_lens=False), spectral=False),
        folds=args.folds, C=args.C, cache=not args.no_cache)
    args.out = args.out or default_out("probe", args.model)
    run_and_report(experiment, args)
    return 0
