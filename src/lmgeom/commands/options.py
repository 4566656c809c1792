"""Options shared by several sub-commands (argument groups, option groups from args, the run
ending), so every command spells them the same way."""

from __future__ import annotations

import argparse
import os

from ..engines.base import EngineConfig
from ..models.bundled import DEFAULT_MODEL

DEFAULT_TEXTS = "builtin:domains"


def add_model_args(p: argparse.ArgumentParser, *, multiple: bool = False) -> None:
    g = p.add_argument_group("model")
    if multiple:
        g.add_argument("--model", action="append", default=None, metavar="SPEC",
                       help=f"model to analyse; repeat for several (default: {DEFAULT_MODEL}). "
                            "A bundled name (see `lmgeom models`), hub id, local folder or .gguf")
    else:
        g.add_argument("--model", default=DEFAULT_MODEL, metavar="SPEC",
                       help="bundled name (see `lmgeom models`), hub id, local folder or .gguf file")
    g.add_argument("--revision", default=None, help="hub revision / branch (e.g. Pythia's step1000)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the forward pass (see docs/dtype.md for the evidence behind the default)")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    g.add_argument("--device-map", default=None, help="transformers device_map, e.g. auto (big models)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow code shipped with a hub model to run (off by default)")
    add_model_args_option(g)


MODEL_ARGS_KEYS = ("pretrained", "revision", "dtype", "device", "device_map", "trust_remote_code")


def add_model_args_option(g) -> None:
    """``--model-args k=v,...`` (lm-evaluation-harness style) beside the separate options."""
    g.add_argument("--model-args", default=None, metavar="K=V,...",
                   help="lm-eval style model arguments, e.g. dtype=bfloat16,revision=step1000,"
                        "trust_remote_code=false (keys: " + ", ".join(MODEL_ARGS_KEYS) + "); "
                        "the same as the separate options, which must not contradict them")


def parse_model_args(text: str) -> dict[str, object]:
    """``"dtype=bfloat16,revision=step1000,trust_remote_code=false"`` → a dict (booleans parsed)."""
    from ..errors import ConfigError

    out: dict[str, object] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"--model-args: {item!r} is not KEY=VALUE")
        if key == "torch_dtype":
            key = "dtype"
        if key not in MODEL_ARGS_KEYS:
            raise ConfigError(f"--model-args: unknown key {key!r}; known: "
                              + ", ".join(MODEL_ARGS_KEYS))
        if key in out:
            raise ConfigError(f"--model-args: {key} given twice")
        value = value.strip()
        if key == "trust_remote_code":
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ConfigError(f"--model-args: trust_remote_code must be true or false, got "
                                  f"{value!r}")
            out[key] = value.lower() in ("true", "1", "yes")
        elif key == "dtype":
            aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16",
                       "fp32": "float32", "float": "float32"}
            value = aliases.get(value, value)
            if value not in ("float32", "bfloat16", "float16"):
                raise ConfigError(f"--model-args: dtype must be float32, bfloat16 or float16, got "
                                  f"{value!r}")
            out[key] = value
        else:
            out[key] = value
    return out


#: the separate options' defaults: a model-args value may fill an option left at its default
_OPTION_DEFAULTS = {"dtype": "float32", "revision": None, "device": None, "device_map": None,
                    "trust_remote_code": False}


