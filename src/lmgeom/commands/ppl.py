"""``lmgeom ppl``: per-text perplexity and the corpus perplexity of a model on a text set."""

from __future__ import annotations

import argparse

from .options import (
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
    g.add_argument("--per-token", nargs="?", const="", default=None, metavar="PATH",
                   help="also stream token-level NLL (id, position, token_id, token, nll) to "
                        "parquet: PATH, or OUT.tokens.parquet beside --out (else "
                        "ppl-tokens.parquet)")
    g.add_argument("--log-samples", nargs="?", const="", default=None, metavar="PATH",
                   help="also write one row per text (id, label, n_tokens, truncated, NLL, "
                        "perplexity) to PATH (default: OUT.samples.parquet / samples.parquet)")
    g.add_argument("--show", type=int, default=10, help="texts to print (highest and lowest)")
    g.add_argument("--seed", type=int, default=0, help="seed of the --n text sample")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def _beside(args, given: str | None, suffix: str, fallback: str) -> str | None:
    if given is None:
        return None
    if given:
        return given
    if args.out:
        from pathlib import Path

        out = Path(args.out)
        return str(out.with_name(f"{out.stem}.{suffix}.parquet"))
    return fallback


def run(args) -> int:
    import contextlib

    from ..lm.perplexity import TokenNLLWriter, perplexity

    progress = progress_from_args(args)
    texts = text_options_from_args(args).load()
    model = model_options_from_args(args).load(args.model)
    tokens_path = _beside(args, args.per_token, "tokens", "ppl-tokens.parquet")
    with (TokenNLLWriter(tokens_path, model.tokenizer, texts.ids) if tokens_path
          else contextlib.nullcontext()) as writer:
        res = perplexity(model, texts, max_length=args.max_length, stride=args.stride,
                         batch_size=args.batch_size, position_chunk=args.position_chunk,
                         progress=progress, token_nll=writer)
    print(res.summary(show=args.show))
    if args.out:
        print(f"\nwrote {res.write(args.out)}")
    if writer is not None:
        print(f"wrote {tokens_path} ({writer.n_rows:,} scored tokens)")
    samples_path = _beside(args, args.log_samples, "samples", "samples.parquet")
    if samples_path:
        from .._io import atomic_path
        from ..experiments.samples import perplexity_samples

        with atomic_path(samples_path) as tmp:
            perplexity_samples(model, texts, res).to_parquet(tmp, index=False)
        print(f"wrote {samples_path} ({len(texts)} texts)")
    return 0
