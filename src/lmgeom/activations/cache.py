"""The activations cache: content-addressed, verified shards (:class:`ShardCache`) under
``$LMGEOM_CACHE/activations/<key>``, and the version that is part of every extraction key.

The leaf of :mod:`lmgeom.activations`: it imports none of its siblings.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy as stnp  # stnp.save_file at call time: tests fault-inject it
from filelock import FileLock
from safetensors import safe_open

from .._io import atomic_path, sha256_bytes, write_json
from .._paths import cache_dir, check_writable_path
from ..errors import CacheError

log = logging.getLogger(__name__)

#: Bump when a change to extraction changes the numbers it produces (part of cache keys).
EXTRACT_VERSION = "1"


class ShardCache:
    """A folder of verified shards ``shard-XXXXX.safetensors`` for one cache key."""

    def __init__(self, key: str, settings: dict[str, Any], enabled: bool, root: Path | None):
        self.enabled = enabled
        self.key = key
        self.dir = (Path(root).expanduser() if root is not None
                    else cache_dir("activations", create=enabled)) / key
        if enabled:
            if root is not None:
                check_writable_path(self.dir, option="cache_root")
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(f"cache_root {root}: cannot create {self.dir} "
                                 f"({exc.strerror or exc}); give a writable folder, or "
                                 "cache=False") from exc
            meta = self.dir / "meta.json"
            if not meta.is_file():
                write_json(meta, settings)

    def path(self, i: int) -> Path:
        return self.dir / f"shard-{i:05d}.safetensors"

    def get(self, i: int) -> dict[str, np.ndarray] | None:
        if not self.enabled:
            return None
        p = self.path(i)
        if not p.is_file():
            return None

        try:
            with safe_open(str(p), framework="np") as fh:
                want = (fh.metadata() or {}).get("sha256")
            tensors = stnp.load_file(str(p))
            if want is None or tensors_digest(tensors) != want:
                raise ValueError("checksum mismatch")
            return tensors
        except Exception as exc:  # corrupt or truncated: never use it, recompute
            log.warning("cache shard %s is corrupt (%s); recomputing it", p.name, exc)
            p.unlink(missing_ok=True)
            return None

    def put(self, i: int, tensors: dict[str, np.ndarray]) -> None:
        if not self.enabled:
            return

        tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        need = sum(v.nbytes for v in tensors.values()) + 4096
        with atomic_path(self.path(i), need=need) as tmp:
            stnp.save_file(tensors, str(tmp), metadata={"sha256": tensors_digest(tensors)})

    def drop_stale(self) -> None:
        """Remove temporaries a killed writer left (call with the lock held)."""
        if self.enabled:
            for stale in self.dir.glob(".*.tmp"):
                stale.unlink(missing_ok=True)

    def lock(self):
        if not self.enabled:
            return contextlib.nullcontext()

        return FileLock(str(self.dir) + ".lock")




def tensors_digest(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes (the shard checksum)."""
    parts = []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        parts.append(f"{name}:{a.dtype}:{a.shape}:".encode() + sha256_bytes(a.tobytes()).encode())
    return sha256_bytes(b"|".join(parts))




def clear_cache(key: str | None = None) -> None:
    """Delete one activations cache entry (or all of them)."""
    root = cache_dir("activations")
    target = root / key if key else root
    shutil.rmtree(target, ignore_errors=True)
