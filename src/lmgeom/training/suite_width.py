"""One width of a suite: its model (:func:`build_model`), optimiser, checkpoints and resume
state, trained by the one training loop (:func:`lmgeom.training.loop.train_loop`) with the
suite's bookkeeping as a step hook (:class:`WidthRun`)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .._io import write_json
from .checkpoint import resume, save_checkpoint
from .loop import Hook, lm_objective, show_progress, train_loop
from .schedule import BatchSchedule
from .suite_config import (
    CHECKPOINT_META,
    WIDTH_DONE,
    SuiteConfig,
    checkpoint_steps,
    model_shape,
    width_label,
)
from .suite_data import SuiteData

log = logging.getLogger("lmgeom.training.suite")

#: ``make_hooks(width, model, width_folder) -> [hook, ...]``: extra step hooks of one width
MakeHooks = Callable[[int, Any, Path], Sequence[Hook]]

#: the second seed word of the suite's data order (``default_rng([seed, 2, epoch])``)
ORDER_STREAM = 2


def data_order(data: SuiteData, config: SuiteConfig) -> BatchSchedule:
    """The suite's batch schedule: ``batch_size`` training chunks per step, the same for every
    width (a function of the seed only)."""
    return BatchSchedule([data.n_chunks(config.seq_len)], config.batch_size, config.seed,
                         streams=(ORDER_STREAM,))


def build_model(width: int, config: SuiteConfig, tokenizer):
    """A freshly initialised GPT-NeoX model of ``width`` (float32), initialised under
    ``torch.manual_seed(config.seed)`` without touching the caller's RNG."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    s = model_shape(width, config)
    cfg = GPTNeoXConfig(
        vocab_size=len(tokenizer),
        hidden_size=s["width"],
        num_hidden_layers=s["n_layers"],
        num_attention_heads=s["n_heads"],
        intermediate_size=s["intermediate_size"],
        hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        use_parallel_residual=True,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        initializer_range=0.02,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(config.seed))
        model = GPTNeoXForCausalLM(cfg)
    return model.float()


def make_optimizer(model, config: SuiteConfig):
    """AdamW; weight decay on matrices only (not on biases / norm gains)."""
    import torch

    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, foreach=False,
    )


def save_state(wdir: Path, model, opt, step: int, extra: dict[str, Any]) -> None:
    """The resume state of one width (:mod:`lmgeom.training.checkpoint`, every parameter)."""
    save_checkpoint(wdir / "_state", model, opt, {"step": int(step), **extra}, which="all")


def load_state(wdir: Path, model, opt) -> dict[str, Any] | None:
    """Restore weights, AdamW state and RNG from ``_state`` (safetensors + JSON, no pickle)."""
    return resume(wdir / "_state", model, opt)


