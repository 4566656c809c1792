"""``lmgeom suite``: train a width suite of small GPT-NeoX models (``train``), or describe one
(``info``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from ..training.suite_config import SuiteConfig
from .options import add_options, field_docs, option_dest, progress_from_args
from .train import local_types
from .types import int_list, nonneg_int, path_arg, positive_float

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

#: the option groups of ``suite train``: title -> SuiteConfig fields (every field with a
#: ``cli`` entry; the rest are not options)
GROUPS = {
    "models (default values in brackets)": ("widths", "n_layers"),
    "training (default values in brackets)": ("tokens", "seq_len", "batch_size", "lr",
                                              "warmup_frac", "weight_decay", "seed", "n_regular",
                                              "bf16"),
    "data (default values in brackets)": ("texts", "exclude_texts", "vocab_size", "val_fraction",
                                          "val_tokens"),
}


def _shown(value) -> str:
    if isinstance(value, tuple):
        return (",".join if value and isinstance(value[0], int) else " ".join)(map(str, value))
    return str(value)


def _train_options(t: argparse.ArgumentParser) -> None:
    """The :class:`~lmgeom.training.suite.SuiteConfig` options: absent unless given (so
    ``--micro`` can supply other defaults), the default in brackets after the help."""

    d, text = SuiteConfig(), field_docs(SuiteConfig)
    text.update(widths="comma list of widths", bf16="train in float32",
                exclude_texts=text["exclude_texts"] + "; 'none' for none")
    tweak = local_types(SuiteConfig)
    for name in (n for names in GROUPS.values() for n in names):
        default = "bf16 autocast" if name == "bf16" else _shown(getattr(d, name))
        help_ = (f"{text[name]} (default: {default})" if name == "bf16"
                 else f"{text[name]} [{default}]")
        tweak.setdefault(name, {})["help"] = help_
    tweak["widths"]["type"] = str
    for title, names in GROUPS.items():
        add_options(t, SuiteConfig, title=title, only=names, tweak=tweak,
                    defaults=dict.fromkeys(names, _S))


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="suite_command", metavar="SUBCOMMAND")
    p.set_defaults(_suite_parser=p)
    t = sub.add_parser("train", help="train (or resume, or extend) a suite",
                       description="Train a width suite (resumes / skips finished widths).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--out", required=True, type=path_arg, metavar="DIR", help="suite folder")
    t.add_argument("--micro", action="store_true",
                   help="tiny configuration for tests and smoke runs (widths 16,32, 2 layers, "
                        "768 tokens, builtin:news); other options override it")
    _train_options(t)
    g = t.add_argument_group("run")
    g.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch threads (1 is fastest on a shared machine; 0 = torch's default)")
    g.add_argument("--resume-every", type=positive_float, default=300.0, metavar="SECONDS",
                   help="also save the resume state this often between checkpoints")
    g.add_argument("--overwrite", action="store_true",
                   help="replace a suite in --out that was trained with other settings")
    g.add_argument("--quiet", action="store_true", help="no progress bars")
    g.add_argument("--geometry-every", type=nonneg_int, default=0, metavar="STEPS",
                   help="record the geometry trajectory (geometry.parquet: PGA z, dispersion, PC1 "
                        "share, RankMe) also every STEPS steps; 0: at step 0 and every "
                        "checkpoint step")
    g.add_argument("--no-geometry", dest="geometry", action="store_false",
                   help="do not record the geometry trajectory")
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


def config_from_args(args):
    """The :class:`~lmgeom.training.suite.SuiteConfig` of ``suite train`` options: every
    field whose option was given (by name), over :meth:`SuiteConfig.micro` with ``--micro``."""

    over = {f.name: getattr(args, option_dest(f)) for f in dataclasses.fields(SuiteConfig)
            if hasattr(args, option_dest(f))}
    if "widths" in over:
        over["widths"] = tuple(int_list(over["widths"], "--widths") or ())
    for name in ("texts", "exclude_texts"):
        if name in over:
            over[name] = tuple(x for x in over[name] if x.lower() != "none")
    return SuiteConfig.micro(**over) if args.micro else SuiteConfig(**over)


def _train(args) -> int:
    from ..training.suite import train_suite
    from ..training.suite_manifest import plan_line, widths_table

    config = config_from_args(args)
    print(plan_line(args.out, config))
    t = time.perf_counter()
    manifest = train_suite(args.out, config, overwrite=args.overwrite,
                           progress=progress_from_args(args),
                           resume_every_s=args.resume_every, threads=args.threads or None,
                           geometry=args.geometry, geometry_every=args.geometry_every)
    print(widths_table(manifest))
    print(f"\nwrote {args.out}/manifest.json and {len(manifest['widths'])} width folder(s) in "
          f"{time.perf_counter() - t:.1f} s; analyse with: lmgeom sweep --suite {args.out}")
    return 0


def _info(args) -> int:
    from ..training.suite_manifest import describe_suite, read_suite

    m = read_suite(args.dir)
    print(json.dumps(m, indent=2, sort_keys=True) if args.json
          else describe_suite(args.dir, m, steps=args.steps))
    return 0
