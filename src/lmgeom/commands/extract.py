"""``lmgeom extract``: pooled hidden states to an activations file (.safetensors + .json)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .options import (
    add_engine_args,
    add_extract_args,
    add_model_args,
    add_options,
    add_texts_args,
    arg,
    engine_from_args,
    load_texts_from_args,
    model_options_from_args,
    print_table,
    progress_from_args,
)
from .types import path_arg, positive_int, seed_int

NAME = "extract"
HELP = "extract pooled hidden states of every layer into an activations file"
DESCRIPTION = (
    "Run the model over a text set and save one pooled vector per text and layer as "
    "OUT.safetensors (tensor 'states', shape (n_layers, N, d), float32) plus OUT.json (layers, "
    "model identity, texts hash, settings). Load it back with lmgeom.load_activations(OUT). "
    "Results are cached; an interrupted run resumes where it stopped."
)


@dataclass(frozen=True)
class OutputArgs:
    """Where the activations go.

    Attributes:
        out: output path stem: OUT.safetensors + OUT.json, OUT.parquet, or the dataset folder
            OUT (--format hf).
        format: safetensors (one (layers, N, d) tensor), parquet (one row per text or token,
            one column per layer) or hf (a datasets.Dataset saved with save_to_disk); read any
            back with lmgeom.activations.from_disk(OUT).
        push_to_hub: with --format hf: also push the dataset to this hub repo (ORG/NAME; needs
            a reachable hub and a token).
        n_tokens: tokens sampled for --pooling tokens.
        seed: seed of text and token sampling.
        quiet: no progress bar.
    """

    out: str = field(default="activations", metadata=arg(type=path_arg))
    format: str = field(default="safetensors",
                        metadata=arg(choices=("safetensors", "parquet", "hf")))
    push_to_hub: str | None = field(default=None, metadata=arg(metavar="REPO"))
    n_tokens: int = field(default=2048, metadata=arg(type=positive_int))
    seed: int = field(default=0, metadata=arg(type=seed_int))
    quiet: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p)
    add_extract_args(p)
    add_options(p, OutputArgs, title="output")
    add_engine_args(p, extraction=True)


def run(args) -> int:
    from ..activations.export import check_export, claim_export

    check_export(None, format=args.format, push_to_hub=args.push_to_hub)  # before any forward
    # the output paths are checked (never a file lmgeom did not write) and locked against a
    # second run for the whole command, so two runs on one --out cannot both "succeed"
    with claim_export(args.out, args.format):
        return _run(args)


def _run(args) -> int:
    from ..activations.export import export_activations
    from ..experiments.extract import extract_activations, layer_summary

    progress = progress_from_args(args)
    engine = engine_from_args(args)
    texts = load_texts_from_args(args)  # cheap: fail fast on a bad corpus before loading the model
    acts = extract_activations(
        args.model, texts, model_options=model_options_from_args(args), engine=engine,
        layers=args.layers, pooling=args.pooling, max_length=args.max_length,
        batch_size=args.batch_size, cache=not args.no_cache, n_tokens=args.n_tokens,
        seed=args.seed, progress=progress)
    written = export_activations(acts, args.out, format=args.format,
                                 push_to_hub=args.push_to_hub)
    print(f"{acts.model}: {len(acts.layers)} layers x {acts.states.shape[1]} vectors x d={acts.states.shape[2]} "
          f"({args.pooling} pooling, {len(texts)} texts from {texts.source}; {acts.n_truncated} truncated "
          f"to {args.max_length} tokens)")
    print_table(layer_summary(acts))
    t = acts.timings
    where = f" on {t['workers']} Ray workers" if "workers" in t else ""
    pushed = f", pushed to {args.push_to_hub}" if args.push_to_hub else ""
    print(f"\nwrote {' and '.join(map(str, written))}{pushed}  "
          f"({t['batches_computed']} batches computed{where}, "
          f"{t['batches_cached']} from cache, {t['extract_s']:.1f} s)")
    return 0
