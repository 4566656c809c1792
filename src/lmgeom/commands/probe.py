"""``lmgeom probe``: per-layer linear-probe accuracy beside the PGA z, one picture."""

from __future__ import annotations

import argparse

from .analyze import add_pga_args, layer_config_from_args
from .options import (
    add_extract_args,
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    int_range,
    positive_float,
)

NAME = "probe"
HELP = "per-layer linear probes (logistic regression, stratified CV) with the PGA z beside them"
DESCRIPTION = (
    "For a labeled text set (builtin:domains, a file with a label column, or an hf: dataset): per "
    "layer, standardised features, multinomial logistic regression, stratified k-fold CV with a "
    "fixed seed; accuracy mean ± std and the majority baseline, plotted on the same layer axis as "
    "the Subspace PGA z (CCR-1 by default), so probe accuracy vs z is one picture."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p)
    add_extract_args(p)
    add_pga_args(p, ccr="1")
    g = p.add_argument_group("probe")
    g.add_argument("--folds", type=int_range(2), default=5, help="stratified CV folds")
    g.add_argument("--C", type=positive_float, default=1.0, help="inverse L2 regularisation strength")
    add_run_args(p, out=None)


def run(args) -> int:
    from dataclasses import replace

    from ..experiments.probes import ProbeExperiment
    from .options import model_options_from_args, run_and_report, text_options_from_args

    experiment = ProbeExperiment(
        spec=args.model, texts=text_options_from_args(args), model=model_options_from_args(args),
        layers=replace(layer_config_from_args(args, logit_lens=False), spectral=False),
        folds=args.folds, C=args.C, cache=not args.no_cache)
    args.out = args.out or default_out("probe", args.model)
    run_and_report(experiment, args)
    return 0
