"""kNN-LM (Khandelwal et al., 2020): a datastore of (context state, next token) pairs searched
with FAISS, interpolated with the base LM (METHODS.md, "kNN-LM layer selection").

Definitions used here:

* **keys** are the states of one measurement point (``ℓ.attn_out``, ``ℓ.ffn_in``,
  ``ℓ.ffn_out``, residual ``ℓ``, ``final``; see :meth:`LanguageModel.resolve_points`) at every
  position ``t`` of every training row except the last one; the **value** of key ``t`` is the
  token at ``t + 1`` (the token that followed that context);
* **queries** are the same point's states of held-out rows; each query at position ``t``
  scores the target token ``t + 1``, exactly the tokens 2..T that
  :func:`lmgeom.lm.perplexity.forward_chunks` scores (``score_from = 1``);
* **distance**: FAISS ``IndexFlatL2`` / IVF indexes return *squared* L2 distances. The
  default (``distance="sqeuclidean"``) uses them as they come, as the reference kNN-LM code
  does; ``distance="euclidean"`` takes their square root first;
* ``p_kNN(y) = Σ_{i: v_i = y} exp(-d_i / T) / Σ_i exp(-d_i / T)`` over the k retrieved
  neighbours (computed as a log-sum-exp, so huge distances do not underflow to 0/0);
  neighbours FAISS could not fill (id -1, fewer than k candidates in the probed IVF lists)
  are left out. ``T = "auto"`` sets T to the median nearest-neighbour distance of the
  queries (a scale-free choice: with squared L2 and T = 1 the weights of points whose states
  have norms in the hundreds are one-hot on the nearest neighbour);
* ``p = λ p_kNN + (1 - λ) p_LM``, evaluated as
  ``logaddexp(log λ + log p_kNN, log(1 - λ) + log p_LM)``, so λ = 0 gives ``log p_LM``
  bit for bit; perplexity = ``exp(-mean log p)`` over the scored tokens. One retrieval serves a
  whole λ sweep.

Memory: no ``B×T×V`` logits. The LM side keeps only ``log p_LM(target)`` per position
(readout on chunks of positions, as in :mod:`lmgeom.lm.perplexity`); the kNN side only
``log p_kNN(target)``. :func:`knn_distribution` builds a dense distribution and exists for
tests and small cases.

Storage (:class:`Datastore`): a folder ``$LMGEOM_CACHE/knnlm/<key>/`` with ``keys.npy``
(float32 ``(n, d)``, opened memory-mapped), ``values.npy`` (int64 ``(n,)``), ``meta.json`` and
any trained FAISS index files ``index-<settings>.faiss``. ``key`` hashes every input that
changes the keys (model weights, tokens, point, dtype, batch size, version); a folder is
written to a temporary name and renamed when complete, so an interrupted build leaves nothing
half-made. FAISS is imported lazily (``pip install faiss-cpu``; the ``knn`` extra).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import sha256_bytes, stable_hash, write_json
from ..errors import CacheError, ConfigError, DataError, TextsError

log = logging.getLogger(__name__)

#: Bump when a change here changes the numbers produced (part of cache keys).
KNNLM_VERSION = "1"
DEFAULT_K = 1024
DEFAULT_LAMBDA = 0.25
DEFAULT_TEMPERATURE = 1.0
DEFAULT_LAMBDAS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5)
INDEX_KINDS = ("flat", "ivf", "ivfpq")
DISTANCES = ("sqeuclidean", "euclidean")
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
def _faiss_threads(n: int | None) -> Iterator[Any]:
    faiss = require_faiss()
    old = faiss.omp_get_max_threads()
    if n:
        faiss.omp_set_num_threads(int(n))
    try:
        yield faiss
    finally:
        faiss.omp_set_num_threads(old)


# ---------------------------------------------------------------------- kNN probabilities
def _check_retrieval(dists: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(dists, dtype=np.float64)
    v = np.asarray(ids)
    if d.ndim != 2 or d.shape != v.shape:
        raise DataError(f"distances {d.shape} and neighbour values {v.shape} must both be (Q, k)")
    return d, v


def _log_weights(dists: np.ndarray, ok: np.ndarray, temperature: float, distance: str) -> np.ndarray:
    if temperature <= 0 or not math.isfinite(temperature):
        raise ConfigError(f"temperature must be a positive number, got {temperature}")
    if distance not in DISTANCES:
        raise ConfigError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
    d = np.where(ok, dists, 0.0)
    if distance == "euclidean":
        d = np.sqrt(np.maximum(d, 0.0))
    return np.where(ok, -d / float(temperature), -np.inf)


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - m_safe), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def knn_log_prob(
    dists: np.ndarray,
    neighbour_values: np.ndarray,
    targets: np.ndarray,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    distance: str = "sqeuclidean",
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """``log p_kNN(target)`` per query from its k neighbours.

    Args:
        dists: ``(Q, k)`` distances as FAISS returns them (squared L2 for L2 indexes).
        neighbour_values: ``(Q, k)`` next-token values of the neighbours.
        targets: ``(Q,)`` target token of each query.
        temperature: T in ``exp(-d / T)``.
        distance: ``sqeuclidean`` (use FAISS's squared distances as they are) or ``euclidean``.
        valid: ``(Q, k)`` bool, neighbours to use (default: all); FAISS's unfilled slots
            (id -1) must be marked invalid.

    Returns:
        ``(Q,)`` float64; ``-inf`` where no neighbour carries the target.
    """
    d, v = _check_retrieval(dists, neighbour_values)
    t = np.asarray(targets).reshape(-1)
    if t.shape[0] != d.shape[0]:
        raise DataError(f"{t.shape[0]} targets for {d.shape[0]} queries")
    ok = np.ones(d.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    s = _log_weights(d, ok, temperature, distance)
    log_z = _logsumexp(s, 1)
    hit = v == t[:, None]
    log_num = _logsumexp(np.where(hit, s, -np.inf), 1)
    with np.errstate(invalid="ignore"):
        out = log_num - log_z
    return np.where(np.isfinite(log_z), out, -np.inf)


def knn_distribution(
    dists: np.ndarray,
    neighbour_values: np.ndarray,
    vocab_size: int,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    distance: str = "sqeuclidean",
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """The dense ``(Q, V)`` kNN distribution (for tests and small cases; sums to 1 per row
    that has at least one valid neighbour, all zeros otherwise)."""
    d, v = _check_retrieval(dists, neighbour_values)
    ok = np.ones(d.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    s = _log_weights(d, ok, temperature, distance)
    log_z = _logsumexp(s, 1)
    w = np.where(ok, np.exp(s - np.where(np.isfinite(log_z), log_z, 0.0)[:, None]), 0.0)
    out = np.zeros((d.shape[0], int(vocab_size)), dtype=np.float64)
    rows = np.repeat(np.arange(d.shape[0]), d.shape[1])
    cols = np.where(ok, v, 0).reshape(-1)
    np.add.at(out, (rows, cols), w.reshape(-1))
    return out


def interpolate(lm_log_prob: np.ndarray, knn_log_prob: np.ndarray, lam: float) -> np.ndarray:
    """``log(λ p_kNN + (1 - λ) p_LM)`` per query, float64; λ = 0 returns ``lm_log_prob``."""
    lam = float(lam)
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"lambda must be in [0, 1], got {lam}")
    lm = np.asarray(lm_log_prob, dtype=np.float64)
    kn = np.asarray(knn_log_prob, dtype=np.float64)
    if lam == 0.0:
        return lm.copy()
    if lam == 1.0:
        return kn.copy()
    return np.logaddexp(math.log(lam) + kn, math.log1p(-lam) + lm)


def perplexity_of(log_probs: np.ndarray) -> float:
    """``exp(-mean log p)`` over the scored tokens (inf if any has probability 0)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    if lp.size == 0:
        return math.nan
    with np.errstate(over="ignore"):
        return float(np.exp(-lp.mean()))


# ---------------------------------------------------------------------- forward
@dataclass
class PositionStates:
    """Per-position states of one forward over token rows.

    Position ``t`` of row ``r`` appears when ``t + 1`` is a real token: its state predicts
    ``targets`` = token ``t + 1``.

    Attributes:
        states: ``point -> (n, d)`` float32.
        targets: ``(n,)`` int64 next tokens (the datastore values).
        lm_log_prob: ``(n,)`` float64 ``log p_LM(target)``, or None when not computed.
        row, pos: ``(n,)`` row index and position of each entry.
    """

    states: dict[str, np.ndarray]
    targets: np.ndarray
    lm_log_prob: np.ndarray | None
    row: np.ndarray
    pos: np.ndarray

    def __len__(self) -> int:
        return int(self.targets.shape[0])


def _rows(token_rows) -> list[np.ndarray]:
    if isinstance(token_rows, np.ndarray) and token_rows.ndim == 2:
        rows = [np.asarray(r, dtype=np.int64) for r in token_rows]
    else:
        rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in token_rows]
    if not rows:
        raise TextsError("no token rows: the corpus is empty or shorter than one chunk")
    if any(len(r) < 2 for r in rows):
        raise TextsError("every token row needs at least 2 tokens (one context, one target)")
    return rows


