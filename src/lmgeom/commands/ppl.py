"""``lmgeom ppl``: per-text perplexity and the corpus perplexity of a model on a text set."""

from __future__ import annotations

import argparse

from ._common import (
    add_model_args,
    add_texts_args,
    model_options_from_args,
    progress_from_args,
    text_options_from_args,
)

NAME = "ppl"
HELP = "perplexity per text and of the corpus (chunked readout, optional sliding window)"
DESCRIPTION = (
    "Perplexity exp(mean NLL of tokens 2..T) of every text (the tokenizer's special tokens "
    "included, so a prepended BOS makes every real token scored) and the corpus perplexity "
    "exp(sum NLL / sum scored tokens). Texts longer than --max-length are truncated unless "
    "--stride is given: then windows of --max-length tokens start every --stride tokens and "
    "each token is scored once with the most context its window allows. The readout runs over "
    "chunks of positions, so the B x T x V logits are never built. --out writes the per-text "
    "table (.csv, .parquet or .jsonl by extension)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p, n=None)
    g = p.add_argument_group("perplexity")
    g.add_argument("--max-length", type=int, default=512, help="tokens per model input")
    g.add_argument("--stride", type=int, default=None,
                   help="sliding-window mode: window start every STRIDE tokens (< --max-length)")
    g.add_argument("--batch-size", type=int, default=8, help="inputs per forward pass")
    g.add_argument("--position-chunk", type=int, default=None,
                   help="positions per readout matmul (default: 64 MiB of float32 logits)")
    g.add_argument("--out", default=None, help="write the per-text table here (.csv/.parquet/.jsonl)")
    g.add_argument("--show", type=int, default=10, help="texts to print (highest and lowest)")
    g.add_argument("--seed", type=int, default=0, help="seed of the --n text sample")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    from ..lm.perplexity import perplexity

    progress = progress_from_args(args)
    texts = text_options_from_args(args).load()
    model = model_options_from_args(args).load(args.model)
    res = perplexity(model, texts, max_length=args.max_length, stride=args.stride,
                     batch_size=args.batch_size, position_chunk=args.position_chunk,
                     progress=progress)
    print(res.summary(show=args.show))
    if args.out:
        print(f"\nwrote {res.write(args.out)}")
    return 0
