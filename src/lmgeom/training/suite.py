"""A family of small GPT-NeoX (Pythia-architecture) models that differ in width, trained from
scratch on the offline corpora with identical data, data order and seed — the "scale × training
time" axis of the Subspace PGA paper, reproducible on a CPU.

Layout of a suite folder ``DIR``::

    DIR/suite.json                 the settings every width shares (checked on every rerun)
    DIR/manifest.json              widths, shapes, steps, val losses, tokens, seed, data hash,
                                   weights sha256 per checkpoint, duplicate weights, timings
    DIR/tokenizer/                 the byte-level BPE shared by all widths
    DIR/data/train.npy, val.npy    the tokenised training / held-out streams (uint16/uint32)
    DIR/data/data.json             where the streams came from (corpora, hashes, counts)
    DIR/<width>/step<N>/           an ordinary Hugging Face model folder (config.json,
                                   model.safetensors, tokenizer) + lmgeom_checkpoint.json
                                   (step, tokens seen, validation loss, weights hash)
    DIR/<width>/width.json         written when the width is complete
    DIR/<width>/_state/            resume state while training, in the one checkpoint format of
                                   :mod:`lmgeom.training.checkpoint` (weights, AdamW moments,
                                   CPU and CUDA RNG as safetensors; step and schedule as JSON)

Shapes (documented in docs/suite.md): every width has the same depth (``n_layers``, default 6 —
Pythia-70M's), ``n_heads = max(2, width // 64)``, ``intermediate = 4 · width``, parallel residual,
rotary embeddings on 25 % of each head, untied input / output embeddings: only the width varies.

Determinism: the data order is a function of the seed only (an epoch-wise permutation of
fixed-length chunks); model init runs under ``torch.manual_seed(seed)`` inside
``torch.random.fork_rng`` (the caller's global RNG is untouched); there is no dropout. A run that
is interrupted resumes from the last saved state (every checkpoint, and every
``resume_every_s`` seconds between checkpoints) and ends with the same weights, bit for bit, as
an uninterrupted run on the same machine and thread count (tested).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .._io import fs_clock_ns, record_tree, remove_written, write_json, written_by_lmgeom
from .._paths import check_output_location
from ..errors import CacheError, ConfigError
from ..results.folder import acquire_output_lock, release_output_lock
from .geometry import GEOMETRY_FILE, combine, make_recorder
from .suite_config import (
    FORMAT,
    SuiteConfig,
    checkpoint_steps,
    width_label,
)
from .suite_data import prepare_data
from .suite_manifest import (
    write_manifest,
)
from .suite_width import (
    MakeHooks,
    train_width,
    width_complete,
)

log = logging.getLogger(__name__)


def _check_folder(root: Path, config: SuiteConfig, overwrite: bool) -> None:
    marker = root / "suite.json"
    want = {"format": FORMAT, "settings": config.shared_settings()}
    check_output_location(root)
    if root.exists() and not root.is_dir():
        raise CacheError(f"--out {root} exists and is not a folder")
    if root.is_dir() and any(root.iterdir()):
        have = None
        if marker.is_file() and written_by_lmgeom(marker):
            try:
                have = json.loads(marker.read_text())
            except ValueError:
                have = None
        if have is None:
            raise CacheError(f"{root} is not empty and is not a suite folder lmgeom wrote (no "
                             "suite.json written by lmgeom); choose a new folder for --out")
        if have != want:
            if not overwrite:
                diff = sorted(k for k in want["settings"]
                              if have.get("settings", {}).get(k) != want["settings"][k])
                raise CacheError(
                    f"{root} holds a suite trained with other settings ({', '.join(diff) or 'format'}); "
                    "pass --overwrite to replace it or choose another --out (widths may differ: "
                    "new widths are added to an existing suite)"
                )
            log.warning("replacing the suite in %s (--overwrite): removing the files lmgeom "
                        "wrote there", root)
            _, kept = remove_written(root)
            if kept:
                log.warning("kept %d files in %s that lmgeom did not write (e.g. %s)", len(kept),
                            root, kept[0].relative_to(root))
    root.mkdir(parents=True, exist_ok=True)
    if not marker.is_file():
        write_json(marker, want)


def _geometry_hooks(config: SuiteConfig, data, every: int,
                    make_hooks: MakeHooks | None) -> MakeHooks:
    """``make_hooks`` plus a geometry recorder per width (at step 0, the checkpoint steps, every
    ``every`` steps and the last), on the suite's own tokenizer."""
    steps = checkpoint_steps(config.steps, config.n_regular)

    def hooks(width: int, model, wdir: Path) -> list[Any]:
        extra = list(make_hooks(width, model, wdir)) if make_hooks is not None else []
        rec = make_recorder(model, data.tokenizer, wdir, name=width_label(width), at_steps=steps,
                            every=every, last_step=config.steps, seed=config.seed)
        return [*extra, rec]

    return hooks


