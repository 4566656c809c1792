"""``lmgeom ppl``: per-text perplexity and the corpus perplexity of a model on a text set."""

from __future__ import annotations

import argparse

from ._common import (
    add_model_args,
    add_texts_args,
    load_model_from_args,
    load_texts_from_args,
    print_table,
    progress_from_args,
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
    from pathlib import Path

    from .._io import atomic_path
    from ..errors import ConfigError
    from ..lm.perplexity import perplexity

    progress = progress_from_args(args)
    texts = load_texts_from_args(args)
    model = load_model_from_args(args)
    res = perplexity(model, texts, max_length=args.max_length, stride=args.stride,
                     batch_size=args.batch_size, position_chunk=args.position_chunk,
                     progress=progress)
    df = res.to_frame()
    mode = (f"sliding window {args.max_length}/{args.stride}" if args.stride
            else f"max {args.max_length} tokens, {res.n_truncated} truncated")
    print(f"{model.name} on {texts.source}: {len(res)} texts, {int(df.n_predicted.sum())} scored "
          f"tokens ({mode}, {res.n_windows} model inputs)")
    print(f"corpus perplexity {res.corpus_perplexity:.4g}   mean per text "
          f"{res.mean_perplexity:.4g}   median {res.median_perplexity:.4g}")
    k = max(0, int(args.show))
    if k:
        srt = df.sort_values("perplexity", kind="stable")
        show = srt.tail(k).iloc[::-1] if len(srt) > k else srt.iloc[::-1]
        print(f"\nhighest perplexity ({min(k, len(df))}):")
        print_table(show[["id", "n_tokens", "perplexity"]].to_dict("records"))
        if len(df) > k:
            print(f"\nlowest perplexity ({k}):")
            print_table(srt.head(k)[["id", "n_tokens", "perplexity"]].to_dict("records"))
    if args.out:
        out = Path(args.out)
        suffix = out.suffix.lower()
        if suffix not in (".csv", ".parquet", ".jsonl"):
            raise ConfigError(f"--out {out}: use a .csv, .parquet or .jsonl file name")
        with atomic_path(out) as tmp:
            if suffix == ".csv":
                df.to_csv(tmp, index=False)
            elif suffix == ".parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_json(tmp, orient="records", lines=True)
        print(f"\nwrote {out}")
    return 0
