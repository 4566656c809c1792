"""The D-claims' shared vocabulary (a leaf of :mod:`lmgeom.experiments.claims`): the claim ids,
:class:`DispersionClaimsSettings` (every setting, sized from ``n``), the content keys and the
array cache of their measurements, and the clock of seconds per claim and model."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._io import atomic_path, stable_hash
from ...activations.forward import dtype_name, model_identity
from ...errors import ConfigError

log = logging.getLogger(__name__)

CLAIMS = tuple(f"D{i}" for i in range(1, 9))
#: bump when a change here changes the cached numbers
VERSION = "2"
VARIANTS = ("token", "segment")


@dataclass(frozen=True)
class DispersionClaimsSettings:
    """Every setting of the D-claims (defaults sized from ``n`` by :meth:`for_n`).

    Attributes:
        n: the run's ``--n``: segments for D1/D2 (the others scale with it, :meth:`for_n`).
        seed: seed of every sample and bootstrap.
        corpus: texts of D1/D2 (Wikipedia, as in the paper).
        corpus_limit: load a seeded sample of this many texts of ``corpus`` and ``knn_texts``
            (None: all; the segments are a seeded sample of their chunks either way). 32 of the
            107 Wikipedia articles hold far more tokens than the defaults use and spare
            tokenizing the whole corpus four times.
        chunk_len: tokens per segment (D1/D2).
        group_size, max_groups: the perplexity groups (D1/D2, grouped level).
        n_boot: bootstrap replicates of the intervals; ``n_boot_depth`` those of D2.
        hardness_texts, hardness_n, hardness_max_length: D5's texts, how many, their
            truncation (tokens).
        batch_size: rows per forward pass.
        select_eval, select_eval_chars: D6's held-out texts per domain and their length.
        knn_*: D7's corpus, chunk length, datastore / held-out / dispersion tokens and k.
        cluster_texts, cluster_max: D4's corpus and most clusters.
        finetune_*: D3/D8's target corpus, steps, batch, λ of the push-away arm, held-out
            chunks, chunk length, texts loaded and methods (``lora``, ``full``).
    """

    n: int = 256
    seed: int = 0
    corpus: str = "builtin:wiki"
    corpus_limit: int | None = 32
    chunk_len: int = 32
    group_size: int = 8
    max_groups: int = 100
    n_boot: int = 1000
    n_boot_depth: int = 500
    hardness_texts: str = "builtin:domains"
    hardness_n: int = 128
    hardness_max_length: int = 32
    batch_size: int = 8
    # D6
    select_eval: int = 8
    select_eval_chars: int = 1000
    # D7
    knn_texts: str = "builtin:wiki"
    knn_chunk_len: int = 64
    knn_train_tokens: int = 4096
    knn_eval_tokens: int = 1024
    knn_select_tokens: int = 1024
    knn_k: int = 128
    # D4
    cluster_texts: str = "builtin:code"
    cluster_max: int = 200
    # D3 / D8
    finetune_texts: str = "builtin:code"
    finetune_steps: int = 20
    finetune_batch: int = 4
    finetune_lam: float = 0.1
    finetune_eval_chunks: int = 32
    finetune_seq_len: int = 64
    finetune_n_texts: int = 60
    finetune_methods: tuple[str, ...] = ("lora", "full")

    @classmethod
    def for_n(cls, n: int, seed: int = 0, **override: Any) -> DispersionClaimsSettings:
        """Defaults scaled to ``n`` (``n <= 0``: the default 256): ``n`` segments (D1/D2),
        ``n / 2`` texts (D5), ``16 n`` datastore tokens (D7), ``n / 12`` fine-tuning steps (at
        most 20) and ``n / 8`` held-out chunks (D3/D8)."""
        n = int(n) if n and n > 0 else 256
        scaled = {"n": n, "seed": int(seed), "hardness_n": max(8, n // 2),
                  "select_eval": max(4, min(16, n // 32)),
                  "knn_train_tokens": max(1024, 16 * n), "cluster_max": max(16, min(500, n)),
                  "finetune_eval_chunks": max(8, min(64, n // 8)),
                  "finetune_steps": max(2, min(20, n // 12)),
                  "group_size": 8 if n >= 48 else max(2, n // 6)}
        return cls(**{**scaled, **override})


def selected(only: Sequence[str] | None) -> tuple[str, ...]:
    """The claim ids to measure (``only`` may name variants, ``D1.token``, or lower case)."""
    if not only:
        return CLAIMS
    want = []
    for x in only:
        base = str(x).strip().upper().split(".")[0]
        if base not in CLAIMS:
            raise ConfigError(f"{x!r} is not a dispersion claim id; use D1..D8")
        want.append(base)
    return tuple(c for c in CLAIMS if c in want)


# ---------------------------------------------------------------------- caching
def content_key(model, *parts: Any) -> str:
    """A key from the model's content identity (weights, tokenizer, dtype) and ``parts``."""
    return stable_hash([VERSION, model_identity(model), dtype_name(model), *parts])[:16]


def safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(s))[-60:]


def cached_arrays(work: Path, stem: str, key: str,
                  compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``compute()`` once per key: its arrays are kept as ``work/<stem>-<key>.npz`` (written
    atomically by lmgeom) and read back on a rerun."""
    path = Path(work) / f"{safe_name(stem)}-{key}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError):
            log.warning("%s is unreadable: recomputing", path)
    arrays = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})
    return arrays


class Clock:
    """Wall and CPU seconds per (claim, model), reported in each verdict's details (CPU time
    counts every thread; on a shared machine it is the steadier figure)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def time(self, claim: str, model: str) -> Iterator[None]:
        t, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            k = f"{claim}[{model}]"
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            self.seconds[k] = self.seconds.get(k, 0.0) + wall
            self.cpu[k] = self.cpu.get(k, 0.0) + cpu
            log.info("%s on %s: %.1f s wall, %.1f s CPU", claim, model, wall, cpu)

    def of(self, claim: str) -> dict[str, Any]:
        return {k: {"wall_s": round(v, 2), "cpu_s": round(self.cpu[k], 2)}
                for k, v in self.seconds.items() if k.startswith(claim + "[")}


__all__ = ["CLAIMS", "VARIANTS", "VERSION", "Clock", "DispersionClaimsSettings", "cached_arrays",
           "content_key", "safe_name", "selected"]
