"""One arm of a fine-tuning run (:mod:`lmgeom.experiments.finetune`): the model to train
(LoRA through PEFT, or every parameter), the one training loop
(:func:`lmgeom.training.loop.train_loop`) with the arm's bookkeeping as a step hook
(:class:`ArmRun`: logs, evaluations, checkpoints, the step budget), and what a finished arm
leaves in ``arms/<arm>/``: ``model`` (and ``merged``), ``train_log.csv``, ``result.json``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..._io import atomic_path, write_json
from ...errors import ConfigError
from ...training.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    trainable_parameters,
)
from ...training.geometry import make_recorder
from ...training.loop import aux_objective, show_progress, train_loop
from .config import ArmResult, FinetuneSettings, MakeHooks
from .data import Domain, batch_arrays, domain_schedule
from .evaluation import encode_eval, eval_rows, evaluate, train_rows

log = logging.getLogger("lmgeom.experiments.finetune")

#: the columns of ``arms/<arm>/train_log.csv``
LOG_COLUMNS = ("step", "lm_loss", "dispersion", "aux", "total", "lr", "grad_norm", "seconds")


def load_lm(cfg: FinetuneSettings):
    """The model to fine-tune, in float32 on ``cfg.device``."""
    from ...models import load_model  # torch

    return load_model(cfg.model, dtype="float32", device=cfg.device)


def attach(lm, cfg: FinetuneSettings):
    """The module to train: the LoRA-wrapped model (adapters injected in place) or the model."""
    if cfg.method == "full":
        for p in lm.hf_model.parameters():
            p.requires_grad_(True)
        return lm.hf_model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("LoRA needs the 'peft' package: pip install 'lmgeom[train]' (or "
                          "pip install peft), or use --full") from exc
    targets: Any = cfg.lora_targets
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft probes a deprecated transformers attribute
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                    category=FutureWarning)
            return get_peft_model(lm.hf_model, lcfg)
    except ValueError as exc:
        raise ConfigError(f"LoRA targets {cfg.lora_targets!r} do not match modules of "
                          f"{cfg.model}: {exc}") from exc


def lr_at(cfg: FinetuneSettings, step: int) -> float:
    """Learning rate of 0-based ``step``: linear warm-up over ``warmup`` steps, then constant."""
    if cfg.warmup <= 0:
        return cfg.learning_rate
    return cfg.learning_rate * min(1.0, (step + 1) / cfg.warmup)


def write_log(path: Path, logs: Sequence[dict[str, float]]) -> None:
    """``train_log.csv``: one row per step (:data:`LOG_COLUMNS`)."""
    with atomic_path(path) as tmp:
        pd.DataFrame(list(logs), columns=list(LOG_COLUMNS)).to_csv(tmp, index=False)


def _replace_dir(tmp: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def save_final(lm, model, cfg: FinetuneSettings, arm_dir: Path) -> str:
    """``save_pretrained`` (safetensors) of the model + tokenizer (full) or the adapter (LoRA)
    as ``arm_dir/model``; with ``merge_lora`` also the merged model as ``arm_dir/merged``."""
    target, tmp = arm_dir / "model", arm_dir / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if cfg.method == "lora":
        model.save_pretrained(str(tmp), safe_serialization=True)  # adapter_model.safetensors
    else:
        model.save_pretrained(str(tmp))  # transformers >= 5 always writes safetensors
        lm.tokenizer.save_pretrained(str(tmp))
    _replace_dir(tmp, target)
    if cfg.method == "lora" and cfg.merge_lora:
        mtmp = arm_dir / "merged.tmp"
        shutil.rmtree(mtmp, ignore_errors=True)
        m = model.merge_and_unload()
        m.save_pretrained(str(mtmp))
        lm.tokenizer.save_pretrained(str(mtmp))
        _replace_dir(mtmp, arm_dir / "merged")
    return str(target)


def read_finished(arm: str, arm_dir: Path) -> ArmResult | None:
    """The :class:`ArmResult` of an arm finished earlier (``result.json``), else ``None``."""
    done = arm_dir / "result.json"
    if not done.is_file():
        return None
    r = json.loads(done.read_text())
    return ArmResult(arm, r["rows"], r["log"], True, r.get("model_dir"), r.get("seconds", 0.0),
                     {**r.get("info", {}), "steps_run": 0}, r.get("final_eval"))


class ArmRun:
    """The state of one arm while it trains, and its step hook: after each optimiser step it
    logs, evaluates at the evaluation steps, checkpoints every ``save_every`` steps and stops
    (checkpointed) when the step budget of this call is spent."""

    def __init__(self, cfg: FinetuneSettings, arm: str, label: str, lm, model, opt, aux,
                 domains: Sequence[Domain], eval_sets: dict[str, np.ndarray], ck_dir: Path, *,
                 budget: int | None, on_eval: Callable[[str, int, dict], None] | None,
                 progress: bool | None) -> None:
        self.cfg, self.arm, self.label = cfg, arm, label
        self.lm, self.model, self.opt, self.aux = lm, model, opt, aux
        self.domains, self.eval_sets, self.ck_dir = domains, eval_sets, ck_dir
        self.budget, self.on_eval, self.progress = budget, on_eval, progress
        self.save_every = cfg.save_every or cfg.eval_every
        self.eval_at = set(cfg.eval_steps)
        self.step0, self.rows, self.logs = 0, [], []
        self.final_eval: dict[str, Any] | None = None
        self.elapsed, self.ran, self.stopped = 0.0, 0, False
        self.since_eval: list[dict[str, float]] = []
        self.bar: Any = None
        self.t_run = time.perf_counter()

    def start(self, baseline: dict[str, dict[str, Any]] | None) -> None:
        """Resume from the arm's checkpoint, or measure step 0 (``baseline`` when given)."""
        cfg = self.cfg
        found = find_checkpoint(self.ck_dir)
        if found is not None:
            st = load_checkpoint(found, self.model, self.opt)
            self.step0, self.rows, self.logs = int(st["step"]), st["rows"], st["log"]
            last = st.get("last_eval")
            self.final_eval = last if isinstance(last, dict) else None
            self.aux.calls = int(st["aux_calls"])
            self.elapsed = float(st.get("seconds", 0.0))
            log.info("%s: resuming from step %d (%s)", self.arm, self.step0, found)
        else:
            ev = baseline if baseline is not None else self._evaluate()
            self.rows = eval_rows(cfg, self.arm, self.label, 0, ev, self.domains)
            if self.on_eval:
                self.on_eval(self.arm, 0, ev)
        last_step = max(s for s in self.eval_at if s <= self.step0)
        self.since_eval = [g for g in self.logs if g["step"] > last_step]
        self.bar = tqdm(total=cfg.steps, initial=self.step0, desc=f"train {self.arm}",
                        unit="step", disable=not show_progress(self.progress), leave=False)
        self.t_run = time.perf_counter()

    def _evaluate(self) -> dict[str, dict[str, Any]]:
        c = self.cfg
        return evaluate(self.lm, self.eval_sets, self.label, batch_size=c.eval_batch_size,
                        skip_first=c.skip_first, seed=c.seed)

    @property
    def seconds(self) -> float:
        return self.elapsed + time.perf_counter() - self.t_run

    def _log_progress(self, s: int, entry: dict[str, float]) -> None:
        self.bar.update(1)
        self.bar.set_postfix(lm=f"{entry['lm_loss']:.3f}", d=f"{entry['dispersion']:.3f}")
        if s % 10 == 0:
            recent = self.logs[-10:]
            log.info("%s step %d/%d: lm_loss %.4f, d %.4f, %.1f s/step", self.arm, s,
                     self.cfg.steps, np.mean([g["lm_loss"] for g in recent]),
                     np.mean([g["dispersion"] for g in recent]),
                     np.mean([g.get("seconds", np.nan) for g in recent]))

    def __call__(self, s: int, entry: dict[str, float]) -> bool:
        cfg = self.cfg
        self.logs.append(entry)
        self.since_eval.append(entry)
        self.ran += 1
        self._log_progress(s, entry)
        if s in self.eval_at:
            ev = self._evaluate()
            self.rows += eval_rows(cfg, self.arm, self.label, s, ev, self.domains)
            self.rows += train_rows(cfg, self.arm, self.label, s, self.since_eval)
            self.final_eval = encode_eval(ev)
            self.since_eval = []
            if self.on_eval:
                self.on_eval(self.arm, s, ev)
        stopping = self.budget is not None and self.ran >= self.budget and s < cfg.steps
        if s % self.save_every == 0 or stopping:
            save_checkpoint(self.ck_dir, self.model, self.opt, {
                "step": s, "rows": self.rows, "log": self.logs, "aux_calls": self.aux.calls,
                "arm": self.arm, "last_eval": self.final_eval, "seconds": self.seconds})
        self.stopped = stopping
        return stopping