def apply_model_args(args) -> None:
    """Merge ``args.model_args`` into the separate model options of ``args`` (in place).

    A key whose separate option was also given with a different value is an error, so a
    command line never means two things."""
    from ..errors import ConfigError
    from ..models.bundled import DEFAULT_MODEL

    text = getattr(args, "model_args", None)
    if not text:
        return
    for key, value in parse_model_args(text).items():
        attr = "model" if key == "pretrained" else key
        if not hasattr(args, attr):
            raise ConfigError(f"--model-args: {key} does not apply to this command")
        current = getattr(args, attr)
        flag = "--" + attr.replace("_", "-")
        if isinstance(current, list) or (current is None and attr in ("model", "revision")
                                         and _takes_list(args, attr)):
            if current and value not in current:  # repeatable option given separately
                raise ConfigError(f"--model-args {key}={value} contradicts {flag} "
                                  f"{' '.join(current)}")
            setattr(args, attr, current or [value])
            continue
        default = DEFAULT_MODEL if attr == "model" else _OPTION_DEFAULTS.get(attr)
        if current != default and current != value:
            raise ConfigError(f"--model-args {key}={value} contradicts {flag} {current}")
        setattr(args, attr, value)


def _takes_list(args, attr: str) -> bool:
    """Whether the command's option is repeatable (``action="append"``, default ``None``)."""
    return attr in getattr(args, "_list_options", ())



def add_texts_args(p: argparse.ArgumentParser, *, default: str = DEFAULT_TEXTS, n: int | None = 512,
                   multiple: bool = False) -> None:
    g = p.add_argument_group("texts")
    if multiple:
        g.add_argument("--texts", action="append", default=None, metavar="SPEC",
                       help=f"text set; repeat for several (default: {default}). builtin:NAME, a "
                            ".txt/.jsonl/.csv/.parquet file, or hf:NAME[:CONFIG][:SPLIT]")
    else:
        g.add_argument("--texts", default=default, metavar="SPEC",
                       help="builtin:NAME (see `lmgeom texts`), a .txt/.jsonl/.csv/.parquet file, or "
                            "hf:NAME[:CONFIG][:SPLIT]")
    g.add_argument("--n", type=positive_int, default=n, help="number of texts (a seeded, label-balanced sample)")
    g.add_argument("--text-column", default=None, help="text column of a jsonl/csv/parquet file")
    g.add_argument("--label-column", default=None, help="label column of a jsonl/csv/parquet file")
    g.add_argument("--split", default=None, help="for .txt: 'paragraphs' splits on blank lines")


def add_extract_args(p: argparse.ArgumentParser, *, layers: str = "all", pooling: str = "last",
                     max_length: int = 128) -> None:
    g = p.add_argument_group("extraction")
    g.add_argument("--layers", default=layers,
                   help="all | blocks | sublayers | final | 0,5,10 | 3-7 | 12.attn_out (comma-separated)")
    g.add_argument("--pooling", default=pooling, choices=["last", "mean", "tokens"],
                   help="one vector per text: last non-pad token, mean of tokens, or sampled tokens")
    g.add_argument("--max-length", type=positive_int, default=max_length, help="tokens kept per text")
    g.add_argument("--batch-size", type=positive_int, default=32, help="texts per forward pass")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the activation cache")


def add_run_args(p: argparse.ArgumentParser, *, out: str | None = None) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", default=out, type=path_arg, help="output folder")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an output folder that holds a different run")
    g.add_argument("--seed", type=seed_int, default=0, help="seed of every sampling step")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def add_engine_args(p, *, extraction: bool = False) -> None:
    """``--engine``, ``--ray-address``, ``--cpus-per-job``, ``--gpus-per-job``, ``--retries``."""
    g = p.add_argument_group("execution (see README: Running on a cluster)")
    g.add_argument("--engine", default="local", choices=["local", "ray", "serial"],
                   help="local: in this process; ray: one Ray task per job on a Ray cluster "
                        "(pip install 'lmgeom[ray]')")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join (auto, host:6379, ray://host:10001; default "
                        "$RAY_ADDRESS, else a private local Ray instance)")
    g.add_argument("--ray-num-cpus", type=positive_int, default=None,
                   help="CPUs of the private local Ray instance (default: all)")
    g.add_argument("--cpus-per-job", type=positive_float, default=1.0,
                   help="CPUs each Ray job requests (also its torch thread count)")
    g.add_argument("--gpus-per-job", type=nonneg_float, default=0.0,
                   help="GPUs each Ray job requests (0: CPU jobs; 0.5 packs two jobs per GPU)")
    g.add_argument("--retries", type=nonneg_int, default=2,
                   help="extra attempts for a failed job before it is reported as failed")
    if extraction:
        g.add_argument("--workers", type=positive_int, default=None,
                       help="model-holding Ray actors sharing the batches (default: as many as "
                            "the cluster fits, at most one per batch)")


