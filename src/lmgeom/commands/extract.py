"""``lmgeom extract``: pooled hidden states to an activations file (.safetensors + .json)."""

from __future__ import annotations

import argparse

from .options import (
    add_engine_args,
    add_extract_args,
    add_model_args,
    add_texts_args,
    load_texts_from_args,
    path_arg,
    positive_int,
    print_table,
    progress_from_args,
    seed_int,
)

NAME = "extract"
HELP = "extract pooled hidden states of every layer into an activations file"
DESCRIPTION = (
    "Run the model over a text set and save one pooled vector per text and layer as "
    "OUT.safetensors (tensor 'states', shape (n_layers, N, d), float32) plus OUT.json (layers, "
    "model identity, texts hash, settings). Load it back with lmgeom.load_activations(OUT). "
    "Results are cached; an interrupted run resumes where it stopped."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p)
    add_extract_args(p)
    g = p.add_argument_group("output")
    g.add_argument("--out", default="activations", type=path_arg,
                   help="output path stem: OUT.safetensors + OUT.json, OUT.parquet, or the "
                        "dataset folder OUT (--format hf)")
    g.add_argument("--format", default="safetensors", choices=["safetensors", "parquet", "hf"],
                   help="safetensors (one (layers, N, d) tensor), parquet (one row per text or "
                        "token, one column per layer) or hf (a datasets.Dataset saved with "
                        "save_to_disk); read any back with lmgeom.activations.from_disk(OUT)")
    g.add_argument("--push-to-hub", default=None, metavar="REPO",
                   help="with --format hf: also push the dataset to this hub repo (ORG/NAME; "
                        "needs a reachable hub and a token)")
    g.add_argument("--n-tokens", type=positive_int, default=2048, help="tokens sampled for --pooling tokens")
    g.add_argument("--seed", type=seed_int, default=0, help="seed of text and token sampling")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
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
    from .options import engine_from_args, model_options_from_args

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