def iter_position_states(
    model,
    token_rows,
    points: Sequence[str],
    *,
    lm_log_prob: bool = False,
    batch_size: int = 8,
    position_chunk: int | None = None,
    progress: bool | None = None,
    desc: str = "knnlm",
) -> Iterator[tuple[np.ndarray, PositionStates]]:
    """One forward per batch of rows, yielding ``(row indices, PositionStates)`` per batch.

    Rows are run in the order given through :func:`lmgeom.activations.forward.run_batches`
    (rows of one batch are right-padded; pads are never keys, queries or targets). With ``lm_log_prob`` the post-norm ``final`` states are scored
    against the next token in chunks of ``position_chunk`` positions, the way
    :func:`lmgeom.lm.perplexity.forward_chunks` scores them (same state selection, same
    chunking, so the values agree bit for bit with it for the same batches).
    """
    import torch

    from ..activations.forward import check_finite, dtype_name, ordered_batches, run_batches
    from .perplexity import default_position_chunk, scored_positions, target_log_probs

    rows = _rows(token_rows)
    points = tuple(points)
    if not points and not lm_log_prob:
        raise ConfigError("nothing to compute: no points and lm_log_prob=False")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    V = model.vocab_size
    for r in rows:
        if r.min() < 0 or r.max() >= V:
            raise DataError(f"token id out of range for {model.name} (vocabulary {V})")
    pc = default_position_chunk(V) if position_chunk is None else int(position_chunk)
    if pc < 1:
        raise ConfigError(f"position_chunk must be >= 1, got {position_chunk}")
    dtype = dtype_name(model)
    capture_points = tuple(dict.fromkeys((*points, *(("final",) if lm_log_prob else ()))))

    def capture(label, h, batch):
        if "bt" not in batch.scratch:  # state at t predicts token t + 1
            batch.scratch["bt"] = scored_positions(batch, 1)
        b, t = batch.scratch["bt"]
        kept = {}
        if label in points:
            kept["states"] = h[b, t].to(torch.float32).cpu().numpy()
        if label == "final" and lm_log_prob:
            kept["final"] = h[b, t]
        return kept

    def finish(batch, got):
        b_idx, t_idx = batch.scratch["bt"]
        targets_t = batch.input_ids[b_idx, t_idx + 1]
        logp = None
        if lm_log_prob:
            logp = -target_log_probs(model, got["final"]["final"], targets_t, pc).cpu().numpy()
            if not np.isfinite(logp).all():
                raise DataError(f"non-finite log-probabilities from {model.name}"
                                + (" (use float32 or bfloat16)" if "16" in dtype else ""))
        for p in points:
            check_finite(p, got[p]["states"], dtype)
        b_np = b_idx.cpu().numpy()
        return {"ps": PositionStates(
            states={p: got[p]["states"] for p in points},
            targets=targets_t.cpu().numpy().astype(np.int64),
            lm_log_prob=logp,
            row=batch.index[b_np].astype(np.int64),
            pos=batch.position_ids[b_idx, t_idx].cpu().numpy().astype(np.int64),
        )}

    for out in run_batches(model, rows, capture_points, capture, finish,
                           batches=ordered_batches(len(rows), batch_size),
                           stop_early=not lm_log_prob, progress=progress, desc=desc):
        yield out.index, out.tensors["ps"]


