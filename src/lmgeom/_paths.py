"""Where lmgeom keeps its cache: ``$LMGEOM_CACHE``, default ``~/.cache/lmgeom``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str, create: bool = True) -> Path:
    """Return ``$LMGEOM_CACHE/<parts...>`` (created unless ``create=False``)."""
    root = Path(os.environ.get("LMGEOM_CACHE") or Path.home() / ".cache" / "lmgeom").expanduser()
    path = root.joinpath(*parts)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
