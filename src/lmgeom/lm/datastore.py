"""kNN-LM datastores: (context state, next token) pairs of one measurement point, stored
once per content key and searched with FAISS (imported lazily: ``pip install faiss-cpu``, the
``knn`` extra).

Storage (:class:`Datastore`): a folder ``$LMGEOM_CACHE/knnlm/<key>/`` with ``keys.npy``
(float32 ``(n, d)``, opened memory-mapped), ``values.npy`` (int64 ``(n,)``), ``meta.json`` and
any trained FAISS index files ``index-<settings>.faiss``. ``key`` hashes every input that
changes the keys (model weights, tokens, point, dtype, batch size, version); a folder is
written to a temporary name and renamed when complete, so an interrupted build leaves nothing
half-made. Definitions: :mod:`lmgeom.lm.knnlm`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from .._io import sha256_bytes, stable_hash, write_json
from .._paths import cache_dir
from ..activations.forward import model_identity
from ..errors import CacheError, ConfigError, DataError
from .knn_states import as_token_rows, iter_position_states

log = logging.getLogger(__name__)

#: Bump when a change here changes the numbers produced (part of cache keys).
KNNLM_VERSION = "1"
INDEX_KINDS = ("flat", "ivf", "ivfpq")
#: Queries per FAISS search call (bounds the ``(Q, k)`` distance / id arrays).
QUERY_BATCH = 1024


# ---------------------------------------------------------------------- faiss
def require_faiss():
    """Import FAISS or raise a :class:`ConfigError` saying how to install it."""
    try:
        import faiss  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ConfigError(
            "kNN-LM needs FAISS, which is not installed: pip install faiss-cpu "
            "(or install lmgeom with the knn extra: pip install 'lmgeom[knn]')"
        ) from exc
    return faiss


@contextlib.contextmanager
def faiss_threads(n: int | None) -> Iterator[Any]:
    """FAISS with ``n`` OpenMP threads (all when ``n`` is falsy) inside the block."""
    faiss = require_faiss()
    old = faiss.omp_get_max_threads()
    if n:
        faiss.omp_set_num_threads(int(n))
    try:
        yield faiss
    finally:
        faiss.omp_set_num_threads(old)


# ---------------------------------------------------------------------- datastore
@dataclass
class IndexSpec:
    """Which FAISS index to search.

    Attributes:
        kind: ``flat`` (exact ``IndexFlatL2``; default, right for up to ~10⁶ keys), ``ivf``
            (``IndexIVFFlat``) or ``ivfpq`` (``IndexIVFPQ``, compressed; for large stores).
        nlist: IVF cells (default ``clip(round(4·sqrt(n)), 1, n // 39)``).
        nprobe: cells visited per query (default ``min(nlist, 32)``).
        pq_m: PQ sub-quantizers (must divide d; default the largest divisor of d that is
            at most 64).
        pq_bits: bits per PQ code (8).
        train_size: keys used to train IVF/PQ (a seeded sample; default all up to 100 000).
        seed: seed of that sample.
    """

    kind: str = "flat"
    nlist: int | None = None
    nprobe: int | None = None
    pq_m: int | None = None
    pq_bits: int = 8
    train_size: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.kind not in INDEX_KINDS:
            raise ConfigError(f"index must be one of {', '.join(INDEX_KINDS)}, got {self.kind!r}")
        for name in ("nlist", "nprobe", "pq_m", "train_size"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ConfigError(f"{name} must be >= 1, got {v}")

    def resolved(self, n: int, d: int) -> dict[str, Any]:
        """The concrete settings for a store of ``n`` keys of width ``d``."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "flat":
            return out
        nlist = self.nlist or int(np.clip(round(4 * math.sqrt(n)), 1, max(1, n // 39)))
        out.update(nlist=int(nlist), nprobe=int(min(self.nprobe or 32, nlist)),
                   train_size=int(min(n, self.train_size or 100_000)), seed=int(self.seed))
        if self.kind == "ivfpq":
            m = self.pq_m or max(x for x in range(1, min(d, 64) + 1) if d % x == 0)
            if d % int(m):
                raise ConfigError(f"pq_m={m} must divide the key width d={d}")
            out.update(pq_m=int(m), pq_bits=int(self.pq_bits))
        return out


def _index_name(settings: dict[str, Any]) -> str:
    keep = {k: v for k, v in settings.items() if k != "nprobe"}  # nprobe is a search setting
    return "index-" + stable_hash(keep)[:16] + ".faiss"


@dataclass
class Datastore:
    """A kNN-LM datastore on disk: memory-mapped keys, values and cached FAISS indexes.

    Attributes:
        folder: the folder holding ``keys.npy``, ``values.npy``, ``meta.json``.
        point: measurement point of the keys.
        key: content key (the folder name under the cache).
        meta: what built it (model, point, dtype, n rows, tokens hash, ...).
    """

    folder: Path
    point: str
    key: str
    meta: dict[str, Any] = field(default_factory=dict)
    _index_cache: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: Any = field(default=None, repr=False)
    _values: Any = field(default=None, repr=False)

    @classmethod
    def open(cls, folder: str | os.PathLike[str]) -> Datastore:
        folder = Path(folder)
        meta_p = folder / "meta.json"
        if not meta_p.is_file():
            raise CacheError(f"{folder} is not a kNN-LM datastore (no meta.json)")
        try:
            meta = json.loads(meta_p.read_text())
        except ValueError as exc:
            raise CacheError(f"datastore {folder}: unreadable meta.json ({exc}); delete it") from exc
        ds = cls(folder=folder, point=meta["point"], key=meta.get("key", folder.name), meta=meta)
        if ds.keys.shape != (meta["n"], meta["d"]) or ds.values.shape != (meta["n"],):
            raise CacheError(f"datastore {folder} does not match its meta.json; delete it")
        return ds

    @property
    def keys(self) -> np.ndarray:
        """``(n, d)`` float32 keys, memory-mapped (read-only)."""
        if self._keys is None:
            self._keys = np.load(self.folder / "keys.npy", mmap_mode="r")
        return self._keys

    @property
    def values(self) -> np.ndarray:
        """``(n,)`` int64 next-token values."""
        if self._values is None:
            self._values = np.load(self.folder / "values.npy")
        return self._values

    def __len__(self) -> int:
        return int(self.meta["n"])

    @property
    def width(self) -> int:
        return int(self.meta["d"])

    def index(self, spec: IndexSpec | None = None, *, cache: bool = True):
        """The FAISS index over the keys (built once; IVF/PQ indexes are trained on a seeded
        sample of keys and written next to the keys, so a rerun loads them)."""
        spec = spec or IndexSpec()
        faiss = require_faiss()
        settings = spec.resolved(len(self), self.width)
        name = _index_name(settings)
        if name in self._index_cache:
            idx = self._index_cache[name]
        else:
            path = self.folder / name
            if settings["kind"] != "flat" and path.is_file():
                idx = faiss.read_index(str(path))
            else:
                idx = self._build_index(faiss, settings)
                if settings["kind"] != "flat" and cache:
                    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
                    faiss.write_index(idx, str(tmp))
                    os.replace(tmp, path)
            self._index_cache[name] = idx
        if settings["kind"] != "flat":
            idx.nprobe = settings["nprobe"]
        return idx

    def _build_index(self, faiss, settings: dict[str, Any]):
        d, n = self.width, len(self)
        keys = self.keys
        t0 = time.perf_counter()
        if settings["kind"] == "flat":
            idx = faiss.IndexFlatL2(d)
        else:
            quant = faiss.IndexFlatL2(d)
            if settings["kind"] == "ivf":
                idx = faiss.IndexIVFFlat(quant, d, settings["nlist"], faiss.METRIC_L2)
            else:
                idx = faiss.IndexIVFPQ(quant, d, settings["nlist"], settings["pq_m"],
                                       settings["pq_bits"])
            rng = np.random.default_rng(settings["seed"])
            sample = np.sort(rng.choice(n, size=settings["train_size"], replace=False))
            idx.train(np.ascontiguousarray(keys[sample], dtype=np.float32))
        step = 65536
        for s in range(0, n, step):
            idx.add(np.ascontiguousarray(keys[s : s + step], dtype=np.float32))
        log.info("built %s index over %d keys of %s in %.1f s", settings["kind"], n, self.point,
                 time.perf_counter() - t0)
        return idx

    def search(self, queries: np.ndarray, k: int, spec: IndexSpec | None = None, *,
               threads: int | None = None, recompute: bool = False,
               cache: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """k nearest keys of each query.

        Args:
            queries: ``(Q, d)`` float32.
            k: neighbours per query (clipped to the store size).
            spec: which index (default exact ``flat``).
            threads: FAISS threads (default: FAISS's own).
            recompute: replace the index's (approximate, for ``ivfpq``) distances by exact
                squared L2 distances to the stored keys, re-sorted.

        Returns:
            ``(dists (Q, k) float32 squared L2, ids (Q, k) int64; -1 where unfilled)``.
        """
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.width:
            raise DataError(f"queries must be (Q, {self.width}); got {q.shape}")
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        k = int(min(k, len(self)))
        with faiss_threads(threads):
            idx = self.index(spec, cache=cache)
            D = np.empty((q.shape[0], k), dtype=np.float32)
            ids = np.empty((q.shape[0], k), dtype=np.int64)
            for s in range(0, q.shape[0], QUERY_BATCH):
                D[s : s + QUERY_BATCH], ids[s : s + QUERY_BATCH] = idx.search(q[s : s + QUERY_BATCH], k)
        if recompute:
            D = self._exact_distances(q, ids)
            order = np.argsort(D, axis=1, kind="stable")
            D = np.take_along_axis(D, order, 1)
            ids = np.take_along_axis(ids, order, 1)
        return D, ids

    def _exact_distances(self, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
        out = np.full(ids.shape, np.finfo(np.float32).max, dtype=np.float32)
        keys = self.keys
        for i in range(q.shape[0]):
            ok = ids[i] >= 0
            if ok.any():
                diff = np.asarray(keys[ids[i][ok]], dtype=np.float64) - q[i].astype(np.float64)
                out[i, ok] = np.einsum("ij,ij->i", diff, diff)
        return out


def _tokens_hash(rows: list[np.ndarray]) -> str:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return sha256_bytes(np.concatenate(rows).tobytes() + lengths.tobytes())


def datastore_key(model, token_rows, point: str, *, batch_size: int) -> str:
    """Content key of the datastore of ``point`` over ``token_rows``."""
    rows = as_token_rows(token_rows)
    return "knn-" + stable_hash({
        "version": KNNLM_VERSION, "model": model_identity(model), "point": point,
        "dtype": str(model.dtype).replace("torch.", ""), "batch_size": int(batch_size),
        "tokens": _tokens_hash(rows),
    })[:28]


def build_datastores(
    model,
    token_rows,
    points: Sequence[str],
    *,
    batch_size: int = 8,
    cache: bool = True,
    root: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> dict[str, Datastore]:
    """Datastores of every point over ``token_rows`` from **one** forward per batch.

    Each point's keys are streamed into a memory-mapped ``keys.npy`` (nothing of size
    ``n × d`` is held in memory); points whose datastore already exists under ``root``
    (default ``$LMGEOM_CACHE/knnlm``) are reused and not recomputed; when all exist the model
    is not run at all.

    Args:
        model: a :class:`~lmgeom.models.LanguageModel`.
        token_rows: ``(N, T)`` int array or list of 1-D int arrays (fed as given).
        points: canonical point labels (``model.resolve_points``).
        batch_size: rows per forward pass.
        cache: keep the datastores (``False``: a temporary folder, deleted at exit).
        root: where the datastores live.

    Returns:
        ``point -> Datastore``.
    """
    rows = as_token_rows(token_rows)
    points = tuple(dict.fromkeys(points))
    if not points:
        raise ConfigError("no measurement points for the datastore")
    base = _datastore_root(root, cache)
    keys = {p: datastore_key(model, rows, p, batch_size=batch_size) for p in points}
    out: dict[str, Datastore] = {}
    todo = []
    for p in points:
        folder = base / keys[p]
        if (folder / "meta.json").is_file():
            try:
                out[p] = Datastore.open(folder)
                continue
            except CacheError as exc:
                log.warning("%s; rebuilding it", exc)
                shutil.rmtree(folder, ignore_errors=True)
        todo.append(p)
    if todo:
        lock = FileLock(str(base / (stable_hash(sorted(keys[p] for p in todo))[:16] + ".lock")))
        with lock:
            out.update(_write_datastores(model, rows, {p: keys[p] for p in todo}, base,
                                         batch_size, progress))
    return {p: out[p] for p in points}


def _datastore_root(root: str | os.PathLike[str] | None, cache: bool) -> Path:
    """``root``, or ``$LMGEOM_CACHE/knnlm``, or (``cache=False``) a temporary folder deleted
    at exit."""
    if root is not None:
        base = Path(root)
        base.mkdir(parents=True, exist_ok=True)
        return base
    if cache:
        return cache_dir("knnlm")
    base = Path(tempfile.mkdtemp(prefix="lmgeom-knnlm-"))
    atexit.register(shutil.rmtree, base, True)
    return base


def _write_datastores(model, rows: list[np.ndarray], keys: dict[str, str], base: Path,
                      batch_size: int, progress: bool | None) -> dict[str, Datastore]:
    """One forward per batch streams every point's keys into ``keys.npy`` of a temporary
    folder, renamed to ``base / keys[point]`` when complete (the caller holds the lock)."""
    todo = list(keys)
    n = sum(len(r) - 1 for r in rows)
    d = model.width
    out: dict[str, Datastore] = {}
    tmp = {p: base / f"{keys[p]}.tmp{os.getpid()}" for p in todo}
    mm = {}
    for p in todo:
        shutil.rmtree(tmp[p], ignore_errors=True)
        tmp[p].mkdir(parents=True)
        mm[p] = np.lib.format.open_memmap(tmp[p] / "keys.npy", mode="w+", dtype=np.float32,
                                          shape=(n, d))
    values = np.empty(n, dtype=np.int64)
    at = 0
    t0 = time.perf_counter()
    try:
        for _, ps in iter_position_states(model, rows, todo, batch_size=batch_size,
                                          progress=progress, desc=f"datastore {model.name}"):
            m = len(ps)
            for p in todo:
                if ps.states[p].shape[1] != d:
                    raise DataError(f"point {p} has width {ps.states[p].shape[1]}, not {d}")
                mm[p][at : at + m] = ps.states[p]
            values[at : at + m] = ps.targets
            at += m
        if at != n:  # pragma: no cover - defensive
            raise RuntimeError(f"datastore has {at} entries, expected {n}")
        for p in todo:
            mm[p].flush()
            del mm[p]
            np.save(tmp[p] / "values.npy", values)
            meta = {"format": "lmgeom.knnlm-datastore/1", "version": KNNLM_VERSION,
                    "key": keys[p], "point": p, "n": int(n), "d": int(d),
                    "model": model.name, "dtype": str(model.dtype).replace("torch.", ""),
                    "n_rows": len(rows), "batch_size": int(batch_size),
                    "tokens_sha256": _tokens_hash(rows),
                    "build_s": time.perf_counter() - t0}
            write_json(tmp[p] / "meta.json", meta)
            final = base / keys[p]
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp[p], final)
            out[p] = Datastore.open(final)
    finally:
        for p in todo:
            shutil.rmtree(tmp[p], ignore_errors=True)
    return out

