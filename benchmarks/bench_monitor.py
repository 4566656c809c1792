"""Geometry monitor (issue 29): what watching the geometry costs a training run. Per model: one
optimiser step (``t_step``, median), one monitor call (``t_call`` = forward of the default probe
set, 256 ``builtin:domains`` texts × 64 tokens, + metrics on the default layers; median of 3
calls after a warm-up call that compiles the rank kernel), and the overhead at ``every`` = 50,
100, 500: predicted ``t_call / (every · t_step)`` for each model, and **measured** end to end
(wall time of 500 optimiser steps with the monitor / without it − 1) on the micro suite's model
(steps of 4 × 16 tokens, so the overhead is large enough to time and to check the rule). Models: the width suite's default shapes (``SuiteConfig()``: 6 layers,
widths 64-512, batches of 16 × 128 tokens, AdamW) and SmolLM2-135M fine-tuning (bundled
weights, AdamW on every weight, batches of 8 × 128 tokens). CPU, float32.

    LMGEOM_QUIET=1 python benchmarks/run.py --only monitor [--profile full]
"""

from __future__ import annotations

import statistics
import time

import numpy as np

EVERY = (50, 100, 500)


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _suite_model(width: int, config, tokenizer):
    from lmgeom.training.suite_width import build_model

    return build_model(width, config, tokenizer)


def _adamw_step(model, opt, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _random_batch(vocab: int, batch: int, seq: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, seq), generator=g)


def _call_time(monitor, n: int = 3, warm: bool = True) -> tuple[float, float, float]:
    if warm:
        monitor.measure(0)  # warm-up: compiles the rank kernel, warms the caches
    for s in range(1, n + 1):
        monitor.measure(s)
    t = monitor.timings[-n:]
    fwd = statistics.median(x["forward_s"] for x in t)
    met = statistics.median(x["metrics_s"] for x in t)
    return fwd, met, statistics.median(x["forward_s"] + x["metrics_s"] for x in t)


def _rows(name: str, d: int, t_step: float, fwd: float, met: float, call: float,
          notes: str = "") -> list[dict]:
    out = [{"bench": "monitor", "model": name, "d": d, "what": "one optimiser step",
            "seconds": t_step, "overhead_%": float("nan"), "notes": notes},
           {"bench": "monitor", "model": name, "d": d, "what": "monitor call: forward",
            "seconds": fwd, "overhead_%": float("nan"), "notes": "256 texts × 64 tokens"},
           {"bench": "monitor", "model": name, "d": d, "what": "monitor call: metrics",
            "seconds": met, "overhead_%": float("nan"),
            "notes": "PGA z (4096 pairs, 20 nulls), dispersion, PC1 share, RankMe per layer"}]
    for every in EVERY:
        out.append({"bench": "monitor", "model": name, "d": d,
                    "what": f"overhead every={every} (predicted)", "seconds": float("nan"),
                    "overhead_%": 100.0 * call / (every * t_step), "notes": ""})
    return out


def _measured_overhead(steps: int) -> list[dict]:
    """Wall time of ``steps`` AdamW steps of the micro suite's widest model (4 × 16 tokens a
    step: tiny steps, so the overhead is large and measurable) with a monitor at each ``every``
    vs without, the same batches; runs interleaved. Checks the rule against a clock."""
    import torch

    from lmgeom.monitor import GeometryMonitor
    from lmgeom.texts import load_texts
    from lmgeom.training.suite_config import SuiteConfig
    from lmgeom.training.tokenizer import train_tokenizer

    cfg = SuiteConfig.micro()
    tok = train_tokenizer(load_texts("builtin:news").texts, cfg.vocab_size,
                          max_chars=cfg.tokenizer_chars)
    w = cfg.widths[-1]
    batches = [_random_batch(len(tok), cfg.batch_size, cfg.seq_len, s) for s in range(8)]

    def run(every: int | None) -> tuple[float, float]:
        model = _suite_model(w, cfg, tok)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        mon = None if every is None else GeometryMonitor(model, tokenizer=tok, every=every, k=4)
        if mon is not None:
            mon.measure(-1)  # compiles the rank kernel: a one-off, not a per-call cost
        t = time.perf_counter()
        for s in range(1, steps + 1):
            _adamw_step(model, opt, batches[s % len(batches)])
            if mon is not None:
                mon.step(s)
        took = time.perf_counter() - t
        calls = [] if mon is None else [x["forward_s"] + x["metrics_s"] for x in mon.timings[1:]]
        return took, (statistics.median(calls) if calls else float("nan"))

    times = {e: run(e) for e in (None, *EVERY)}
    base = times[None][0]
    t_step = base / steps
    name = f"micro suite w{w}"
    rows = [{"bench": "monitor", "model": name, "d": w,
             "what": f"{steps} steps, no monitor (measured)", "seconds": base,
             "overhead_%": 0.0, "notes": f"{cfg.batch_size}×{cfg.seq_len} tokens a step"}]
    for e in EVERY:
        t, call = times[e]
        rows.append({"bench": "monitor", "model": name, "d": w,
                     "what": f"{steps} steps, every={e} (measured)", "seconds": t,
                     "overhead_%": 100.0 * (t / base - 1.0),
                     "notes": f"{steps // e} calls of {call:.2f} s; the rule predicts "
                              f"{100.0 * call / (e * t_step):.0f} %"})
    return rows


