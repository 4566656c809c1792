"""``lmgeom analyze``: the main job — one layer sweep of a model with an HTML report."""

from __future__ import annotations

import argparse

from .options import (
    add_engine_args,
    add_extract_args,
    add_model_args,
    add_run_args,
    add_texts_args,
    int_range,
    positive_int,
)

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


def add_pga_args(p: argparse.ArgumentParser, *, ccr: str = "0,1,5,10") -> None:
    g = p.add_argument_group("PGA")
    g.add_argument("--k", type=positive_int, default=100, help="readout subspace dimension")
    g.add_argument("--n-null", type=int_range(2), default=100, help="random subspaces in the null")
    g.add_argument("--ccr", default=ccr, help="CCR levels: principal components removed (comma list)")
    g.add_argument("--pairs", default="auto",
                   help="'exact' (all pairs), an integer (one seeded sample of that many pairs), or "
                        "'auto' (exact up to 1000 texts, else 250000 sampled pairs)")
    g.add_argument("--readout", default="raw", choices=["raw", "effective"],
                   help="readout basis from W_U (raw) or W_U·diag(final-norm gain) (effective)")
    g.add_argument("--metrics-device", default=None, help="device for the PGA computation (e.g. cuda)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p)
    add_extract_args(p)
    add_pga_args(p)
    p.add_argument("--no-logit-lens", action="store_true", help="skip the logit lens")
    p.add_argument("--no-probes", action="store_true",
                   help="skip the per-layer linear probes (run by default when the texts have labels)")
    p.add_argument("--folds", type=int_range(2), default=5, help="CV folds of the linear probes")
    p.add_argument("--log-samples", action="store_true",
                   help="also write samples.parquet: one row per text (id, label, n_tokens, "
                        "truncated, NLL, perplexity, per-layer norm and readout share)")
    add_run_args(p, out=None)
    add_engine_args(p)


def layer_config_from_args(args, *, logit_lens: bool = True, k: int | None = None):
    """The :class:`~lmgeom.experiments.layer_sweep.LayerSweepConfig` of the PGA/extraction options."""
    from ..experiments.layer_sweep import LayerSweepConfig, parse_ccr, parse_pairs

    return LayerSweepConfig(
        k=args.k if k is None else k, n_null=args.n_null, ccr=parse_ccr(args.ccr),
        pairs=parse_pairs(args.pairs), readout=args.readout, pooling=args.pooling,
        layers=args.layers, max_length=args.max_length, batch_size=args.batch_size,
        seed=args.seed, logit_lens=logit_lens, device=args.metrics_device)


def run(args) -> int:
    from ..experiments.analyze import AnalyzeConfig
    from ..models.bundled import DEFAULT_MODEL
    from .options import (
        default_out,
        engine_from_args,
        model_options_from_args,
        run_and_report,
        text_options_from_args,
    )

    models = tuple(args.model or [DEFAULT_MODEL])
    config = AnalyzeConfig(
        models=models, texts=text_options_from_args(args), model=model_options_from_args(args),
        layers=layer_config_from_args(args, logit_lens=not args.no_logit_lens),
        probes=not args.no_probes, folds=args.folds, cache=not args.no_cache,
        engine=engine_from_args(args), log_samples=args.log_samples)
    args.out = args.out or default_out("analyze", models)
    run_and_report(config, args)
    return 0


#: the old name of :func:`layer_config_from_args`
sweep_config_from_args = layer_config_from_args
