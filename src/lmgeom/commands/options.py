"""How a command declares its options: option groups as dataclasses (tuned-lens style).

An option group is a dataclass; each field is one option. The field's name gives the flag
(``max_length`` → ``--max-length``), its default the default, its entry in the class
docstring's ``Attributes:`` section the ``--help`` text, and its ``metadata`` (:func:`arg`)
whatever else argparse needs (a validated type, choices, a metavar, another flag)::

    @dataclass(frozen=True)
    class ClusterArgs:
        \"\"\"Attributes:
            ngram: length of the shared continuation.
        \"\"\"
        ngram: int = field(default=10, metadata=arg(type=positive_int))

    def add_arguments(p):
        add_options(p, ClusterArgs, title="clusters")

    def run(args):
        config = options_from_args(args, ClusterConfig)  # every field found on args, by name

:func:`options_from_args` builds any dataclass (an option group or a library config) from the
parsed arguments by field name, so no command copies a field list by hand. The shared groups
live in the library (:class:`~lmgeom.experiments.options.ModelOptions`,
:class:`~lmgeom.experiments.options.TextOptions`, :class:`~lmgeom.engines.base.EngineConfig`)
or here (:class:`ModelArgs`, :class:`ExtractArgs`, :class:`RunArgs`); ``add_model_args`` and
friends add them with a command's own defaults.

The validated argparse types (:mod:`lmgeom.commands.types`) and the checks before work
(:mod:`lmgeom.commands.checks`) live in their own modules; a command imports each from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engines.base import EngineConfig
from ..engines.ray_cluster import ensure_ray
from ..errors import ConfigError
from ..experiments.options import DEFAULT_TEXTS, ModelOptions, TextOptions
from ..models.bundled import DEFAULT_MODEL
from ..results.console import format_table
from .types import (
    nonneg_float,
    nonneg_int,
    open_fraction,
    path_arg,
    positive_float,
    positive_int,
    seed_int,
    unit_float,
)

# --------------------------------------------------------------------------- the mechanism

#: validated types a library dataclass (which cannot import this layer) names by string
TYPES: dict[str, Any] = {
    "positive_int": positive_int, "nonneg_int": nonneg_int, "seed_int": seed_int,
    "positive_float": positive_float, "nonneg_float": nonneg_float, "path_arg": path_arg,
    "open_fraction": open_fraction, "unit_float": unit_float,
}

#: what :func:`arg` accepts: argparse's own keywords, ``flag`` (the option string) and
#: ``cli=False`` (a field that is not an option)
ARG_KEYS = ("flag", "type", "choices", "metavar", "action", "nargs", "const", "dest", "help",
            "cli")


def arg(**spec: Any) -> dict[str, Any]:
    """Field metadata: how an option-group field appears on the command line.

    ``field(default=8, metadata=arg(type=positive_int))``. Keys: ``flag`` (default
    ``--field-name``), ``dest`` (the ``args`` attribute; default from the flag), ``type`` (a
    callable, or a name in :data:`TYPES`), ``choices``, ``metavar``, ``action``, ``nargs``,
    ``const``, ``help`` (default: the docstring's ``Attributes:`` entry), ``cli=False``.
    A library dataclass writes the same dict by hand: ``metadata={"cli": {...}}``.
    """
    unknown = set(spec) - set(ARG_KEYS)
    if unknown:
        raise TypeError(f"arg(): unknown keys {sorted(unknown)}; known: {', '.join(ARG_KEYS)}")
    return {"cli": spec}


def field_docs(cls: type) -> dict[str, str]:
    """``{field: text}`` from the ``Attributes:`` sections of the (Google-style) docstrings of
    ``cls`` and its bases (a subclass's entry wins); continuation lines joined, RST double
    back-quotes and a final full stop dropped."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__doc__" in vars(klass):
            docs.update(_attribute_docs(klass.__doc__ or ""))
    return docs


def _attribute_docs(doc: str) -> dict[str, str]:
    docs: dict[str, str] = {}
    lines = doc.expandtabs().splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == "Attributes:")
    except StopIteration:
        return docs
    indent, name = None, None
    for ln in lines[start + 1:]:
        if not ln.strip():
            continue
        depth = len(ln) - len(ln.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break
        m = re.match(r"(\w+)(?: \([^)]*\))?: ?(.*)$", ln.strip())
        if depth == indent and m:
            name = m.group(1)
            docs[name] = m.group(2)
        elif name is not None:
            docs[name] += " " + ln.strip()
    # one phrase per option, as argparse help reads: no final full stop
    return {k: " ".join(v.replace("``", "").split()).removesuffix(".") for k, v in docs.items()}


def _spec(f: dataclasses.Field) -> dict[str, Any]:
    return dict(f.metadata.get("cli", {}))


def option_dest(f: dataclasses.Field) -> str:
    """The ``args`` attribute of an option-group field."""
    spec = _spec(f)
    if "dest" in spec:
        return spec["dest"]
    return spec["flag"].lstrip("-").replace("-", "_") if "flag" in spec else f.name


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_options(p, cls: type, *, title: str | None = None, only: Collection[str] | None = None,
                exclude: Collection[str] = (), defaults: Mapping[str, Any] | None = None,
                repeat: Collection[str] = (), tweak: Mapping[str, Mapping[str, Any]] | None = None):
    """Add one option per field of the dataclass ``cls`` to ``p`` (a parser or a group).

    Args:
        p: an ``ArgumentParser`` or an argument group.
        cls: the option group.
        title: put the options in a new argument group of this title (else straight into ``p``).
        only / exclude: the fields to add (default: every field not marked ``cli=False``).
        defaults: a command's own defaults, by field name.
        repeat: fields that become repeatable (``action="append"``, default ``None``); the help
            then names the single default.
        tweak: per-field :func:`arg` keys that differ for this command (another type or
            help; never another flag or dest, which :func:`options_from_args` reads).

    Returns:
        The group (or ``p``), to add more options to.
    """
    g = p.add_argument_group(title) if title else p
    docs = field_docs(cls)
    defaults = dict(defaults or {})
    for f in dataclasses.fields(cls):
        spec = {**_spec(f), **(tweak or {}).get(f.name, {})}
        if not spec.pop("cli", True) or f.name in exclude or (only is not None
                                                              and f.name not in only):
            continue
        flag = spec.pop("flag", "--" + f.name.replace("_", "-"))
        default = defaults.pop(f.name) if f.name in defaults else _default(f)
        help_ = spec.pop("help", None) or docs.get(f.name)
        if help_ is None:
            raise TypeError(f"{cls.__name__}.{f.name}: no help (an 'Attributes:' entry in the "
                            "docstring, or arg(help=...))")
        if isinstance(spec.get("type"), str):
            spec["type"] = TYPES[spec["type"]]
        if "action" not in spec and (f.type in ("bool", bool)):
            spec["action"] = "store_true"
        if "choices" in spec:
            spec["choices"] = list(spec["choices"])
        if f.name in repeat:
            spec["action"] = "append"
            help_ = help_.rstrip(".") + "; repeat for several" + (
                f" (default: {default})" if default is not None else "")
            default = None
        g.add_argument(flag, default=default, help=help_, **spec)
    if defaults:
        raise TypeError(f"add_options({cls.__name__}): no such fields {sorted(defaults)}")
    return g


def options_from_args(args, cls: type, /, **override: Any):
    """``cls`` (any dataclass) from the parsed arguments: every field whose option is on
    ``args`` (by :func:`option_dest`, i.e. by name) takes its value, ``override`` wins, the
    rest keep their defaults. ``cls`` may be an option group or a library config whose fields
    share the options' names."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in override:
            values[f.name] = override.pop(f.name)
        elif hasattr(args, option_dest(f)):
            values[f.name] = getattr(args, option_dest(f))
    if override:
        raise TypeError(f"options_from_args({cls.__name__}): no such fields {sorted(override)}")
    return cls(**values)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` after an option's help, except where there is nothing to state (a
    ``None`` default, a flag that is off) or the help already states it."""

    def _get_help_string(self, action):
        help_ = action.help or ""
        if (action.default in (None, False, argparse.SUPPRESS)
                or re.search(r"\(default|default:|%\(default\)", help_)):
            return help_
        return super()._get_help_string(action)


# --------------------------------------------------------------------------- shared groups


@dataclass(frozen=True)
class ModelArgs:
    """Which model a command runs (beside :class:`~lmgeom.experiments.options.ModelOptions`).

    Attributes:
        model: bundled name (see `lmgeom models`), hub id, local folder or .gguf file.
        model_args: lm-eval style model arguments, e.g. dtype=bfloat16,revision=step1000,
            trust_remote_code=false (keys: pretrained, revision, dtype, device, device_map,
            trust_remote_code); the same as the separate options, which must not contradict
            them.
    """

    model: str = field(default=DEFAULT_MODEL, metadata=arg(metavar="SPEC"))
    model_args: str | None = field(default=None, metadata=arg(metavar="K=V,..."))


@dataclass(frozen=True)
class ExtractArgs:
    """How states are extracted.

    Attributes:
        layers: all | blocks | sublayers | final | 0,5,10 | 3-7 | 12.attn_out (comma-separated).
        pooling: one vector per text: last non-pad token, mean of tokens, or sampled tokens.
        max_length: tokens kept per text.
        batch_size: texts per forward pass.
        no_cache: do not read or write the activation cache.
    """

    layers: str = "all"
    pooling: str = field(default="last", metadata=arg(choices=("last", "mean", "tokens")))
    max_length: int = field(default=128, metadata=arg(type=positive_int))
    batch_size: int = field(default=32, metadata=arg(type=positive_int))
    no_cache: bool = False


@dataclass(frozen=True)
class RunArgs:
    """Where a run folder goes and how the run behaves.

    Attributes:
        out: output folder.
        overwrite: replace an output folder that holds a different run.
        seed: seed of every sampling step.
        quiet: no progress bars.
    """

    out: str | None = field(default=None, metadata=arg(type=path_arg))
    overwrite: bool = False
    seed: int = field(default=0, metadata=arg(type=seed_int))
    quiet: bool = False


@dataclass(frozen=True)
class CandidateArgs:
    """The models a multi-model command (``sweep``, ``select``) compares, or a trained suite.

    Attributes:
        model: a model (bundled name, hub id, local folder or .gguf file); repeat for several.
        suite: every width x saved checkpoint of a suite folder from `lmgeom suite train --out
            DIR`.
        widths: with --suite: only these widths, comma-separated (64,128 or w64).
        steps: with --suite: only these checkpoint steps, comma-separated.
    """

    model: list[str] | None = field(default=None, metadata=arg(action="append", metavar="SPEC"))
    suite: str | None = field(default=None, metadata=arg(metavar="DIR"))
    widths: str | None = None
    steps: str | None = None


def add_model_args(p: argparse.ArgumentParser, *, multiple: bool = False,
                   only: Collection[str] | None = None, repeat: Collection[str] = (),
                   title: str = "model"):
    """``--model`` (repeatable with ``multiple``), the :class:`ModelOptions` (``only`` some of
    them; ``repeat`` some) and ``--model-args`` (with every model option)."""
    g = add_options(p, ModelArgs, title=title, only=("model",),
                    repeat=("model",) if multiple else ())
    add_options(g, ModelOptions, only=only, repeat=repeat)
    if only is None:
        add_options(g, ModelArgs, only=("model_args",))
    return g


#: the keys of ``--model-args``: ``pretrained`` (= ``--model``) and every model option
MODEL_ARGS_KEYS = ("pretrained", *(f.name for f in dataclasses.fields(ModelOptions)))


def parse_model_args(text: str) -> dict[str, object]:
    """``"dtype=bfloat16,revision=step1000,trust_remote_code=false"`` → a dict (booleans parsed)."""
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
_OPTION_DEFAULTS = {f.name: _default(f) for f in dataclasses.fields(ModelOptions)}


def apply_model_args(args) -> None:
    """Merge ``args.model_args`` into the separate model options of ``args`` (in place).

    A key whose separate option was also given with a different value is an error, so a
    command line never means two things."""
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
                   multiple: bool = False):
    """The :class:`~lmgeom.experiments.options.TextOptions` group (``--texts``, ``--n``,
    columns, ``--split``; its seed is ``--seed`` of the run group)."""
    return add_options(p, TextOptions, title="texts", defaults={"spec": default, "n": n},
                       repeat=("spec",) if multiple else ())


def add_extract_args(p: argparse.ArgumentParser, *, layers: str = "all", pooling: str = "last",
                     max_length: int = 128):
    """The :class:`ExtractArgs` group."""
    return add_options(p, ExtractArgs, title="extraction",
                       defaults={"layers": layers, "pooling": pooling, "max_length": max_length})


def add_run_args(p: argparse.ArgumentParser, *, out: str | None = None):
    """The :class:`RunArgs` group (``--out``, ``--overwrite``, ``--seed``, ``--quiet``)."""
    return add_options(p, RunArgs, title="run", defaults={"out": out})


def add_engine_args(p, *, extraction: bool = False):
    """The :class:`~lmgeom.engines.base.EngineConfig` group (``--workers`` only with
    ``extraction``)."""
    return add_options(p, EngineConfig, title="execution (docs: Running on a cluster, docs/cluster.md)",
                       exclude=() if extraction else ("workers",))


def engine_from_args(args):
    """The engine of a command's options; with ``--engine ray`` Ray is started (or joined) and
    the requested resources checked now, before any output folder is written."""
    cfg = options_from_args(args, EngineConfig)
    if cfg.engine == "ray":
        ensure_ray(cfg)
    return cfg


def add_experiment_args(p: argparse.ArgumentParser, *groups: Any, multiple: bool = False,
                        texts: dict[str, Any] | None = None, extract: bool = True) -> None:
    """The option layout every experiment command shares, in this order: the model group
    (``multiple``: ``--model`` repeats), the texts group (``texts``: keyword arguments of
    :func:`add_texts_args`), the extraction group (unless ``extract=False``), then each of
    ``groups`` (an options dataclass, a ``(dataclass, title)`` pair, or a callable that adds
    to ``p``), and the run group (``--out`` ... ``--quiet``) last."""
    add_model_args(p, multiple=multiple)
    add_texts_args(p, **(texts or {}))
    if extract:
        add_extract_args(p)
    for g in groups:
        if isinstance(g, tuple):
            add_options(p, g[0], title=g[1])
        elif isinstance(g, type):
            add_options(p, g)
        else:
            g(p)
    add_run_args(p, out=None)


def inputs_from_args(args, spec: str | None = None) -> dict[str, Any]:
    """``{"texts": TextOptions, "model": ModelOptions}`` of the shared groups: the keyword
    arguments every experiment takes for its inputs."""
    return {"texts": text_options_from_args(args, spec), "model": model_options_from_args(args)}


def default_out(command: str, models) -> str:
    """Default ``--out`` folder of a command: ``runs/<command>-<model>[_<model>...]``."""
    if isinstance(models, str):
        models = [models]
    return f"runs/{command}-" + "_".join(m.replace("/", "_") for m in models)


def load_kwargs_from_args(args) -> dict:
    """The :func:`~lmgeom.load_model` keyword arguments of the model options (plain values, so
    they can travel to a Ray worker)."""
    return model_options_from_args(args).load_kwargs()


def load_model_from_args(args, spec: str | None = None):
    return model_options_from_args(args).load(spec or args.model)


def load_texts_from_args(args, spec: str | None = None):
    return text_options_from_args(args, spec).load()


def progress_from_args(args) -> bool | None:
    if getattr(args, "quiet", False):
        os.environ["LMGEOM_QUIET"] = "1"
        return False
    return None


def print_table(rows: list[dict], columns: list[str] | None = None, floatfmt: str = "{:.4g}") -> None:
    """Print rows as an aligned plain-text table (CLI output)."""
    print(format_table(rows, columns, floatfmt))


def model_options_from_args(args) -> ModelOptions:
    """The :class:`~lmgeom.experiments.options.ModelOptions` of the model option group."""
    return options_from_args(args, ModelOptions)


def text_options_from_args(args, spec: str | None = None) -> TextOptions:
    """The :class:`~lmgeom.experiments.options.TextOptions` of the texts option group (``spec``:
    one of a repeated ``--texts``); its seed is ``--seed`` (0 where a command has none)."""
    return options_from_args(args, TextOptions, spec=spec or args.texts,
                             seed=getattr(args, "seed", 0))


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


__all__ = [
    "MODEL_ARGS_KEYS",
    "TYPES",
    "CandidateArgs",
    "ExtractArgs",
    "HelpFormatter",
    "ModelArgs",
    "RunArgs",
    "add_engine_args",
    "add_experiment_args",
    "add_extract_args",
    "add_model_args",
    "add_options",
    "add_run_args",
    "add_texts_args",
    "apply_model_args",
    "arg",
    "default_out",
    "engine_from_args",
    "field_docs",
    "inputs_from_args",
    "load_kwargs_from_args",
    "load_model_from_args",
    "load_texts_from_args",
    "model_options_from_args",
    "option_dest",
    "options_from_args",
    "parse_model_args",
    "print_table",
    "progress_from_args",
    "run_and_report",
    "text_options_from_args",
]