def train_suite(
    out_dir: str | os.PathLike[str],
    config: SuiteConfig | None = None,
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    resume_every_s: float = 300.0,
    stop_after_steps: int | None = None,
    threads: int | None = 1,
    make_hooks: MakeHooks | None = None,
    geometry: bool = True,
    geometry_every: int = 0,
) -> dict[str, Any]:
    """Train (or resume, or extend with new widths) a width suite into ``out_dir``.

    Widths that are complete are skipped; an interrupted width resumes from its last saved state.
    Widths train one after another on the same data order.

    Args:
        out_dir: the suite folder (created).
        config: the suite's settings (default :class:`SuiteConfig`).
        overwrite: replace a suite trained with other shared settings.
        progress: progress bars (default: when stderr is a terminal and ``LMGEOM_QUIET`` unset).
        resume_every_s: also save the resume state this often between checkpoints.
        stop_after_steps: stop each unfinished width after this many optimizer steps in this
            call, without saving anything beyond the regular checkpoints — simulates a killed
            run (tests); the manifest then lists those widths as ``partial``.
        threads: torch intra-op threads while training (restored afterwards); ``None`` keeps
            torch's setting. The default 1 is the fastest on a machine whose cores are shared
            (two threads on two busy cores ran 3-25x slower, docs/suite.md); the thread count
            can change float reductions, so resume with the same count for bit-identical weights.
        make_hooks: ``make_hooks(width, model, width_folder)`` → extra step hooks for that
            width's training loop (:func:`lmgeom.training.loop.train_loop`'s ``hooks``: called
            after each optimiser step; e.g. a geometry monitor writing into the width folder).
        geometry: record each width's geometry trajectory (:mod:`lmgeom.training.geometry`:
            Subspace PGA z, dispersion, PC1 readout share, RankMe on 128 ``builtin:domains``
            texts) at step 0, at every checkpoint step and every ``geometry_every`` steps,
            into ``<width>/geometry.parquet`` and, combined, ``out_dir/geometry.parquet``.
            Training is bit-identical with and without it.
        geometry_every: also measure every this many steps (0: checkpoint steps only).

    Returns:
        The manifest (also written to ``out_dir/manifest.json``).

    Raises:
        CacheError: the folder holds something else or another process trains it.
        ConfigError, DataError, TextsError: bad settings or unusable corpora.
    """

    config = config or SuiteConfig()
    root = Path(out_dir)
    lock = acquire_output_lock(root)  # beside the folder, as every lmgeom output
    t_start_ns = fs_clock_ns(root)
    try:
        _check_folder(root, config, overwrite)
    except BaseException:
        release_output_lock(lock)
        raise
    import torch

    prev_threads = torch.get_num_threads()
    if threads is not None:
        if int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    try:
        t0 = time.perf_counter()
        data = prepare_data(root, config, progress=progress)
        t_data = time.perf_counter() - t0
        epochs = config.steps * config.batch_size / max(1, data.n_chunks(config.seq_len))
        if epochs > 1:
            log.warning("the token budget is %.2f passes over the %d training tokens", epochs,
                        len(data.train))
        hooks = (_geometry_hooks(config, data, geometry_every, make_hooks) if geometry
                 else make_hooks)
        for w in config.widths:
            if width_complete(root, w, config):
                log.info("w%d is complete; skipped", w)
                continue
            train_width(root, w, config, data, progress=progress, resume_every_s=resume_every_s,
                        stop_after_steps=stop_after_steps, make_hooks=hooks)
        if geometry:
            combine(sorted((p / GEOMETRY_FILE for p in root.iterdir() if p.name.isdigit()),
                           key=lambda p: int(p.parent.name)),
                    root / GEOMETRY_FILE)
        manifest = write_manifest(root, config, data_s=t_data)
    finally:
        record_tree(root, since_ns=t_start_ns)  # what this call wrote (for --overwrite)
        torch.set_num_threads(prev_threads)
        release_output_lock(lock)
    return manifest


__all__ = [
    "train_suite",
]
