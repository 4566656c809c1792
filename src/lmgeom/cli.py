"""The ``lmgeom`` command-line tool: a thin layer over the library.

Each sub-command lives in ``lmgeom.commands.<name>`` and defines ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. ``main(argv)`` is what tests call.

Every error ends in ONE stderr line ``lmgeom CMD: error: ...`` that names the input and the fix:

* a bad option value (``--n 0``, ``--seed -1``, ``--dtype x``): argparse, exit 2;
* anything :func:`~lmgeom.commands.checks.validate_args` finds before the command starts
  (``LMGEOM_*`` variables, ``--device`` / ``--metrics-device``, ``--revision`` on a model that
  is not on the hub, a missing optional package), and every user mistake the library finds
  (:class:`~lmgeom.errors.LmgeomError`): exit 2;
* an unusable disk (full, read-only: an ``OSError`` naming a file): exit 2;
* Ctrl-C: one line saying what this run finished and kept, exit 130;
* anything else is a bug or an unsupported input: ``unexpected <type>: <message>``, exit 1.

No traceback in any case; ``-v`` logs the traceback of an unexpected error, ``-vv`` of all.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Collection, Sequence

from . import __version__
from ._io import written_summary
from .commands.checks import validate_args
from .commands.options import HelpFormatter, apply_model_args
from .errors import LmgeomError, LowSampleWarning
from .models.bundled import BUNDLED

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
    "claims",
)


def _load(name: str):
    """The module of command ``name``; a command listed in :data:`COMMANDS` without its module
    is a broken install, and fails loudly (``ModuleNotFoundError``), never silently."""
    return importlib.import_module(f"lmgeom.commands.{name}")


class _UsageExit(SystemExit):
    """A command line argparse rejected; the one line is already printed (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with lmgeom's error format: one line, no usage block, a pointer to --help.

    ``argument --n: must be >= 1 (got 0)`` (from the validated types in
    :mod:`lmgeom.commands.options`) reads ``--n must be >= 1 (got 0)``."""

    def error(self, message: str):  # type: ignore[override]
        _usage_error(self.prog, message)


def _usage_error(prog: str, message: str):
    """Print argparse's complaint as lmgeom's one line and exit 2 (``_UsageExit``)."""
    message = " ".join(message.split())
    m = re.match(r"argument ([^:]+): (.*)$", message)
    if m:
        sep = " " if m.group(2).startswith("must be") else ": "
        message = f"{m.group(1)}{sep}{m.group(2)}"
    print(f"{prog}: error: {message}; see `{prog} --help`", file=sys.stderr)
    raise _UsageExit(2)


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``commands``, only those sub-commands get their options
    (the others just their one-line help), so ``lmgeom CMD ...`` and ``lmgeom --help`` never
    build, or import, what the other commands need."""
    parser = _Parser(
        prog="lmgeom",
        description=(
            "Representation geometry of causal language models, layer by layer: "
            "Subspace PGA (is a layer organised for the readout W_U?) and representation "
            "dispersion (how widely a model spreads its contexts). Runs offline on the bundled "
            f"models ({', '.join(BUNDLED)}; `lmgeom models`) and corpora (builtin:NAME), and on "
            "any Hugging Face hub id, local model folder or .gguf file."
        ),
    )
    parser.add_argument("--version", action="version", version=f"lmgeom {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=HelpFormatter,
        )
        if commands is not None and mod.NAME not in commands:
            continue
        mod.add_arguments(p)
        repeatable = tuple(a.dest for a in p._actions if isinstance(a, argparse._AppendAction))
        p.set_defaults(_run=mod.run, _list_options=repeatable)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command an argument list names: its first word that is not an option (the
    top-level options take no value), when it is a command; else ``None``."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_of(argv)
    parser = build_parser([command] if command else [])
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # named after the sub-command they were given to, not "lmgeom"
            prog = _prog(args) if getattr(args, "command", None) else parser.prog
            _usage_error(prog, f"unrecognized arguments: {' '.join(extra)}")
    except _UsageExit as exc:
        return int(exc.code or 2)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    log = logging.getLogger(__name__)
    prog = _prog(args)
    _configure_logging(level, prog)
    try:
        apply_model_args(args)
        validate_args(args)  # before any work: environment, devices, optional packages
        with warnings.catch_warnings():
            warnings.formatwarning = _warning_format(prog)
            return int(args._run(args) or 0)
    except LmgeomError as exc:
        log.debug("user error", exc_info=True)
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (``lmgeom texts | head``): stop quietly, as shell tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted_line()}", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: one line, never a traceback
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            log.debug("disk error", exc_info=True)
            where = f" {exc.filename}" if exc.filename else ""
            print(f"{prog}: error: cannot write{where}: {exc.strerror or exc}; free space or "
                  "choose a writable --out / LMGEOM_CACHE, then rerun (finished work is kept)",
                  file=sys.stderr)
            return 2
        if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (GPU)
            log.info("out of memory", exc_info=True)
            print(f"{prog}: error: the device ran out of memory ({_one_line(exc, 160)}); lower "
                  "--batch-size or --max-length, use --dtype bfloat16, or run on a device with "
                  "more memory", file=sys.stderr)
            return 2
        log.info("unexpected error", exc_info=True)  # -v: the traceback
        where = ("the traceback is above" if args.verbose
                 else "rerun with -v to see the traceback")
        print(f"{prog}: error: unexpected {type(exc).__name__}: {_one_line(exc, 300)} (this is a "
              f"bug in lmgeom or an unsupported input; {where})", file=sys.stderr)
        return 1


