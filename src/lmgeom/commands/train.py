"""``lmgeom train``: fine-tune with the push-away / squeeze term and compare the arms."""

from __future__ import annotations

import argparse

from .options import (
    add_model_args,
    float_range,
    int_range,
    nonneg_float,
    nonneg_int,
    open_fraction,
    path_arg,
    positive_float,
    positive_int,
    progress_from_args,
    seed_int,
)

NAME = "train"
HELP = "fine-tune with the push-away / squeeze dispersion loss (full or LoRA); --compare runs all three arms"
DESCRIPTION = (
    "Fine-tunes a causal LM on the training split of --texts with L = L_CE + lambda * L_aux, "
    "L_aux = -d (push-away), +d (squeeze) or 0 (none), where d is the dispersion of the batch's "
    "L2-normalised token states at --layer (default final: after the final norm), within the "
    "batch (--aux-mode within) or between the tokens of two domains (--aux-mode cross, with "
    "--texts repeated: every batch holds both domains). Full parameters (--full) or LoRA "
    "(--lora, the default; rank --lora-r, alpha --lora-alpha, all "
    "linear layers of the blocks). Held-out perplexity and token-level dispersion are measured "
    "before, every --eval-every steps and after, on the held-out split of each --texts corpus "
    "and on every --eval-texts corpus. --compare trains none / push-away / squeeze with the "
    "same seed and data order. Writes train.parquet/.csv (tidy: arm x step x eval set x "
    "metric), manifest.json, arms/<arm>/model (safetensors: model + tokenizer, or the LoRA "
    "adapter), per-step logs, plots and report.html. Checkpoints every --save-every steps; "
    "rerun the same command to resume."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..experiments.finetune import ARMS, DEFAULT_LR, LORA_DEFAULTS  # heavy: not for --help

    add_model_args(p)
    g = p.add_argument_group("data")
    g.add_argument("--texts", action="append", default=None, metavar="SPEC",
                   help="training corpus; repeat for several domains (default: builtin:wiki)")
    g.add_argument("--eval-texts", action="append", default=None, metavar="SPEC",
                   help="extra evaluation corpus (cross-domain); repeatable")
    g.add_argument("--n", type=positive_int, default=None,
                   help="use a seeded sample of this many texts per corpus (default: all)")
    g.add_argument("--heldout-fraction", type=open_fraction, default=0.1,
                   help="fraction of each training corpus's texts held out for evaluation")
    g.add_argument("--seq-len", type=int_range(2), default=128, help="tokens per training / eval chunk")
    g.add_argument("--bos", default="auto", choices=["auto", "on", "off"],
                   help="BOS before each chunk: auto = when the tokenizer prepends one")

    g = p.add_argument_group("loss")
    g.add_argument("--aux", default="push-away", choices=list(ARMS),
                   help="auxiliary term of a single run (ignored with --compare)")
    g.add_argument("--compare", action="store_true",
                   help="train the three arms none / push-away / squeeze (same seed and data)")
    g.add_argument("--lambda", dest="lam", type=nonneg_float, default=0.01, help="weight of L_aux")
    g.add_argument("--aux-mode", default="within", choices=["within", "cross"],
                   help="dispersion within the batch, or between the tokens of two domains")
    g.add_argument("--layer", default="final",
                   help="measurement point of the loss and of the dispersion measurement "
                        "(final = after the final norm; last = last block, pre-norm; 12; 12.attn_out)")
    g.add_argument("--max-tokens", type=int_range(2), default=None,
                   help="seeded sample of at most this many token states per batch for L_aux")
    g.add_argument("--skip-first", action="store_true",
                   help="leave position 0 (BOS / attention sink) out of L_aux and the dispersion")

    g = p.add_argument_group("optimisation")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--lora", dest="method", action="store_const", const="lora",
                   help="LoRA through PEFT (default)")
    m.add_argument("--full", dest="method", action="store_const", const="full",
                   help="full-parameter fine-tuning")
    p.set_defaults(method="lora")
    g.add_argument("--steps", type=positive_int, default=200, help="optimizer steps per arm")
    g.add_argument("--lr", type=positive_float, default=None,
                   help=f"learning rate (default {DEFAULT_LR['lora']:g} LoRA, {DEFAULT_LR['full']:g} full)")
    g.add_argument("--warmup", type=nonneg_int, default=10, help="linear warm-up steps")
    g.add_argument("--weight-decay", type=nonneg_float, default=0.0, help="AdamW weight decay")
    g.add_argument("--grad-clip", type=nonneg_float, default=1.0, help="max gradient norm (0: off)")
    g.add_argument("--batch-size", type=positive_int, default=8,
                   help="chunks per batch (a multiple of the number of --texts)")
    g.add_argument("--lora-r", type=positive_int, default=LORA_DEFAULTS["r"], help="LoRA rank")
    g.add_argument("--lora-alpha", type=positive_int, default=LORA_DEFAULTS["alpha"], help="LoRA alpha")
    g.add_argument("--lora-dropout", type=float_range(0, 1, hi_open=True), default=LORA_DEFAULTS["dropout"], help="LoRA dropout")
    g.add_argument("--lora-targets", default=LORA_DEFAULTS["targets"],
                   help="LoRA target modules: all-linear, or names like q_proj,v_proj")
    g.add_argument("--merge-lora", action="store_true",
                   help="also save the merged model (analysable with --model DIR)")

    g = p.add_argument_group("evaluation and run")
    g.add_argument("--eval-every", type=positive_int, default=50, help="evaluate every this many steps")
    g.add_argument("--eval-chunks", type=positive_int, default=64, help="chunks per evaluation set")
    g.add_argument("--eval-batch-size", type=positive_int, default=8, help="chunks per evaluation forward")
    g.add_argument("--save-every", type=positive_int, default=None,
                   help="checkpoint every this many steps (default: --eval-every)")
    g.add_argument("--stop-after", type=positive_int, default=None,
                   help="stop (checkpointed) after this many steps in this call; rerun to go on")
    g.add_argument("--keep-checkpoint", action="store_true",
                   help="keep the last checkpoint (optimizer state) after an arm finishes")
    g.add_argument("--out", default=None, type=path_arg, help="output folder (default runs/train-<model>-<method>)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an output folder that holds a different run")
    g.add_argument("--seed", type=seed_int, default=0,
                   help="seed of the split, data order, LoRA init and token sampling")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def config_from_args(args):
    from ..errors import ConfigError
    from ..experiments.finetune import ARMS, FinetuneConfig

    if args.dtype == "float16":
        raise ConfigError("--dtype float16 is not supported for training; use float32 or "
                          "bfloat16 (autocast)")
    if args.revision or args.device_map or args.trust_remote_code:
        raise ConfigError("lmgeom train does not take --revision / --device-map / "
                          "--trust-remote-code; save the model as a folder and pass --model DIR")
    return FinetuneConfig(
        model=args.model, texts=tuple(args.texts or ["builtin:wiki"]),
        eval_texts=tuple(args.eval_texts or ()),
        arms=ARMS if args.compare else (args.aux,), lam=args.lam, aux_mode=args.aux_mode,
        layer=args.layer, max_tokens=args.max_tokens, method=args.method,
        lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        lora_targets=args.lora_targets, steps=args.steps, lr=args.lr, warmup=args.warmup,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip, batch_size=args.batch_size,
        seq_len=args.seq_len, seed=args.seed, eval_every=args.eval_every,
        eval_chunks=args.eval_chunks, eval_batch_size=args.eval_batch_size,
        heldout_fraction=args.heldout_fraction, n_texts=args.n, dtype=args.dtype, bos=args.bos,
        skip_first=args.skip_first, merge_lora=args.merge_lora, device=args.device,
        save_every=args.save_every, stop_after=args.stop_after,
        keep_checkpoint=args.keep_checkpoint, progress=progress_from_args(args))


def run(args) -> int:
    from ..experiments.finetune import finetune

    cfg = config_from_args(args)
    out = args.out or f"runs/train-{args.model.replace('/', '_')}-{cfg.method}"
    res = finetune(cfg, out, overwrite=args.overwrite)
    if not res.finished:
        done = {a: (r.log[-1]["step"] if r.log else 0) for a, r in res.arms.items()}
        print(f"stopped before the end ({', '.join(f'{a}: step {s}' for a, s in done.items())} "
              f"of {cfg.steps}); checkpoints are in {res.out_dir}/arms — rerun the same command "
              "to continue")
        return 0
    print(res.summary_text())
    print(f"\nwrote {res.out_dir}/train.parquet, train.csv, manifest.json, arms/*/model and the "
          "report:")
    print(f"  {res.report.resolve() if res.report else '(none)'}")
    return 0
