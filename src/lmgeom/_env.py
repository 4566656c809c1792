"""The ``LMGEOM_*`` environment variables, read in one place.

Every numeric variable is parsed here (:func:`env_int`, :func:`env_float`), so a bad value
(``LMGEOM_FRAME_CACHE_MB=abc``) is a :class:`~lmgeom.errors.ConfigError` that names the variable
and what it accepts, never a silent fallback or a ``ValueError`` from deep inside a run. :func:`check_environment` reads them all;
the CLI calls it before any work.

Free-form variables (paths, flags) are read where they are used: ``LMGEOM_CACHE`` (checked by
``lmgeom._paths.check_cache_writable``), ``LMGEOM_WHEELS``, ``LMGEOM_QUIET`` and the
``LMGEOM_TEST_*`` and ``LMGEOM_PAUSE_*`` hooks of ``lmgeom._testing``.
"""

from __future__ import annotations

import math
import os
from typing import Any

from .errors import ConfigError


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"between {minimum:g} and {maximum:g}"
    if minimum is not None:
        return f">= {minimum:g}"
    if maximum is not None:
        return f"<= {maximum:g}"
    return "finite"


def env_float(name: str, default: float, *, minimum: float | None = None,
              maximum: float | None = None, meaning: str = "") -> float:
    """``float($name)``, ``default`` when unset or blank.

    Raises:
        ConfigError: not a number, not finite, or outside ``[minimum, maximum]``; the message
            names the variable, the value, what it accepts and how to fix it.
    """
    return _env_number(name, default, float, "a number", f"{default:g}", minimum, maximum,
                       meaning)


def env_int(name: str, default: int, *, minimum: int | None = None,
            maximum: int | None = None, meaning: str = "") -> int:
    """``int($name)``, ``default`` when unset or blank (raises like :func:`env_float`)."""
    return _env_number(name, default, int, "an integer", str(default), minimum, maximum,
                       meaning)


def _env_number(name: str, default: Any, parse: Any, kind: str, shown: str,
                minimum: Any, maximum: Any, meaning: str) -> Any:
    text = _raw(name)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        what = f" ({meaning})" if meaning else ""
        raise ConfigError(f"environment variable {name}={os.environ[name]!r} is not {kind} "
                          f"{_bounds(minimum, maximum)}{what}; set it to one (default "
                          f"{shown}) or unset it")
    return value


# ----------------------------------------------------------------------- the variables

def frame_cache_mb() -> float:
    """``LMGEOM_FRAME_CACHE_MB``: MB the null-frame cache may hold (default 512; 0 = off)."""
    return env_float("LMGEOM_FRAME_CACHE_MB", 512.0, minimum=0.0,
                     meaning="MB of memory for the PGA null-frame cache; 0 turns it off")


def hold_seconds() -> float:
    """``LMGEOM_TEST_HOLD_S`` (test hook): the longest a hold waits (default 120 s)."""
    return env_float("LMGEOM_TEST_HOLD_S", 120.0, minimum=0.0, meaning="seconds")


def check_environment() -> None:
    """Parse every numeric ``LMGEOM_*`` variable now (the CLI calls this before
    any work), so a bad value fails at once with a message naming the variable."""
    frame_cache_mb()
    hold_seconds()
