"""``lmgeom ppl``: per-text perplexity and the corpus perplexity of a model on a text set."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from .._io import atomic_path
from ..errors import ConfigError
from .options import (
    add_model_args,
    add_options,
    add_texts_args,
    arg,
    model_options_from_args,
    progress_from_args,
    text_options_from_args,
)
from .types import int_range, nonneg_int, path_arg, positive_int, seed_int

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


@dataclass(frozen=True)
class PplArgs:
    """The perplexity options.

    Attributes:
        max_length: tokens per model input.
        stride: sliding-window mode: window start every STRIDE tokens (< --max-length).
        batch_size: inputs per forward pass.
        position_chunk: positions per readout matmul (default: 64 MiB of float32 logits).
        out: write the per-text table here (.csv/.parquet/.jsonl).
        per_token: also stream token-level NLL (id, position, token_id, token, nll) to parquet:
            PATH, or OUT.tokens.parquet beside --out (else ppl-tokens.parquet).
        log_samples: also write one row per text (id, label, n_tokens, truncated, NLL,
            perplexity) to PATH (default: OUT.samples.parquet / samples.parquet).
        show: texts to print (highest and lowest).
        seed: seed of the --n text sample.
        quiet: no progress bar.
    """

    max_length: int = field(default=512, metadata=arg(type=int_range(2)))
    stride: int | None = field(default=None, metadata=arg(type=positive_int))
    batch_size: int = field(default=8, metadata=arg(type=positive_int))
    position_chunk: int | None = field(default=None, metadata=arg(type=positive_int))
    out: str | None = field(default=None, metadata=arg(type=path_arg))
    # no path_arg: argparse would apply it to const "" (the option given without a value)
    per_token: str | None = field(default=None, metadata=arg(nargs="?", const="",
                                                             metavar="PATH"))
    log_samples: str | None = field(default=None, metadata=arg(nargs="?", const="",
                                                               metavar="PATH"))
    show: int = field(default=10, metadata=arg(type=nonneg_int))
    seed: int = field(default=0, metadata=arg(type=seed_int))
    quiet: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p, n=None)
    add_options(p, PplArgs, title="perplexity")


def _beside(args, given: str | None, suffix: str, fallback: str) -> str | None:
    if given is None:
        return None
    if given:
        return given
    if args.out:
        out = Path(args.out)
        return str(out.with_name(f"{out.stem}.{suffix}.parquet"))
    return fallback


def run(args) -> int:
    from ..results.folder import claim_output  # pandas

    tokens_path = _beside(args, args.per_token, "tokens", "ppl-tokens.parquet")
    samples_path = _beside(args, args.log_samples, "samples", "samples.parquet")
    paths = [p for p in (args.out, tokens_path, samples_path) if p]
    if len({str(Path(p).expanduser().resolve()) for p in paths}) < len(paths):
        raise ConfigError("--out, --per-token and --log-samples name the same file; give each "
                          "its own path")
    # every output path is checked (and locked against a second run) before any work
    with contextlib.ExitStack() as claims:
        claims.enter_context(claim_output(args.out, option="--out",
                                          suffixes=(".csv", ".parquet", ".jsonl")))
        claims.enter_context(claim_output(tokens_path, option="--per-token",
                                          suffixes=(".parquet",)))
        claims.enter_context(claim_output(samples_path, option="--log-samples",
                                          suffixes=(".parquet",)))
        return _run(args, tokens_path, samples_path)


def _run(args, tokens_path: str | None, samples_path: str | None) -> int:
    from ..lm.perplexity import TokenNLLWriter, perplexity

    progress = progress_from_args(args)
    texts = text_options_from_args(args).load()
    model = model_options_from_args(args).load(args.model)
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
    if samples_path:
        from ..experiments.samples import perplexity_samples

        with atomic_path(samples_path) as tmp:
            perplexity_samples(model, texts, res).to_parquet(tmp, index=False)
        print(f"wrote {samples_path} ({len(texts)} texts)")
    return 0
