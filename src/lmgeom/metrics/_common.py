"""Shared input handling for the metrics: array conversion, typed errors, finiteness checks.

Every public metric accepts numpy arrays or torch tensors (any dtype, any device) and an
optional ``label`` (for example ``"layer 12"``) that is prefixed to every error message, so a
caller looping over layers gets messages such as ``"layer 12: X contains 3 NaN ..."``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from lmgeom.errors import ConfigError, DataError

__all__ = [
    "as_matrix",
    "blas_threads",
    "check_finite",
    "check_int",
    "check_seed",
    "config_error",
    "data_error",
    "is_torch",
    "pow2_normalise",
    "to_numpy",
]


def _prefix(label: str | None) -> str:
    return f"{label}: " if label else ""


def config_error(message: str, label: str | None = None) -> ConfigError:
    """Build a :class:`ConfigError` whose message is prefixed with ``label``."""
    return ConfigError(_prefix(label) + message)


def data_error(message: str, label: str | None = None) -> DataError:
    """Build a :class:`DataError` whose message is prefixed with ``label``."""
    return DataError(_prefix(label) + message)


def is_torch(x: Any) -> bool:
    """True when ``x`` is a ``torch.Tensor`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def to_numpy(x: Any, *, name: str = "array", label: str | None = None) -> np.ndarray:
    """Convert ``x`` (numpy, torch on any device and dtype, nested lists) to a float64 ndarray.

    Half-precision torch tensors (float16 / bfloat16) are widened before the copy. The result
    owns its memory only when a conversion was needed; callers that modify it must copy.
    """
    if is_torch(x):
        t = x.detach()
        if t.is_complex():
            raise data_error(f"{name} is complex ({_torch_dtype_name(t)}); pass real values", label)
        if t.dtype.is_floating_point and t.element_size() < 4:
            t = t.float()
        return np.asarray(t.cpu().numpy(), dtype=np.float64)
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001  # pragma: no cover - exotic inputs
        raise data_error(f"{name} cannot be converted to an array: {exc}", label) from None
    if arr.dtype.kind == "c":
        raise data_error(f"{name} is complex ({arr.dtype}); pass real values", label)
    if arr.dtype.kind not in "biuf":
        raise data_error(
            f"{name} has dtype {arr.dtype}; pass a numeric array (numpy or torch)", label
        )
    return np.asarray(arr, dtype=np.float64)


def check_finite(a: np.ndarray, *, name: str, label: str | None = None,
                 source_dtype: str | None = None) -> None:
    """Raise :class:`DataError` if ``a`` holds NaN or Inf, saying how many and the likely cause."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = a.sum()
    if np.isfinite(total):
        return
    n_nan = int(np.count_nonzero(np.isnan(a)))
    n_inf = int(np.count_nonzero(np.isinf(a)))
    if n_nan == 0 and n_inf == 0:
        return  # the sum overflowed, the values are finite
    rows = ""
    if a.ndim == 2:
        bad_rows = np.flatnonzero(~np.isfinite(a).all(axis=1))
        shown = ", ".join(str(int(r)) for r in bad_rows[:5])
        more = "" if bad_rows.size <= 5 else ", ..."
        rows = f" in {bad_rows.size} of {a.shape[0]} rows (rows {shown}{more})"
    hint = "a common cause is float16 overflow (|x| > 65504) in the model's activations"
    if source_dtype in ("float16", "half"):
        hint = "the input is float16, so overflow (|x| > 65504) is the likely cause"
    raise data_error(
        f"{name} contains {n_nan} NaN and {n_inf} Inf values{rows}; {hint} — "
        "extract in bfloat16 or float32, or drop the affected rows",
        label,
    )


def as_matrix(x: Any, *, name: str = "X", label: str | None = None,
              min_rows: int = 1) -> np.ndarray:
    """Convert to a finite, C-contiguous float64 matrix of shape (n, d), with n >= ``min_rows``."""
    src = _torch_dtype_name(x) if is_torch(x) else str(getattr(x, "dtype", "")) or None
    arr = to_numpy(x, name=name, label=label)
    if arr.ndim != 2:
        raise data_error(
            f"{name} must be a 2-D array (n, d); got shape {tuple(arr.shape)}", label
        )
    n, d = arr.shape
    if d < 1:
        raise data_error(f"{name} has no columns (shape {tuple(arr.shape)})", label)
    if n < min_rows:
        raise data_error(
            f"{name} has {n} rows; at least {min_rows} are needed — pass more texts", label
        )
    arr = np.ascontiguousarray(arr)
    check_finite(arr, name=name, label=label, source_dtype=src)
    return arr


#: Below this many floating-point operations a BLAS/LAPACK call runs single-threaded: on small
#: matrices OpenBLAS's threads cost more than they save (measured up to 100x slower on a busy
#: 2-core machine), and the PGA machinery parallelises over null frames instead.
SMALL_FLOPS = 2e9


@functools.lru_cache(maxsize=1)
def _controller() -> Any:
    try:
        return ThreadpoolController()
    except Exception:  # noqa: BLE001  # pragma: no cover - threadpoolctl missing or broken
        return None


@contextlib.contextmanager
def blas_threads(flops: float = 0.0) -> Iterator[None]:
    """Limit BLAS to one thread for the duration when the work is below :data:`SMALL_FLOPS`
    (restored afterwards; a no-op without threadpoolctl)."""
    ctl = _controller() if flops < SMALL_FLOPS else None
    if ctl is None:
        yield
        return
    with ctl.limit(limits=1, user_api="blas"):
        yield


def pow2_normalise(a: np.ndarray) -> np.ndarray:
    """Scale by a power of two so that max |a| is in [0.5, 1): exact (every ratio, cosine and
    rank is unchanged bit for bit) and safe from overflow in squares and Gram matrices."""
    top = float(np.max(np.abs(a))) if a.size else 0.0
    if top == 0.0 or not np.isfinite(top):
        return a
    _, e = np.frexp(top)
    if e == 0:
        return a
    return np.ldexp(a, -int(e))


def check_int(value: Any, *, name: str, minimum: int | None = None,
              label: str | None = None) -> int:
    """Validate an integer option (bools rejected) and return it as ``int``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise config_error(f"{name} must be an integer; got {value!r}", label)
    value = int(value)
    if minimum is not None and value < minimum:
        raise config_error(f"{name} must be >= {minimum}; got {value}", label)
    return value


def check_seed(seed: Any, *, label: str | None = None) -> int:
    """Seeds are non-negative integers (they feed ``numpy.random.default_rng``)."""
    return check_int(seed, name="seed", minimum=0, label=label)