def position_states(model, token_rows, points: Sequence[str], **kwargs) -> PositionStates:
    """All of :func:`iter_position_states` concatenated (for held-out queries: a few thousand
    positions; use :func:`build_datastores` for large training corpora)."""
    parts = [ps for _, ps in iter_position_states(model, token_rows, points, **kwargs)]
    lp = None if parts[0].lm_log_prob is None else np.concatenate([p.lm_log_prob for p in parts])
    return PositionStates(
        states={p: np.concatenate([x.states[p] for x in parts]) for p in parts[0].states},
        targets=np.concatenate([x.targets for x in parts]),
        lm_log_prob=lp,
        row=np.concatenate([x.row for x in parts]),
        pos=np.concatenate([x.pos for x in parts]),
    )


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
        with _faiss_threads(threads):
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
    from ..activations.forward import model_identity

    rows = _rows(token_rows)
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
    from filelock import FileLock

    from .._paths import cache_dir

    rows = _rows(token_rows)
    points = tuple(dict.fromkeys(points))
    if not points:
        raise ConfigError("no measurement points for the datastore")
    if root is None:
        if cache:
            base = cache_dir("knnlm")
        else:
            import atexit
            import tempfile

            base = Path(tempfile.mkdtemp(prefix="lmgeom-knnlm-"))
            atexit.register(shutil.rmtree, base, True)
    else:
        base = Path(root)
        base.mkdir(parents=True, exist_ok=True)
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
    if not todo:
        return out
    n = sum(len(r) - 1 for r in rows)
    d = model.width
    lock = FileLock(str(base / (stable_hash(sorted(keys[p] for p in todo))[:16] + ".lock")))
    with lock:
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
                                              progress=progress,
                                              desc=f"datastore {model.name}"):
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
    return {p: out[p] for p in points}