def _suite(profile: str) -> list[dict]:
    import torch

    from lmgeom.monitor import GeometryMonitor
    from lmgeom.texts import load_texts
    from lmgeom.training.suite_config import SuiteConfig
    from lmgeom.training.tokenizer import train_tokenizer

    cfg = SuiteConfig()
    texts = load_texts("builtin:news").texts
    tok = train_tokenizer(texts, cfg.vocab_size, max_chars=cfg.tokenizer_chars)
    rows: list[dict] = []
    widths = cfg.widths if profile == "full" else cfg.widths[:1]
    for w in widths:
        model = _suite_model(w, cfg, tok)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        ids = _random_batch(len(tok), cfg.batch_size, cfg.seq_len, 0)
        _adamw_step(model, opt, ids)
        t_step = _median_time(lambda m=model, o=opt, i=ids: _adamw_step(m, o, i), 5)
        mon = GeometryMonitor(model, tokenizer=tok, name=f"suite w{w}")
        fwd, met, call = _call_time(mon)
        print(f"suite w{w}: step {t_step:.2f} s, call {call:.2f} s", flush=True)
        rows += _rows(f"suite w{w}", w, t_step, fwd, met, call,
                      f"{cfg.n_layers} layers, {cfg.batch_size}×{cfg.seq_len} tokens; "
                      f"monitor layers {','.join(mon.layers)}")
    return rows + _measured_overhead(1000 if profile == "full" else 500)


def _smollm(profile: str) -> list[dict]:
    import torch

    import lmgeom
    from lmgeom.monitor import GeometryMonitor

    lm = lmgeom.load_model("smollm2-135m", device="cpu")
    model = lm.hf_model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = _random_batch(lm.vocab_size, 8, 128, 0)
    _adamw_step(model, opt, ids)
    t_step = _median_time(lambda: _adamw_step(model, opt, ids), 3 if profile == "full" else 2)
    mon = GeometryMonitor(lm, name="smollm2-135m")
    # the rank kernel is compiled already (the suite part ran first in this process)
    fwd, met, call = _call_time(mon, n=3 if profile == "full" else 1, warm=profile == "full")
    return _rows("smollm2-135m", lm.width, t_step, fwd, met, call,
                 f"fine-tuning, 8×128 tokens, AdamW on all weights; monitor layers "
                 f"{','.join(mon.layers)}")


def run(profile: str = "quick") -> list[dict]:
    np.random.seed(0)
    return _suite(profile) + _smollm(profile)


def curve(out_dir: str = "runs/monitor-curve", steps: int = 200,
          image: str = "docs/img/monitor-suite-w64.png") -> None:
    """The README's curve: a width-suite model (d = 64, 6 layers, the suite's GPT-NeoX shape and
    tokenizer settings) trained from scratch on ``builtin:news`` with ``transformers.Trainer``
    and :class:`~lmgeom.monitor.GeometryCallback` (every 20 steps, default probe set); PGA z
    and dispersion per layer against step, from the callback's ``geometry.parquet``."""
    import torch
    from matplotlib.figure import Figure
    from transformers import Trainer, TrainingArguments

    from lmgeom.monitor import GeometryCallback
    from lmgeom.results.table import read_table
    from lmgeom.texts import load_texts
    from lmgeom.training.suite_config import SuiteConfig
    from lmgeom.training.tokenizer import train_tokenizer

    cfg = SuiteConfig()
    texts = load_texts("builtin:news").texts
    tok = train_tokenizer(texts, cfg.vocab_size, max_chars=cfg.tokenizer_chars)
    ids = np.concatenate([tok(t)["input_ids"] + [tok.eos_token_id] for t in texts])
    chunks = torch.from_numpy(ids[: len(ids) // 64 * 64].reshape(-1, 64).astype(np.int64))

    class Chunks(torch.utils.data.Dataset):
        def __len__(self):
            return len(chunks)

        def __getitem__(self, i):
            return {"input_ids": chunks[i], "labels": chunks[i]}

    model = _suite_model(64, cfg, tok)
    args = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=8,
                             learning_rate=3e-3, warmup_steps=20, logging_steps=20,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Chunks(), processing_class=tok)
    GeometryCallback(every=20).attach(trainer)
    trainer.train()
    df = read_table(f"{out_dir}/geometry.parquet")
    df = df[df.layer_index >= 0].copy()
    df["step"] = df.revision.str[4:].astype(int)
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (metric, label) in zip(axes, (("pga_z", "Subspace PGA z (CCR-1)"),
                                          ("dispersion", "dispersion (across probe texts)"))):
        sel = df[df.metric == metric]
        for layer, g in sel.groupby("layer_index"):
            g = g.sort_values("step")
            ax.plot(g.step, g.value, marker="o", ms=2.5, lw=1.2,
                    label=str(g.layer.iloc[0]), color=f"C{int(layer) % 10}")
        ax.set_xlabel("training step")
        ax.set_title(label, loc="left", fontsize=10)
        if metric == "pga_z":
            ax.axhline(0.0, color="black", lw=0.8)
    axes[1].legend(title="layer", fontsize=7, ncols=2)
    fig.suptitle("GeometryCallback on a width-suite model (d = 64, 6 layers) trained on "
                 "builtin:news", fontsize=10)
    fig.savefig(image, dpi=110)
    print(f"wrote {image}")


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.path.insert(0, ".")
    if sys.argv[1:2] == ["curve"]:
        curve()
        sys.exit(0)
    from benchmarks.run import _table

    print(_table(run(sys.argv[1] if len(sys.argv) > 1 else "quick")))