def val_loss(model, chunks: np.ndarray, bf16: bool, batch: int = 16) -> float:
    """Mean next-token loss per predicted token over ``chunks`` (the held-out loss)."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(chunks), batch):
            x = torch.from_numpy(chunks[i : i + batch])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=x, labels=x).loss
            n = x.shape[0] * (x.shape[1] - 1)
            total += float(loss.float()) * n
            count += n
    model.train()
    return total / count


def checkpoint_meta(folder: Path) -> dict[str, Any] | None:
    """The ``lmgeom_checkpoint.json`` of a saved checkpoint folder (``None``: not a complete one)."""
    p = folder / CHECKPOINT_META
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError:
        return None


def save_width_checkpoint(wdir: Path, model, tokenizer, step: int,
                          meta: dict[str, Any]) -> dict[str, Any]:
    """``wdir/step<N>/``: a Hugging Face model folder + tokenizer + ``lmgeom_checkpoint.json``
    (``meta`` and the weights hash), written under a temporary name and renamed into place."""
    from transformers.utils import logging as hf_logging

    from ..models.load import weights_hash

    hf_logging.disable_progress_bar()
    final = wdir / f"step{step}"
    tmp = wdir / f".step{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    meta = {**meta, "weights_sha256": weights_hash(tmp)}
    write_json(tmp / CHECKPOINT_META, meta)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


class WidthRun:
    """The suite's step hook for one width (:func:`lmgeom.training.loop.train_loop` calls it
    after every optimiser step): the loss EMA, the progress bar, a resume state every
    ``resume_every_s`` seconds, the validation loss and saved checkpoint at every checkpoint
    step, and a stop after ``stop_after_steps`` steps of this call (a simulated kill)."""

    def __init__(self, wdir: Path, width: int, config: SuiteConfig, data: SuiteData, model, opt,
                 meta: dict[str, Any] | None, *, progress: bool | None, resume_every_s: float,
                 stop_after_steps: int | None) -> None:
        self.wdir, self.width, self.config, self.data = wdir, width, config, data
        self.model, self.opt = model, opt
        self.step = int(meta["step"]) if meta else 0
        self.timings = dict(meta.get("timings", {})) if meta else {}
        for k in ("train_s", "eval_s", "save_s"):
            self.timings.setdefault(k, 0.0)
        self.ema = meta.get("train_loss_ema") if meta else None
        self.ckpts = set(checkpoint_steps(config.steps, config.n_regular))
        self.val = data.val_chunks(config.seq_len, config.val_tokens)
        self.resume_every_s, self.stop_after = resume_every_s, stop_after_steps
        self.done_here = 0
        self.last_state = time.perf_counter()
        tps = config.tokens_per_step
        self.bar = tqdm(total=config.steps * tps, initial=self.step * tps, desc=width_label(width),
                        unit="tok", unit_scale=True, disable=not show_progress(progress),
                        smoothing=0.1)

    @property
    def stopping(self) -> bool:
        return self.stop_after is not None and self.done_here >= self.stop_after

    def _save_state(self) -> None:
        save_state(self.wdir, self.model, self.opt, self.step,
                   {"train_loss_ema": self.ema, "timings": self.timings})
        self.last_state = time.perf_counter()

    def checkpoint(self) -> None:
        """Validation loss + checkpoint folder at a checkpoint step not yet saved."""
        step, c = self.step, self.config
        if step not in self.ckpts or checkpoint_meta(self.wdir / f"step{step}") is not None:
            return
        t = time.perf_counter()
        vl = val_loss(self.model, self.val, c.bf16)
        self.timings["eval_s"] += time.perf_counter() - t
        t = time.perf_counter()
        cm = save_width_checkpoint(self.wdir, self.model, self.data.tokenizer, step, {
            "width": self.width, "step": step, "tokens": step * c.tokens_per_step,
            "val_loss": vl, "val_tokens": int(self.val.size),
            "lr": c.lr_at(step) if step else 0.0, "train_loss_ema": self.ema})
        log.info("w%d step %d: val loss %.4f", self.width, step, vl)
        if step < c.steps:
            self._save_state()
        self.timings["save_s"] += time.perf_counter() - t
        self.bar.set_postfix(val=f"{cm['val_loss']:.3f}", refresh=False)

    def __call__(self, step: int, entry: dict[str, float]) -> bool:
        lv = entry["lm_loss"]
        self.ema = lv if self.ema is None else 0.9 * self.ema + 0.1 * lv
        self.step, self.done_here = step, self.done_here + 1
        self.timings["train_s"] += entry["seconds"]
        self.bar.update(self.config.tokens_per_step)
        self.bar.set_postfix(loss=f"{self.ema:.3f}", lr=f"{entry['lr']:.1e}", refresh=False)
        if (time.perf_counter() - self.last_state > self.resume_every_s
                and step < self.config.steps and step not in self.ckpts):
            t = time.perf_counter()
            self._save_state()
            self.timings["save_s"] += time.perf_counter() - t
        self.checkpoint()
        return self.stopping


def train_width(root: Path, width: int, config: SuiteConfig, data: SuiteData, *,
                progress: bool | None = None, resume_every_s: float = 300.0,
                stop_after_steps: int | None = None,
                make_hooks: MakeHooks | None = None) -> dict[str, Any]:
    """Train (or resume) one width of a suite into ``root/<width>``: the checkpoints, then
    ``width.json``. ``make_hooks(width, model, root/<width>)`` → extra step hooks (e.g. a
    geometry monitor), run after each optimiser step after the suite's own
    (:func:`lmgeom.training.loop.train_loop`). Returns ``width.json``'s record, or
    ``{"status": "stopped", "step": s}`` after ``stop_after_steps``."""
    import torch

    wdir = root / str(width)
    wdir.mkdir(parents=True, exist_ok=True)
    order = data_order(data, config)
    model = build_model(width, config, data.tokenizer)
    model.train()
    opt = make_optimizer(model, config)
    n_params = int(sum(p.numel() for p in model.parameters()))

    def batch_at(step: int) -> dict[str, Any]:
        return {"input_ids": torch.from_numpy(data.chunks(order.batch(step), config.seq_len))}

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(config.seed))
        meta = load_state(wdir, model, opt)
        if meta:
            log.info("w%d: resuming at step %d of %d", width, int(meta["step"]), config.steps)
        run = WidthRun(wdir, width, config, data, model, opt, meta, progress=progress,
                       resume_every_s=resume_every_s, stop_after_steps=stop_after_steps)
        extra = list(make_hooks(width, model, wdir)) if make_hooks is not None else []
        try:
            run.checkpoint()
            for hook in extra:  # e.g. the geometry recorder measures a fresh run's step 0
                if callable(getattr(hook, "start", None)):
                    hook.start(run.step)
            if run.step < config.steps and not run.stopping:
                train_loop(model, opt, model.parameters(), start=run.step, steps=config.steps,
                           batch_at=batch_at, lr_at=lambda step: config.lr_at(step + 1),
                           objective=lm_objective, grad_clip=config.grad_clip,
                           autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16,
                                                           enabled=config.bf16),
                           hooks=[run, *extra], what=f"w{width}",
                           hint="lower --lr or use --no-bf16")
        finally:
            run.bar.close()
    if run.step < config.steps:
        return {"status": "stopped", "step": run.step}
    timings = run.timings
    timings["tokens_per_s"] = (config.steps * config.tokens_per_step / timings["train_s"]
                               if timings["train_s"] > 0 else math.nan)
    record = {
        "status": "complete", "width": width, "label": width_label(width),
        "shape": model_shape(width, config), "n_params": n_params,
        "n_params_non_embedding": n_params - 2 * len(data.tokenizer) * width,
        "steps": checkpoint_steps(config.steps, config.n_regular),
        "threads": torch.get_num_threads(), "bf16": config.bf16, "timings": timings,
    }
    write_json(wdir / WIDTH_DONE, record)
    shutil.rmtree(wdir / "_state", ignore_errors=True)
    shutil.rmtree(wdir / "_state.old", ignore_errors=True)
    return record


def width_complete(root: Path, width: int, config: SuiteConfig) -> bool:
    """Whether ``root/<width>`` holds ``width.json`` and every checkpoint of ``config``."""
    p = root / str(width) / WIDTH_DONE
    if not p.is_file():
        return False
    steps = checkpoint_steps(config.steps, config.n_regular)
    return all(checkpoint_meta(root / str(width) / f"step{s}") is not None for s in steps)


__all__ = ["ORDER_STREAM", "MakeHooks", "WidthRun", "build_model", "checkpoint_meta", "data_order",
           "load_state", "make_optimizer", "save_state", "save_width_checkpoint",
           "train_width", "val_loss", "width_complete"]
