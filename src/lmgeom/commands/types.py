"""Validated argparse types of lmgeom's options: each checks its value as the command line is
parsed, so a bad value fails before any work with one line (``lmgeom CMD: error: --n must be >= 1
(got 0)``, see ``lmgeom.cli._Parser``). Commands reach them through
:mod:`lmgeom.commands.options`."""

from __future__ import annotations

import argparse
import math

from ..errors import ConfigError

# --------------------------------------------------------------------------- list parsers


def int_list(text: str | None, option: str) -> list[int] | None:
    """``"64,128"`` → ``[64, 128]``; empty or ``None`` → ``None``; anything else a clear error
    that names ``option``."""
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()] or None
    except ValueError as exc:
        raise ConfigError(f"{option} must be a comma-separated list of integers, "
                          f"got {text!r}") from exc


def float_list(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated numbers."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def float_or_auto(text: str):
    """argparse type: a number or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from exc


def float_or_auto_list(text: str) -> tuple:
    """argparse type: comma-separated numbers or ``auto``."""
    return tuple(float_or_auto(x) for x in text.split(",") if x.strip())


# --------------------------------------------------------------------------- validated numbers
# argparse types that check the range as the command line is parsed, so a bad value fails
# before any work with ``lmgeom CMD: error: --n must be >= 1 (got 0)`` (see cli._Parser).

#: the largest --seed (every RNG lmgeom seeds takes it; numpy's legacy and torch's take more)
SEED_MAX = 2**32 - 1


def int_range(lo: int | None = None, hi: int | None = None):
    """argparse type: an integer in ``[lo, hi]`` (either end open when ``None``)."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            want = (f"in {lo}..{hi}" if lo is not None and hi is not None
                    else f">= {lo}" if lo is not None else f"<= {hi}")
            raise argparse.ArgumentTypeError(f"must be {want} (got {value})")
        return value

    parse.__name__ = "int"
    return parse


def float_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False):
    """argparse type: a finite number in the interval ``lo..hi`` (ends open when asked)."""
    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        bad = not math.isfinite(value)
        bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
        bad = bad or (hi is not None and (value >= hi if hi_open else value > hi))
        if bad:
            if lo is not None and hi is not None:
                want = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            elif lo is not None:
                want = f"{'>' if lo_open else '>='} {lo:g}"
            elif hi is not None:
                want = f"{'<' if hi_open else '<='} {hi:g}"
            else:
                want = "a finite number"
            raise argparse.ArgumentTypeError(f"must be {want} (got {text.strip()})")
        return value

    parse.__name__ = "float"
    return parse


positive_int = int_range(1)
nonneg_int = int_range(0)
seed_int = int_range(0, SEED_MAX)
positive_float = float_range(0, lo_open=True)
nonneg_float = float_range(0)
#: a share strictly between 0 and 1 (held-out fractions)
open_fraction = float_range(0, 1, lo_open=True, hi_open=True)
#: a weight in [0, 1] (interpolation lambdas)
unit_float = float_range(0, 1)



def path_arg(text: str) -> str:
    """argparse type of an output path: not empty (an unset shell variable), no NUL."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string (an unset shell "
                                         "variable?)")
    if "\0" in text:
        raise argparse.ArgumentTypeError("must be a path, got a string with a NUL character")
    return text