def engine_from_args(args):
    """The engine of a command's options; with ``--engine ray`` Ray is started (or joined) and
    the requested resources checked now, before any output folder is written."""
    cfg = EngineConfig(engine=args.engine, address=args.ray_address,
                       cpus_per_job=args.cpus_per_job, gpus_per_job=args.gpus_per_job,
                       retries=args.retries, num_cpus=args.ray_num_cpus,
                       workers=getattr(args, "workers", None))
    if cfg.engine == "ray":
        from ..engines.ray_cluster import ensure_ray

        ensure_ray(cfg)
    return cfg


def default_out(command: str, models) -> str:
    """Default ``--out`` folder of a command: ``runs/<command>-<model>[_<model>...]``."""
    if isinstance(models, str):
        models = [models]
    return f"runs/{command}-" + "_".join(m.replace("/", "_") for m in models)


def load_kwargs_from_args(args) -> dict:
    """The :func:`~lmgeom.load_model` keyword arguments of the model options (plain values, so
    they can travel to a Ray worker)."""
    return dict(dtype=args.dtype, device=args.device, revision=args.revision,
                trust_remote_code=args.trust_remote_code, device_map=args.device_map)


def load_model_from_args(args, spec: str | None = None):
    from ..models import load_model

    return load_model(spec or args.model, **load_kwargs_from_args(args))


def load_texts_from_args(args, spec: str | None = None):
    from ..texts import load_texts

    return load_texts(spec or args.texts, limit=args.n, seed=getattr(args, "seed", 0),
                      split=args.split, text_column=args.text_column,
                      label_column=args.label_column)


def progress_from_args(args) -> bool | None:
    if getattr(args, "quiet", False):
        os.environ["LMGEOM_QUIET"] = "1"
        return False
    return None


def print_table(rows: list[dict], columns: list[str] | None = None, floatfmt: str = "{:.4g}") -> None:
    """Print rows as an aligned plain-text table (CLI output)."""
    from ..results.console import format_table

    print(format_table(rows, columns, floatfmt))


def model_options_from_args(args):
    """The :class:`~lmgeom.experiments.options.ModelOptions` of the model option group."""
    from ..experiments.options import ModelOptions

    return ModelOptions(revision=args.revision, dtype=args.dtype, device=args.device,
                        device_map=args.device_map, trust_remote_code=args.trust_remote_code)


def text_options_from_args(args, spec: str | None = None):
    """The :class:`~lmgeom.experiments.options.TextOptions` of the texts option group."""
    from ..experiments.options import TextOptions

    return TextOptions(spec=spec or args.texts, n=args.n, seed=getattr(args, "seed", 0),
                       split=args.split, text_column=args.text_column,
                       label_column=args.label_column)


def run_and_report(experiment, args, *, report: bool = True):
    """Run ``experiment`` into ``args.out`` (``--overwrite``, ``--quiet``), print its summary
    and where the results are; the one ending every experiment command shares."""
    from ..experiments.base import run_experiment

    progress = progress_from_args(args)
    run = run_experiment(experiment, args.out, overwrite=args.overwrite, progress=progress,
                         report=report)
    print(run.result.summary())
    extra = getattr(run.result, "extra_tables", None)
    extra_files = "".join(f", {stem}.parquet" for stem in (extra() if extra else {}))
    print(f"\nwrote {run.path}/{experiment.table}.parquet, {experiment.table}.csv{extra_files}, "
          "manifest.json" + (", plots and the report:" if run.report else ""))
    if run.report:
        print(f"  {run.report.resolve()}")
    total = run.folder.manifest.get("timings", {}).get("total_s")
    if total is not None:
        print(f"total {total:.1f} s")
    return run