def _finish(run: ArmRun, arm_dir: Path, n_trainable: int, t0: float) -> ArmResult:
    """Save the trained arm (model, log, ``result.json``) and drop its checkpoint."""
    cfg, seconds = run.cfg, run.seconds
    model_dir = save_final(run.lm, run.model, cfg, arm_dir)
    write_log(arm_dir / "train_log.csv", run.logs)
    info = {"steps_run": run.ran, "n_trainable": n_trainable,
            "n_parameters": int(sum(p.numel() for p in run.lm.hf_model.parameters())),
            "layer": run.label, "aux_degenerate_batches": run.aux.n_degenerate,
            "train_seconds": seconds, "wall_seconds_this_call": time.perf_counter() - t0}
    write_json(arm_dir / "result.json", {"rows": run.rows, "log": run.logs,
                                         "model_dir": model_dir, "seconds": seconds,
                                         "info": info, "final_eval": run.final_eval})
    if not cfg.keep_checkpoint:
        shutil.rmtree(run.ck_dir, ignore_errors=True)
        shutil.rmtree(run.ck_dir.with_name(run.ck_dir.name + ".old"), ignore_errors=True)
    return ArmResult(run.arm, run.rows, run.logs, True, model_dir, seconds, info,
                     run.final_eval)


def train_arm(cfg: FinetuneSettings, arm: str, domains: Sequence[Domain],
              eval_sets: dict[str, np.ndarray], arm_dir: Path, *,
              baseline: dict[str, dict[str, Any]] | None = None,
              on_eval: Callable[[str, int, dict], None] | None = None,
              budget: int | None = None, progress: bool | None = None,
              make_hooks: MakeHooks | None = None) -> ArmResult:
    """Train one arm into ``arm_dir`` (resuming from its checkpoint when there is one; a
    finished arm is read back from ``result.json``).

    Args:
        budget: stop (checkpointed) after this many steps of this call (None: no limit).
        make_hooks: ``make_hooks(arm, model, arm_dir)`` → extra step hooks (e.g. a geometry
            monitor), run after each optimiser step after the arm's own
            (:func:`lmgeom.training.loop.train_loop`'s ``hooks``).
    """
    import torch

    from ...training.losses import resolve_layer
    from ...training.regularisers import make_aux_loss

    done = read_finished(arm, arm_dir)
    if done is not None:
        return done
    t0 = time.perf_counter()
    lm = load_lm(cfg)
    label = resolve_layer(lm, cfg.layer)
    dev = lm.device
    sched = domain_schedule(domains, cfg.batch_size, cfg.seed)
    ac = ((lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if cfg.dtype == "bfloat16"
          else contextlib.nullcontext)

    def batch_at(step: int) -> dict[str, Any]:
        ids, dom = batch_arrays(sched, domains, step)
        return {"input_ids": torch.from_numpy(ids).to(dev),
                "attention_mask": torch.ones(ids.shape, dtype=torch.long, device=dev),
                "domain": torch.from_numpy(dom).to(dev)}

    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(cfg.seed)
        model = attach(lm, cfg)
        params = [p for _, p in trainable_parameters(model)]
        opt = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(0.9, 0.999),
                                weight_decay=cfg.weight_decay)
        aux = make_aux_loss(arm, lam=cfg.lam, layer=label, mode=cfg.aux_mode,
                            max_tokens=cfg.max_tokens, seed=cfg.seed, skip_first=cfg.skip_first)
        run = ArmRun(cfg, arm, label, lm, model, opt, aux, domains, eval_sets,
                     arm_dir / "checkpoint", budget=budget, on_eval=on_eval, progress=progress)
        run.start(baseline)
        model.train()
        extra = list(make_hooks(arm, model, arm_dir)) if make_hooks is not None else []
        if cfg.geometry:  # measures the model being trained (LoRA adapters are in lm in place)
            rec = make_recorder(lm, None, arm_dir, name=arm, at_steps=cfg.eval_steps,
                                every=cfg.geometry_every, last_step=cfg.steps, seed=cfg.seed)
            rec.start(run.step0)
            extra.append(rec)
        try:
            train_loop(model, opt, params, start=run.step0, steps=cfg.steps, batch_at=batch_at,
                       lr_at=lambda step: lr_at(cfg, step), objective=aux_objective(aux),
                       grad_clip=cfg.grad_clip, autocast=ac, hooks=[run, *extra], what=arm,
                       hint="lower --lr or --lambda")
        finally:
            run.bar.close()
        if run.stopped:
            log.warning("%s: stopped after step %d of %d (checkpointed); rerun to continue",
                        arm, run.logs[-1]["step"], cfg.steps)
            return ArmResult(arm, run.rows, run.logs, False, None, run.seconds,
                             {"steps_run": run.ran})
    n_trainable = int(sum(p.numel() for p in params))
    return _finish(run, arm_dir, n_trainable, t0)


__all__ = [
    "LOG_COLUMNS",
    "ArmRun",
    "attach",
    "load_lm",
    "lr_at",
    "read_finished",
    "save_final",
    "train_arm",
    "write_log",
]
