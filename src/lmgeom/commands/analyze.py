"""``lmgeom analyze``: the main job — one layer sweep of a model with an HTML report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..models.bundled import DEFAULT_MODEL
from .options import (
    add_engine_args,
    add_experiment_args,
    add_options,
    arg,
    default_out,
    engine_from_args,
    inputs_from_args,
    options_from_args,
    run_and_report,
)
from .types import int_range, positive_int

NAME = "analyze"
HELP = "layer sweep (PGA z for several CCR levels, PC1 share, spectra, logit lens) + HTML report"
DESCRIPTION = (
    "The main job. Extracts pooled states of every layer, then per layer computes the Subspace "
    "PGA z (readout subspace vs random subspaces, for each CCR level) with its null and p-value, "
    "the PC1 readout share, spectral metrics and the logit lens. Writes layers.parquet/.csv "
    "(tidy: one row per layer x metric x setting), manifest.json, PNG+SVG plots and a "
    "self-contained report.html into --out. Every option has a default: `lmgeom analyze` alone "
    "runs offline on smollm2-135m and builtin:domains."
)


@dataclass(frozen=True)
class PGAArgs:
    """The Subspace PGA options (``analyze``, ``pga``, ``probe``; ``sweep`` with its own ``--k``).

    Attributes:
        k: readout subspace dimension (default: 100, the papers' k, or n - max(CCR) - 2 when
            fewer texts leave no room for 100, said once and recorded in the manifest); an
            explicit k that does not fit n and the CCR levels is refused before any work.
        n_null: random subspaces in the null.
        ccr: CCR levels: principal components removed (comma list).
        pairs: 'exact' (all pairs), an integer (one seeded sample of that many pairs), or
            'auto' (exact up to 1000 texts, else 250000 sampled pairs).
        readout: readout basis from W_U (raw) or W_U·diag(final-norm gain) (effective).
        metrics_device: device for the PGA computation (e.g. cuda).
    """

    k: int | None = field(default=None, metadata=arg(type=positive_int))
    n_null: int = field(default=100, metadata=arg(type=int_range(2)))
    ccr: str = "0,1,5,10"
    pairs: str = "auto"
    readout: str = field(default="raw", metadata=arg(choices=("raw", "effective")))
    metrics_device: str | None = None


@dataclass(frozen=True)
class AnalyzeArgs:
    """What ``analyze`` adds to the layer sweep.

    Attributes:
        no_logit_lens: skip the logit lens.
        no_probes: skip the per-layer linear probes (run by default when the texts have labels).
        folds: CV folds of the linear probes.
        log_samples: also write samples.parquet: one row per text (id, label, n_tokens,
            truncated, NLL, perplexity, per-layer norm and readout share).
    """

    no_logit_lens: bool = False
    no_probes: bool = False
    folds: int = field(default=5, metadata=arg(type=int_range(2)))
    log_samples: bool = False


def add_pga_args(p: argparse.ArgumentParser, *, ccr: str = "0,1,5,10", **kw):
    """The :class:`PGAArgs` group (``kw``: :func:`~lmgeom.commands.options.add_options`'s)."""
    return add_options(p, PGAArgs, title="PGA", defaults={"ccr": ccr, **kw.pop("defaults", {})},
                       **kw)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_args(p, add_pga_args, AnalyzeArgs, multiple=True)
    add_engine_args(p)


def layer_config_from_args(args, *, logit_lens: bool = True, k: int | None = None):
    """The :class:`~lmgeom.experiments.layer_sweep.LayerSweepConfig` of the PGA / extraction /
    run options (``--metrics-device`` is its ``device``; ``--ccr``, ``--pairs`` parsed)."""
    from ..experiments.layer_sweep import LayerSweepConfig, parse_ccr, parse_pairs

    return options_from_args(
        args, LayerSweepConfig, k=args.k if k is None else k, ccr=parse_ccr(args.ccr),
        pairs=parse_pairs(args.pairs), logit_lens=logit_lens, device=args.metrics_device)


def run(args) -> int:
    from ..experiments.analyze import AnalyzeConfig

    models = tuple(args.model or [DEFAULT_MODEL])
    config = AnalyzeConfig(
        models=models, **inputs_from_args(args),
        layers=layer_config_from_args(args, logit_lens=not args.no_logit_lens),
        probes=not args.no_probes, folds=args.folds, cache=not args.no_cache,
        engine=engine_from_args(args), log_samples=args.log_samples)
    args.out = args.out or default_out("analyze", models)
    run_and_report(config, args)
    return 0
