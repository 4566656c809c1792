"""The ``lmgeom`` command-line tool: a thin layer over the library.

Each sub-command lives in ``lmgeom.commands.<name>`` and defines ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. ``main(argv)`` is what tests call.
User mistakes (:class:`~lmgeom.errors.LmgeomError`) and an unusable disk (full, read-only:
an ``OSError`` naming a file) print one line and exit 2; Ctrl-C prints one line saying what
this run finished and kept, and exits 130. No traceback in either case (``-vv`` logs it).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from . import __version__
from .errors import LmgeomError

# Order is the order shown in --help.
COMMANDS: tuple[str, ...] = (
    "analyze",
    "pga",
    "extract",
    "models",
    "texts",
    "ppl",
    "dispersion",
    "hardness",
    "clusters",
    "converge",
    "probe",
    "suite",
    "sweep",
    "select",
    "knnlm",
    "train",
)


def _load(name: str):
    try:
        return importlib.import_module(f"lmgeom.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"lmgeom.commands.{name}":
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmgeom",
        description=(
            "Representation geometry of causal language models, layer by layer: "
            "Subspace PGA (is a layer organised for the readout W_U?) and representation "
            "dispersion (how widely a model spreads its contexts). Runs offline on the bundled "
            "models (smollm2-135m, gemma3-270m) and corpora (builtin:*)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"lmgeom {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        if mod is None:
            continue
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        mod.add_arguments(p)
        repeatable = tuple(a.dest for a in p._actions if isinstance(a, argparse._AppendAction))
        p.set_defaults(_run=mod.run, _list_options=repeatable)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        from .commands.options import apply_model_args

        apply_model_args(args)
        return int(args._run(args) or 0)
    except LmgeomError as exc:
        print(f"lmgeom {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (``lmgeom texts | head``): stop quietly, as shell tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        logging.getLogger(__name__).debug("disk error", exc_info=True)
        where = f" {exc.filename}" if exc.filename else ""
        print(f"lmgeom {args.command}: error: cannot write{where}: {exc.strerror or exc}; free "
              "space or choose a writable --out / LMGEOM_CACHE, then rerun (finished work is "
              "kept)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lmgeom {args.command}: {interrupted_line()}", file=sys.stderr)
        return 130


#: ``OSError`` numbers that mean "this disk cannot take the run's files"
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def interrupted_line() -> str:
    """The line an interrupted (Ctrl-C) command prints: what this run finished and kept."""
    from ._io import written_summary

    kept = written_summary()
    if kept:
        return f"interrupted; kept {kept}; rerun the same command to resume from there"
    return ("interrupted before this run finished anything new (work cached by earlier runs is "
            "kept); rerun the same command to resume")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