# --------------------------------------------------------------------------- list parsers


def int_list(text: str | None, option: str) -> list[int] | None:
    """``"64,128"`` → ``[64, 128]``; empty or ``None`` → ``None``; anything else a clear error
    that names ``option``."""
    from ..errors import ConfigError

    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()] or None
    except ValueError as exc:
        raise ConfigError(f"{option} must be a comma-separated list of integers, "
                          f"got {text!r}") from exc


def float_list(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated numbers."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def float_or_auto(text: str):
    """argparse type: a number or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from exc


def float_or_auto_list(text: str) -> tuple:
    """argparse type: comma-separated numbers or ``auto``."""
    return tuple(float_or_auto(x) for x in text.split(",") if x.strip())


# --------------------------------------------------------------------------- validated numbers
# argparse types that check the range as the command line is parsed, so a bad value fails
# before any work with ``lmgeom CMD: error: --n must be >= 1 (got 0)`` (see cli._Parser).

#: the largest --seed (every RNG lmgeom seeds takes it; numpy's legacy and torch's take more)
SEED_MAX = 2**32 - 1


def int_range(lo: int | None = None, hi: int | None = None):
    """argparse type: an integer in ``[lo, hi]`` (either end open when ``None``)."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            want = (f"in {lo}..{hi}" if lo is not None and hi is not None
                    else f">= {lo}" if lo is not None else f"<= {hi}")
            raise argparse.ArgumentTypeError(f"must be {want} (got {value})")
        return value

    parse.__name__ = "int"
    return parse