# ---------------------------------------------------------------------- evaluation
def resolve_temperature(temperature: float | str, dists: np.ndarray, valid: np.ndarray,
                        distance: str = "sqeuclidean") -> float:
    """A number, or ``"auto"``: the median over queries of the nearest valid neighbour's
    distance (in the chosen ``distance``), which makes ``exp(-d / T)`` scale-free — the same
    T = 1 means very different sharpness at points whose states differ in norm by 100×.
    Uses distances only (no targets), so it stays label-free."""
    if isinstance(temperature, str):
        if temperature.strip().lower() != "auto":
            try:
                temperature = float(temperature)
            except ValueError as exc:
                raise ConfigError(f"temperature must be a positive number or 'auto', got "
                                  f"{temperature!r}") from exc
        else:
            t = nearest_distance(dists, valid, distance)
            if not (math.isfinite(t) and t > 0):
                raise DataError("temperature 'auto': the nearest-neighbour distances are all 0 "
                                "(queries are stored keys?); give a number")
            return t
    t = float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ConfigError(f"temperature must be a positive number or 'auto', got {temperature}")
    return t


def nearest_distance(dists: np.ndarray, valid: np.ndarray, distance: str = "sqeuclidean") -> float:
    """Median over queries of the nearest valid neighbour's distance (NaN if none)."""
    d = np.where(valid, np.asarray(dists, dtype=np.float64), np.inf).min(1)
    d = d[np.isfinite(d)]
    if distance == "euclidean":
        d = np.sqrt(np.maximum(d, 0.0))
    return float(np.median(d)) if d.size else math.nan


def temperature_label(temperature: float | str) -> str:
    return "auto" if isinstance(temperature, str) and temperature.strip().lower() == "auto" \
        else f"{float(temperature):g}"


@dataclass(frozen=True)
class KnnEval:
    """kNN-LM evaluation of one datastore on held-out queries.

    Attributes:
        point: measurement point of keys and queries.
        perplexity: ``λ -> perplexity`` of the interpolated model at the main temperature
            (λ = 0: the base LM).
        grid: ``(temperature label, λ) -> perplexity`` for every temperature evaluated (the
            main one and ``temperatures``), all from the same retrieval.
        knn_log_prob: ``(Q,)`` ``log p_kNN(target)`` at the main temperature (``-inf`` where no
            neighbour has the target).
        target_recall: fraction of queries whose target is among the k neighbours.
        k, distance, index: the settings used (``index``: resolved FAISS settings).
        temperature: the main T as a number; ``temperature_name``: as given (``"auto"``...);
            ``temperatures``: label -> value of every T evaluated.
        nn_distance: median distance of the nearest neighbour (the ``auto`` scale).
        n_queries, n_keys: sizes.
        search_s: seconds spent in FAISS.
    """

    point: str
    perplexity: dict[float, float]
    grid: dict[tuple[str, float], float]
    knn_log_prob: np.ndarray
    target_recall: float
    k: int
    temperature: float
    temperature_name: str
    temperatures: dict[str, float]
    distance: str
    index: dict[str, Any]
    nn_distance: float
    n_queries: int
    n_keys: int
    search_s: float

    @property
    def best_lambda(self) -> float:
        return min(self.perplexity, key=lambda lam: (self.perplexity[lam], lam))

    @property
    def best(self) -> tuple[str, float, float]:
        """``(temperature label, λ, perplexity)`` of the lowest perplexity in the grid."""
        (tl, lam), v = min(self.grid.items(), key=lambda kv: (kv[1], kv[0][1]))
        return tl, lam, v


