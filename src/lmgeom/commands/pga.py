"""``lmgeom pga``: Subspace PGA for one model and a set of layers, every option exposed."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .._io import atomic_path
from .analyze import add_pga_args, layer_config_from_args
from .options import (
    add_extract_args,
    add_model_args,
    add_options,
    add_texts_args,
    arg,
    load_model_from_args,
    load_texts_from_args,
    print_table,
    progress_from_args,
)
from .types import path_arg, seed_int

NAME = "pga"
HELP = "Subspace PGA z per layer for one model, with every PGA option, printed as a table"
DESCRIPTION = (
    "Subspace PGA (METHODS.md): Spearman between full-space and readout-subspace cosine "
    "distances, as a z-score against random k-dimensional subspaces, after centring and "
    "CCR-m. Prints z, rho_readout, null mean/std and the empirical p-value per layer and CCR level; "
    "--csv writes the tidy rows."
)


@dataclass(frozen=True)
class PgaArgs:
    """What ``pga`` adds.

    Attributes:
        seed: seed of the text sample, null frames and pairs.
        csv: also write the tidy rows to this CSV file.
        quiet: no progress bars.
    """

    seed: int = field(default=0, metadata=arg(type=seed_int))
    csv: str | None = field(default=None, metadata=arg(type=path_arg))
    quiet: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p)
    add_extract_args(p)
    add_pga_args(p, ccr="1")
    add_options(p, PgaArgs)


def run(args) -> int:
    from ..results.folder import claim_output  # pandas

    # --csv is checked (and locked against a second run) before any work
    with claim_output(args.csv, option="--csv", suffixes=(".csv",)):
        return _run(args)


def _run(args) -> int:
    from ..activations import extract
    from ..experiments.layer_sweep import fit_k, pga_rows, sweep_rows
    from ..metrics.sample_size import warn_low_sample

    progress = progress_from_args(args)
    config = layer_config_from_args(args, logit_lens=False)
    texts = load_texts_from_args(args)
    # a k that cannot fit the rows (texts, or sampled tokens) stops before the model loads
    fit_k(config.k, n=sweep_rows(len(texts), config.pooling), ccr=config.ccr)
    model = load_model_from_args(args)
    acts = extract(model, texts, layers=config.layers, pooling=config.pooling,
                   max_length=config.max_length, batch_size=config.batch_size,
                   cache=not args.no_cache, seed=config.seed, progress=progress)
    config, note = config.fitted(int(acts.states.shape[1]), model.width)
    if note is not None:
        warn_low_sample(note)
    rows, tidy = pga_rows(model, acts, config, revision=args.revision or "")
    print(f"Subspace PGA — {model.name}, {len(texts)} texts ({texts.source}), pooling={config.pooling}, "
          f"k={config.k}, n_null={config.n_null}, readout={config.readout}, seed={config.seed}")
    print_table(rows, floatfmt="{:.4g}")
    if args.csv:
        with atomic_path(args.csv) as tmp:
            tidy.to_csv(tmp, index=False)
        print(f"\nwrote {args.csv}")
    return 0
