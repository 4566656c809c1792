"""``lmgeom train``: fine-tune with the push-away / squeeze term and compare the arms.

The options are the fields of :class:`~lmgeom.experiments.finetune.FinetuneConfig` (their
``--help`` is its ``Attributes`` docs), plus the model options, ``--aux`` / ``--compare``,
``--lora`` / ``--full`` and the run folder's."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from ..errors import ConfigError
from .options import (
    RunArgs,
    add_model_args,
    add_options,
    arg,
    options_from_args,
    progress_from_args,
)
from .types import float_range, int_range

NAME = "train"
#: the regularisers ``--aux`` / ``--compare`` take (lmgeom.experiments.finetune.ALL_ARMS; kept
#: here as names so ``--help`` loads no torch; a test checks they agree)
COMPARABLE = ("none", "push-away", "squeeze", "infonce-l2", "infonce-cos", "hinge-cos",
              "covariance")

HELP = ("fine-tune with a dispersion regulariser (push-away, squeeze, InfoNCE, hinge, covariance; "
        "full or LoRA); --compare trains several arms side by side")
DESCRIPTION = (
    "Fine-tunes a causal LM on the training split of --texts with L = L_CE + lambda * L_aux, "
    "L_aux = -d (push-away), +d (squeeze) or 0 (none), where d is the dispersion of the batch's "
    "L2-normalised token states at --layer (default final: after the final norm), within the "
    "batch (--aux-mode within) or between the tokens of two domains (--aux-mode cross, with "
    "--texts repeated: every batch holds both domains). Full parameters (--full) or LoRA "
    "(--lora, the default; rank --lora-r, alpha --lora-alpha, all "
    "linear layers of the blocks). Held-out perplexity and token-level dispersion are measured "
    "before, every --eval-every steps and after, on the held-out split of each --texts corpus "
    "and on every --eval-texts corpus. --compare trains the arms it names (any of "
    + " / ".join(COMPARABLE) + ") with the same seed and data order. Writes "
    "train.parquet/.csv (tidy: arm x step x eval set x metric), manifest.json, arms/<arm>/model (safetensors: model + tokenizer, or the LoRA "
    "adapter), per-step logs, plots and report.html. Checkpoints every --save-every steps; "
    "rerun the same command to resume."
)

#: argparse types the library config names by string (beside ``options.TYPES``)
LOCAL_TYPES = {"int>=2": int_range(2), "[0,1)": float_range(0, 1, hi_open=True)}


def local_types(cls: type) -> dict[str, dict[str, object]]:
    """``add_options(..., tweak=...)`` entries giving the fields of ``cls`` whose type is named
    in :data:`LOCAL_TYPES` their parser."""
    out = {}
    for f in dataclasses.fields(cls):
        name = f.metadata.get("cli", {}).get("type")
        if isinstance(name, str) and name in LOCAL_TYPES:
            out[f.name] = {"type": LOCAL_TYPES[name]}
    return out


@dataclass(frozen=True)
class ArmArgs:
    """Which arms train.

    Attributes:
        aux: auxiliary term of a single run (ignored with --compare): push-away, squeeze, none,
            infonce-l2, infonce-cos, hinge-cos or covariance.
        compare: train several regularisers side by side (same seed and data): a comma list
            of --aux names; alone, none,push-away,squeeze.
        seeds: with --compare, repeat the comparison for these seeds (comma list, e.g. 0,1,2):
            compare.parquet holds each regulariser's mean change of held-out perplexity and
            dispersion with a 95 per cent interval over the seeds.
    """

    aux: str = field(default="push-away", metadata=arg(choices=COMPARABLE))
    compare: str | None = field(default=None, metadata=arg(
        nargs="?", const=",".join(COMPARABLE[:3]), metavar="NAMES"))
    seeds: str | None = field(default=None, metadata=arg(metavar="LIST"))


#: the option groups of ``lmgeom train``: title -> FinetuneConfig fields
GROUPS = {
    "data": ("texts", "eval_texts", "n_texts", "heldout_fraction", "seq_len", "bos"),
    "loss": ("lam", "aux_mode", "layer", "max_tokens", "skip_first"),
    "optimisation": ("steps", "lr", "warmup", "weight_decay", "grad_clip", "batch_size",
                     "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "merge_lora"),
    "evaluation and run": ("eval_every", "eval_chunks", "eval_batch_size", "save_every",
                           "stop_after", "keep_checkpoint", "seed"),
    "geometry while training": ("geometry", "geometry_every"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..experiments.finetune import DEFAULT_TEXTS, FinetuneConfig  # heavy: not for --help

    add_model_args(p)
    tweak = local_types(FinetuneConfig)
    tweak.setdefault("geometry", {})["help"] = (
        "do not record the geometry trajectory (by default each arm's geometry.parquet holds "
        "PGA z, dispersion, PC1 share and RankMe at every evaluation step)")
    tweak.setdefault("geometry_every", {}).update(
        metavar="STEPS", help="also record the geometry every STEPS steps (0: evaluation steps "
        "only)")
    for title, names in GROUPS.items():
        g = add_options(p, FinetuneConfig, title=title, only=names, tweak=tweak,
                        repeat=("texts", "eval_texts"),
                        defaults={"texts": " ".join(DEFAULT_TEXTS), "eval_texts": None}
                        if "texts" in names else None)
        if title == "loss":
            add_options(g, ArmArgs)
        if title == "optimisation":
            m = g.add_mutually_exclusive_group()
            m.add_argument("--lora", dest="method", action="store_const", const="lora",
                           help="LoRA through PEFT (default)")
            m.add_argument("--full", dest="method", action="store_const", const="full",
                           help="full-parameter fine-tuning")
            p.set_defaults(method="lora")
        if title == "evaluation and run":
            add_options(g, RunArgs, only=("out", "overwrite", "quiet"), tweak={"out": {
                "help": "output folder (default runs/train-<model>-<method>)"}})


def config_from_args(args):
    """The :class:`~lmgeom.experiments.finetune.FinetuneConfig` of the options (every field
    found on ``args`` by name; texts, arms and progress derived)."""
    from ..experiments.finetune import DEFAULT_TEXTS, FinetuneConfig

    if args.dtype == "float16":
        raise ConfigError("--dtype float16 is not supported for training; use float32 or "
                          "bfloat16 (autocast)")
    if args.revision or args.device_map or args.trust_remote_code:
        raise ConfigError("lmgeom train does not take --revision / --device-map / "
                          "--trust-remote-code; save the model as a folder and pass --model DIR")
    return options_from_args(
        args, FinetuneConfig, texts=tuple(args.texts or DEFAULT_TEXTS),
        eval_texts=tuple(args.eval_texts or ()), arms=arms_from_args(args),
        progress=progress_from_args(args))


def arms_from_args(args) -> tuple[str, ...]:
    """``--compare NAMES`` (or ``--aux``) → the arms, checked."""
    if args.compare is None:
        if args.seeds is not None:
            raise ConfigError("--seeds repeats a comparison: give --compare too")
        return (args.aux,)
    arms = tuple(a.strip() for a in args.compare.split(",") if a.strip())
    bad = [a for a in arms if a not in COMPARABLE]
    if bad or len(arms) < 2 or len(set(arms)) != len(arms):
        raise ConfigError(f"--compare takes two or more distinct names of {', '.join(COMPARABLE)}"
                          f", comma-separated; got {args.compare!r}")
    return arms


def seeds_from_args(args) -> tuple[int, ...] | None:
    if args.seeds is None:
        return None
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--seeds takes a comma list of integers, got {args.seeds!r}") from None
    if len(seeds) < 2 or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigError(f"--seeds needs two or more distinct seeds >= 0 (an interval over "
                          f"seeds), got {args.seeds!r}")
    return seeds


def run(args) -> int:
    from ..experiments.finetune import finetune

    cfg = config_from_args(args)
    out = args.out or f"runs/train-{args.model.replace('/', '_')}-{cfg.method}"
    seeds = seeds_from_args(args)
    if seeds is not None:
        return _compare_seeds(cfg, seeds, out, args)
    res = finetune(cfg, out, overwrite=args.overwrite)
    print(res.summary())
    if not res.finished:
        return 0
    print(f"\nwrote {res.out_dir}/train.parquet, train.csv, manifest.json, arms/*/model and the "
          "report:")
    print(f"  {res.report.resolve() if res.report else '(none)'}")
    return 0


def _compare_seeds(cfg, seeds, out, args) -> int:
    from ..experiments.base import run_experiment
    from ..experiments.finetune import SeedComparison

    run = run_experiment(SeedComparison(cfg, seeds), out, overwrite=args.overwrite,
                         progress=cfg.progress)
    print(run.result.summary())
    print(f"\nwrote {run.path}/compare.parquet, compare.csv, manifest.json and the report:")
    print(f"  {run.report.resolve() if run.report else '(none)'}")
    return 0
