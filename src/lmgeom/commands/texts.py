"""``lmgeom texts``: list, fetch and preview corpora."""

from __future__ import annotations

import argparse
import time

from .options import nonneg_int, positive_int, seed_int

NAME = "texts"
HELP = "list the built-in corpora, fetch them, or preview any corpus spec"
DESCRIPTION = (
    "Without arguments: a table of the built-in offline corpora (builtin:NAME). "
    "--fetch: download and build them into the cache (idempotent; quick when already done). "
    "SPEC: load builtin:NAME, a local .txt/.jsonl/.csv/.tsv/.parquet file or hf:NAME[:CONFIG]"
    "[:SPLIT] and print its size, label counts and first texts."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "spec",
        nargs="?",
        default=None,
        help="corpus to preview: builtin:NAME, a file path, or hf:NAME[:CONFIG][:SPLIT]",
    )
    parser.add_argument(
        "--fetch",
        nargs="*",
        metavar="NAME",
        default=None,
        help="fetch built-in corpora into the cache (all, or the NAMEs given)",
    )
    parser.add_argument("--force", action="store_true", help="with --fetch: rebuild even if cached")
    parser.add_argument("--limit", type=positive_int, default=None, help="seeded sample of N texts")
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of the --limit sample")
    parser.add_argument(
        "--split",
        default=None,
        help=".txt: lines|paragraphs; hf: the dataset split",
    )
    parser.add_argument("--text-column", default=None, help="column holding the texts")
    parser.add_argument("--label-column", default=None, help="column holding the labels")
    parser.add_argument("--show", type=nonneg_int, default=5, help="how many texts to preview")
    parser.add_argument("--width", type=positive_int, default=100, help="preview line width (characters)")


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
