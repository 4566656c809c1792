"""``lmgeom texts``: list, fetch and preview corpora."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from .options import add_options, arg
from .types import nonneg_int, positive_int, seed_int

NAME = "texts"
HELP = "list the built-in corpora, fetch them, or preview any corpus spec"
DESCRIPTION = (
    "Without arguments: a table of the built-in offline corpora (builtin:NAME). "
    "--fetch: download and build them into the cache (idempotent; quick when already done). "
    "SPEC: load builtin:NAME, a local .txt/.jsonl/.csv/.tsv/.parquet file or hf:NAME[:CONFIG]"
    "[:SPLIT] and print its size, label counts and first texts."
)


@dataclass(frozen=True)
class TextsArgs:
    """What ``texts`` lists, fetches or previews.

    Attributes:
        spec: corpus to preview: builtin:NAME, a file path, or hf:NAME[:CONFIG][:SPLIT].
        fetch: fetch built-in corpora into the cache (all, or the NAMEs given).
        force: with --fetch: rebuild even if cached.
        limit: seeded sample of N texts.
        seed: seed of the --limit sample.
        split: .txt: lines|paragraphs; hf: the dataset split.
        text_column: column holding the texts.
        label_column: column holding the labels.
        show: how many texts to preview.
        width: preview line width (characters).
    """

    spec: str | None = field(default=None, metadata=arg(flag="spec", nargs="?"))
    fetch: list[str] | None = field(default=None, metadata=arg(nargs="*", metavar="NAME"))
    force: bool = False
    limit: int | None = field(default=None, metadata=arg(type=positive_int))
    seed: int = field(default=0, metadata=arg(type=seed_int))
    split: str | None = None
    text_column: str | None = None
    label_column: str | None = None
    show: int = field(default=5, metadata=arg(type=nonneg_int))
    width: int = field(default=100, metadata=arg(type=positive_int))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, TextsArgs)


def run(args: argparse.Namespace) -> int:
    from ..texts import builtin_table, describe, fetch_builtin, load_texts

    if args.fetch is not None:
        t0 = time.perf_counter()
        names = [n.removeprefix("builtin:") for n in args.fetch] or None
        manifests = fetch_builtin(names, force=args.force)
        n = sum(int(m.get("n_texts") or 0) for m in manifests.values())
        print(
            f"fetched {len(manifests)} built-in corpora ({n:,} texts) in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        if args.spec is None:
            return 0
    if args.spec is None:
        print(builtin_table())
        return 0
    ts = load_texts(args.spec, limit=args.limit, seed=args.seed, split=args.split,
                    text_column=args.text_column, label_column=args.label_column)
    print(describe(ts, show=args.show, width=args.width))
    return 0