class _CliLogFormat(logging.Formatter):
    """A CLI run's log lines: a warning as the one line every command prints,
    ``lmgeom CMD: warning: ...`` (the same format as :func:`_warning_format`), whichever module
    logged it; ``-v`` / ``-vv`` lines as ``LEVEL logger: message``."""

    def __init__(self, prog: str) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.WARNING:
            return f"{self.prog}: warning: {_one_line(record.getMessage())}"
        return super().format(record)


class _OncePerRun(logging.Filter):
    """Each warning line once per run (a warning logged per batch or per layer says nothing
    new the second time)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        key = f"{record.name}:{record.getMessage()}"
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _configure_logging(level: int, prog: str) -> None:
    """The root logger's level and, unless someone else (an embedding program, pytest's log
    capture) already handles records, one stderr handler in the CLI's format. Replaces the
    handler an earlier :func:`main` call in this process added (its ``prog`` was another)."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "lmgeom_cli", False)]:
        root.removeHandler(h)
    if root.handlers:  # as logging.basicConfig: leave a configured root alone
        return
    root.setLevel(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CliLogFormat(prog))
    handler.addFilter(_OncePerRun())
    handler.lmgeom_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)


def _warning_format(prog: str):
    """``warnings.formatwarning`` for a CLI run: lmgeom's own warnings (a number computed from
    too little data, :class:`~lmgeom.errors.LowSampleWarning`) as one line
    ``lmgeom CMD: warning: ...``; every other warning as Python formats it."""
    original = warnings.formatwarning

    def fmt(message, category, filename, lineno, line=None):
        if issubclass(category, LowSampleWarning):
            return f"{prog}: warning: {_one_line(message)}\n"
        return original(message, category, filename, lineno, line)

    return fmt


def _prog(args) -> str:
    """``lmgeom CMD`` (``lmgeom suite train`` for a nested sub-command)."""
    sub = getattr(args, "suite_command", None) if args.command == "suite" else None
    return f"lmgeom {args.command}" + (f" {sub}" if sub else "")


def _one_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message as one line (a multi-line message would break the one-line
    contract), at most ``limit`` characters."""
    text = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
    if not text:
        text = type(exc).__name__
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


#: ``OSError`` numbers that mean "this disk cannot take the run's files"
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def interrupted_line() -> str:
    """The line an interrupted (Ctrl-C) command prints: what this run finished and kept."""
    kept = written_summary()
    if kept:
        return f"interrupted; kept {kept}; rerun the same command to resume from there"
    return ("interrupted before this run finished anything new (work cached by earlier runs is "
            "kept); rerun the same command to resume")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
