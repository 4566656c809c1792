"""The data of a fine-tuning run (:mod:`lmgeom.experiments.finetune`): each training corpus
split by text into a training and a held-out part (:meth:`~lmgeom.texts.TextSet.split`), cut
into fixed-length chunks, and the batch of each step (:class:`~lmgeom.training.schedule.BatchSchedule`:
``batch_size / K`` chunks of each of the K domains)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import TextsError
from ...texts import load_texts
from ...texts.chunks import make_chunks
from ...training.schedule import BatchSchedule
from .config import FinetuneSettings

#: the second seed word of the held-out split (``TextSet.split(..., stream=SPLIT_STREAM)``)
SPLIT_STREAM = 0x5EED


@dataclass
class Domain:
    """One training corpus: its training chunks and its held-out chunks ``(N, T)`` int64."""

    spec: str
    index: int
    train: np.ndarray
    heldout: np.ndarray
    n_train_texts: int
    n_heldout_texts: int
    info: dict[str, Any] = field(default_factory=dict)


def _domain(model, cfg: FinetuneSettings, i: int, spec: str) -> Domain:
    ts = load_texts(spec, limit=cfg.n_texts, seed=cfg.seed)
    tr, ho = ts.split(cfg.heldout_fraction, cfg.seed, stream=SPLIT_STREAM)
    c_tr = make_chunks(model, tr, cfg.seq_len, bos=cfg.bos)
    try:
        c_ho = make_chunks(model, ho, cfg.seq_len, max_chunks=cfg.eval_chunks, seed=cfg.seed,
                           bos=cfg.bos)
    except TextsError as exc:
        raise TextsError(f"{spec}: the held-out texts are too short for one chunk of "
                         f"{cfg.seq_len} tokens; raise heldout_fraction or lower --seq-len "
                         f"({exc})") from exc
    if len(c_tr) < cfg.batch_size // len(cfg.texts):
        raise TextsError(f"{spec}: only {len(c_tr)} training chunks of {cfg.seq_len} tokens, "
                         "fewer than one batch needs")
    return Domain(spec, i, c_tr.tokens, c_ho.tokens, len(tr), len(ho), info={
        "texts": spec, "texts_hash": ts.hash, "n_texts": len(ts),
        "n_train_texts": len(tr), "n_heldout_texts": len(ho),
        "n_train_chunks": len(c_tr), "n_train_tokens": int(c_tr.n_document_tokens),
        "n_heldout_chunks": len(c_ho), "n_heldout_chunks_available": c_ho.n_available,
        "bos": c_tr.bos})


def prepare_data(model, cfg: FinetuneSettings) -> tuple[list[Domain], dict[str, np.ndarray]]:
    """Training domains and evaluation sets (name → ``(N, T)`` chunks) for ``cfg``: the
    held-out chunks of each training corpus (``heldout:SPEC``) and the chunks of each
    ``eval_texts`` corpus not trained on (``SPEC``), at most ``eval_chunks`` each."""
    domains = [_domain(model, cfg, i, spec) for i, spec in enumerate(cfg.texts)]
    evals = {f"heldout:{d.spec}": d.heldout for d in domains}
    for spec in cfg.eval_texts:
        if spec in cfg.texts:
            continue  # its held-out part is already an evaluation set
        ts = load_texts(spec, limit=cfg.n_texts, seed=cfg.seed)
        evals[spec] = make_chunks(model, ts, cfg.seq_len, max_chunks=cfg.eval_chunks,
                                  seed=cfg.seed, bos=cfg.bos).tokens
    return domains, evals


def domain_schedule(domains: Sequence[Domain], batch_size: int, seed: int) -> BatchSchedule:
    """The batch schedule of a run: ``batch_size / K`` chunks of each of the K domains per
    step, domain ``d`` in the order ``default_rng([seed, d, epoch])``."""
    return BatchSchedule([len(d.train) for d in domains], batch_size // len(domains), seed)


def batch_arrays(schedule: BatchSchedule, domains: Sequence[Domain],
                 step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids (B, T), domain (B,))`` of ``step``: each domain's chunks in turn."""
    idx = schedule.indices(step)
    ids = np.concatenate([dom.train[i] for dom, i in zip(domains, idx)])
    dom = np.concatenate([np.full(len(i), d, dtype=np.int64) for d, i in enumerate(idx)])
    return ids, dom


__all__ = ["SPLIT_STREAM", "Domain", "batch_arrays", "domain_schedule", "prepare_data"]