def evaluate(
    store: Datastore,
    queries: np.ndarray,
    targets: np.ndarray,
    lm_log_prob: np.ndarray,
    *,
    k: int = DEFAULT_K,
    lambdas: Sequence[float] = DEFAULT_LAMBDAS,
    temperature: float | str = DEFAULT_TEMPERATURE,
    temperatures: Sequence[float | str] = (),
    distance: str = "sqeuclidean",
    index: IndexSpec | None = None,
    recompute: bool = False,
    threads: int | None = None,
) -> KnnEval:
    """Interpolated perplexity for every λ in ``lambdas`` (and every extra temperature) from
    one retrieval.

    Args:
        store: the datastore.
        queries: ``(Q, d)`` states of the held-out positions at ``store.point``.
        targets: ``(Q,)`` their next tokens.
        lm_log_prob: ``(Q,)`` ``log p_LM(target)`` of the base model.
        k, lambdas, distance: see the module docstring.
        temperature: the main T (a number or ``"auto"``, see :func:`resolve_temperature`).
        temperatures: more T values for the grid (same retrieval).
        index: FAISS index settings (default exact flat).
        recompute: exact distances for approximate indexes (see :meth:`Datastore.search`).
    """
    if not lambdas:
        raise ConfigError("give at least one lambda")
    if distance not in DISTANCES:
        raise ConfigError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
    t = np.asarray(targets, dtype=np.int64)
    lm = np.asarray(lm_log_prob, dtype=np.float64)
    if not (len(t) == len(lm) == len(queries)):
        raise DataError(f"{len(queries)} queries, {len(t)} targets, {len(lm)} LM log-probs")
    t0 = time.perf_counter()
    D, ids = store.search(queries, k, index, threads=threads, recompute=recompute)
    search_s = time.perf_counter() - t0
    ok = ids >= 0
    vals = np.where(ok, store.values[np.where(ok, ids, 0)], -1)
    main_label = temperature_label(temperature)
    temps: dict[str, float] = {}
    for temp in (temperature, *temperatures):
        temps.setdefault(temperature_label(temp), resolve_temperature(temp, D, ok, distance))
    grid: dict[tuple[str, float], float] = {}
    kls: dict[str, np.ndarray] = {}
    for label, tv in temps.items():
        kls[label] = knn_log_prob(D, vals, t, temperature=tv, distance=distance, valid=ok)
        for lam in lambdas:
            grid[(label, float(lam))] = perplexity_of(interpolate(lm, kls[label], float(lam)))
    main_kl = kls[main_label]
    ppl = {float(lam): grid[(main_label, float(lam))] for lam in lambdas}
    spec = index or IndexSpec()
    nn = nearest_distance(D, ok, distance)
    return KnnEval(point=store.point, perplexity=ppl, grid=grid, knn_log_prob=main_kl,
                   target_recall=float(np.mean(np.isfinite(main_kl))), k=int(D.shape[1]),
                   temperature=temps[main_label], temperature_name=main_label,
                   temperatures=temps, distance=distance,
                   index=spec.resolved(len(store), store.width), nn_distance=nn,
                   n_queries=len(t), n_keys=len(store), search_s=search_s)


__all__ = [
    "DEFAULT_K",
    "DEFAULT_LAMBDA",
    "DEFAULT_LAMBDAS",
    "DEFAULT_TEMPERATURE",
    "DISTANCES",
    "INDEX_KINDS",
    "Datastore",
    "IndexSpec",
    "KnnEval",
    "PositionStates",
    "build_datastores",
    "datastore_key",
    "evaluate",
    "interpolate",
    "iter_position_states",
    "knn_distribution",
    "knn_log_prob",
    "nearest_distance",
    "perplexity_of",
    "position_states",
    "require_faiss",
    "resolve_temperature",
    "temperature_label",
]