def float_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False):
    """argparse type: a finite number in the interval ``lo..hi`` (ends open when asked)."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        bad = not math.isfinite(value)
        bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
        bad = bad or (hi is not None and (value >= hi if hi_open else value > hi))
        if bad:
            if lo is not None and hi is not None:
                want = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            elif lo is not None:
                want = f"{'>' if lo_open else '>='} {lo:g}"
            elif hi is not None:
                want = f"{'<' if hi_open else '<='} {hi:g}"
            else:
                want = "a finite number"
            raise argparse.ArgumentTypeError(f"must be {want} (got {text.strip()})")
        return value

    parse.__name__ = "float"
    return parse


positive_int = int_range(1)
nonneg_int = int_range(0)
seed_int = int_range(0, SEED_MAX)
positive_float = float_range(0, lo_open=True)
nonneg_float = float_range(0)
#: a share strictly between 0 and 1 (held-out fractions)
open_fraction = float_range(0, 1, lo_open=True, hi_open=True)
#: a weight in [0, 1] (interpolation lambdas)
unit_float = float_range(0, 1)


# --------------------------------------------------------------------------- checks before work

#: optional dependency → the pip command that installs it
OPTIONAL_DEPS = {
    "datasets": "pip install 'lmgeom[hf]'",
    "faiss": "pip install 'lmgeom[knn]' (or pip install faiss-cpu)",
    "peft": "pip install 'lmgeom[train]' (or pip install peft)",
    "ray": "pip install 'lmgeom[ray]'",
}


def require_module(module: str, needed_by: str) -> None:
    """Import ``module`` or raise a :class:`~lmgeom.errors.ConfigError` naming ``needed_by``
    and the pip command (the CLI calls this before any work)."""
    import importlib

    from ..errors import ConfigError

    try:
        importlib.import_module(module)
    except ImportError as exc:
        why = "is not installed" if isinstance(exc, ModuleNotFoundError) else (
            f"cannot be imported ({str(exc).splitlines()[0][:120] if str(exc) else 'ImportError'})")
        raise ConfigError(f"{needed_by} needs the optional package '{module}', which {why}: "
                          f"{OPTIONAL_DEPS.get(module, f'pip install {module}')}") from None


def _values(args, attr: str) -> list[str]:
    v = getattr(args, attr, None)
    if v is None:
        return []
    return [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


#: options that take a text-set spec
TEXT_SPEC_OPTIONS = ("texts", "eval_texts", "train_texts", "domain_texts", "general_texts",
                     "exclude_texts")


def validate_args(args) -> None:
    """Every check that needs no model and no data, run by :func:`lmgeom.cli.main` before the
    command starts: ``LMGEOM_*`` variables, devices, ``--revision`` against the model kinds, and
    the optional packages the options call for."""
    from .._env import check_environment
    from ..errors import ConfigError
    from ..models.checks import check_device, check_device_map

    check_environment()
    for attr in ("device", "metrics_device"):
        for value in _values(args, attr):
            dev = check_device(value, option="--" + attr.replace("_", "-"))
            if attr == "metrics_device" and dev is not None and dev.startswith("mps"):
                raise ConfigError(f"--metrics-device {value}: the PGA null runs in float64, "
                                  "which MPS lacks; use --metrics-device cpu (the default) or "
                                  "cuda")
    for value in _values(args, "device_map"):
        check_device_map(value, option="--device-map")
    _check_revision(args)
    stride, max_length = getattr(args, "stride", None), getattr(args, "max_length", None)
    if isinstance(stride, int) and isinstance(max_length, int) and stride >= max_length:
        raise ConfigError(f"--stride must be smaller than --max-length (got --stride {stride}, "
                          f"--max-length {max_length}): windows of --max-length tokens start "
                          "every --stride tokens")
    cmd = getattr(args, "command", "")
    specs = [("--" + a.replace("_", "-"), s) for a in TEXT_SPEC_OPTIONS for s in _values(args, a)]
    if cmd == "texts":
        specs += [("SPEC", s) for s in _values(args, "spec")]
    hf = [(opt, s) for opt, s in specs if s.startswith("hf:")]
    if hf:
        require_module("datasets", f"{hf[0][0]} {hf[0][1]} (a Hugging Face dataset)")
    if getattr(args, "format", None) == "hf":
        require_module("datasets", "--format hf (a Hugging Face dataset folder)")
    if getattr(args, "engine", None) == "ray":
        require_module("ray", "--engine ray")
    if cmd == "knnlm":
        require_module("faiss", "lmgeom knnlm (the kNN-LM datastore index)")
    if cmd == "train" and getattr(args, "method", None) == "lora":
        require_module("peft", "lmgeom train --lora (the default; --full needs no extra)")


def _check_revision(args) -> None:
    """``--revision`` names a hub revision: refused when no model of the command is a hub id
    (a bundled model, local folder or .gguf has one version), where it would be ignored."""
    from ..errors import ConfigError
    from ..models.bundled import DEFAULT_MODEL
    from ..models.load import SOURCE_WORDS, model_source

    revisions = _values(args, "revision")
    if not revisions or getattr(args, "command", "") == "sweep":  # sweep pairs them itself
        return
    if getattr(args, "suite", None):
        return  # select / sweep with --suite refuse --revision themselves
    models = _values(args, "model") or [DEFAULT_MODEL]
    kinds = {m: model_source(m) for m in models}
    if any(k == "hub" for k in kinds.values()):
        return
    m, kind = next(iter(kinds.items()))
    raise ConfigError(f"--revision applies to hub models only; {m} is "
                      f"{SOURCE_WORDS.get(kind, 'not a hub id')}, which has exactly one version: "
                      "drop --revision (or give a hub id such as EleutherAI/pythia-160m)")


def path_arg(text: str) -> str:
    """argparse type of an output path: not empty (an unset shell variable), no NUL."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string (an unset shell "
                                         "variable?)")
    if "\0" in text:
        raise argparse.ArgumentTypeError("must be a path, got a string with a NUL character")
    return text
