"""``lmgeom suite``: train a width suite of small GPT-NeoX models (``train``), or describe one
(``info``)."""

from __future__ import annotations

import argparse

from .options import (
    float_range,
    int_range,
    nonneg_float,
    nonneg_int,
    open_fraction,
    path_arg,
    positive_float,
    positive_int,
    seed_int,
)

NAME = "suite"
HELP = "train a width suite of small Pythia-architecture models with checkpoints (train), or inspect one (info)"
DESCRIPTION = (
    "`lmgeom suite train --out DIR` trains GPT-NeoX models (Pythia's architecture) that differ "
    "only in width, from scratch on the offline corpora, with one shared byte-level BPE "
    "tokenizer, identical data order and seed, and saves Pythia-style log-spaced checkpoints "
    "as ordinary Hugging Face folders DIR/<width>/step<N>/ with the held-out loss of each and a "
    "DIR/manifest.json. Rerunning resumes an interrupted run and skips finished widths; new "
    "widths can be added to an existing suite. `lmgeom suite info DIR` summarises a suite. "
    "Analyse it with `lmgeom sweep --suite DIR`."
)

_S = argparse.SUPPRESS


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..training.suite import DEFAULT_TEXTS, SuiteConfig

    d = SuiteConfig()
    sub = p.add_subparsers(dest="suite_command", metavar="SUBCOMMAND")
    p.set_defaults(_suite_parser=p)
    t = sub.add_parser("train", help="train (or resume, or extend) a suite",
                       description="Train a width suite (resumes / skips finished widths).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--out", required=True, type=path_arg, metavar="DIR", help="suite folder")
    t.add_argument("--micro", action="store_true",
                   help="tiny configuration for tests and smoke runs (widths 16,32, 2 layers, "
                        "768 tokens, builtin:news); other options override it")
    g = t.add_argument_group("models (default values in brackets)")
    g.add_argument("--widths", default=_S,
                   help=f"comma list of widths [{','.join(map(str, d.widths))}]")
    g.add_argument("--n-layers", type=positive_int, default=_S, help=f"blocks per model, all widths [{d.n_layers}]")
    g = t.add_argument_group("training (default values in brackets)")
    g.add_argument("--tokens", type=positive_int, default=_S, help=f"training tokens per width [{d.tokens}]")
    g.add_argument("--seq-len", type=int_range(2), default=_S, help=f"tokens per sequence [{d.seq_len}]")
    g.add_argument("--batch-size", type=positive_int, default=_S, help=f"sequences per step [{d.batch_size}]")
    g.add_argument("--lr", type=positive_float, default=_S, help=f"peak learning rate [{d.lr}]")
    g.add_argument("--warmup-frac", type=float_range(0, 1, hi_open=True), default=_S, help=f"warmup fraction of the steps [{d.warmup_frac}]")
    g.add_argument("--weight-decay", type=nonneg_float, default=_S, help=f"AdamW weight decay [{d.weight_decay}]")
    g.add_argument("--seed", type=seed_int, default=_S, help=f"data split, order and init seed [{d.seed}]")
    g.add_argument("--regular-checkpoints", type=nonneg_int, default=_S, dest="n_regular",
                   help=f"evenly spaced checkpoints besides 0,1,2,4,... [{d.n_regular}]")
    g.add_argument("--no-bf16", action="store_true", help="train in float32 (default: bf16 autocast)")
    g = t.add_argument_group("data (default values in brackets)")
    g.add_argument("--texts", action="append", default=_S, metavar="SPEC",
                   help=f"training corpus; repeat for several [{' '.join(DEFAULT_TEXTS)}]")
    g.add_argument("--exclude-texts", action="append", default=_S, metavar="SPEC",
                   help=f"corpus whose texts are kept out of training; 'none' for none "
                        f"[{' '.join(d.exclude_texts)}]")
    g.add_argument("--vocab-size", type=positive_int, default=_S, help=f"BPE vocabulary size [{d.vocab_size}]")
    g.add_argument("--val-fraction", type=open_fraction, default=_S,
                   help=f"held-out fraction of the documents [{d.val_fraction}]")
    g.add_argument("--val-tokens", type=positive_int, default=_S,
                   help=f"held-out tokens evaluated per checkpoint [{d.val_tokens}]")
    g = t.add_argument_group("run")
    g.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch threads (1 is fastest on a shared machine; 0 = torch's default)")
    g.add_argument("--resume-every", type=positive_float, default=300.0, metavar="SECONDS",
                   help="also save the resume state this often between checkpoints")
    g.add_argument("--overwrite", action="store_true",
                   help="replace a suite in --out that was trained with other settings")
    g.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(_suite_run=_train)

    i = sub.add_parser("info", help="summarise a suite folder",
                       description="Widths, shapes, checkpoints, validation losses, timings.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    i.add_argument("dir", metavar="DIR", help="suite folder")
    i.add_argument("--steps", action="store_true", help="list every checkpoint's validation loss")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    i.set_defaults(_suite_run=_info)


def run(args) -> int:
    fn = getattr(args, "_suite_run", None)
    if fn is None:
        args._suite_parser.print_help()
        return 0
    return int(fn(args) or 0)


_FIELDS = ("n_layers", "tokens", "seq_len", "batch_size", "lr", "warmup_frac", "weight_decay",
           "seed", "n_regular", "vocab_size", "val_fraction", "val_tokens")


def config_from_args(args):
    """The :class:`~lmgeom.training.suite.SuiteConfig` of ``suite train`` options."""
    from ..training.suite import SuiteConfig
    from .options import int_list

    over = {f: getattr(args, f) for f in _FIELDS if hasattr(args, f)}
    if hasattr(args, "widths"):
        over["widths"] = tuple(int_list(args.widths, "--widths") or ())
    if hasattr(args, "texts"):
        over["texts"] = tuple(args.texts)
    if hasattr(args, "exclude_texts"):
        over["exclude_texts"] = tuple(x for x in args.exclude_texts if x.lower() != "none")
    if args.no_bf16:
        over["bf16"] = False
    return SuiteConfig.micro(**over) if args.micro else SuiteConfig(**over)


def _train(args) -> int:
    import time

    from ..training.suite import plan_line, train_suite, widths_table
    from .options import progress_from_args

    config = config_from_args(args)
    print(plan_line(args.out, config))
    t = time.perf_counter()
    manifest = train_suite(args.out, config, overwrite=args.overwrite,
                           progress=progress_from_args(args),
                           resume_every_s=args.resume_every, threads=args.threads or None)
    print(widths_table(manifest))
    print(f"\nwrote {args.out}/manifest.json and {len(manifest['widths'])} width folder(s) in "
          f"{time.perf_counter() - t:.1f} s; analyse with: lmgeom sweep --suite {args.out}")
    return 0


def _info(args) -> int:
    import json

    from ..training.suite import describe_suite, read_suite

    m = read_suite(args.dir)
    print(json.dumps(m, indent=2, sort_keys=True) if args.json
          else describe_suite(args.dir, m, steps=args.steps))
    return 0
