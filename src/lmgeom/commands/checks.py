"""Every check that needs no model and no data, run by :func:`lmgeom.cli.main` before a
command starts: ``LMGEOM_*`` variables, devices, ``--revision`` against the model kinds, the
optional packages the options call for."""

from __future__ import annotations

import importlib

from .._env import check_environment
from ..errors import ConfigError
from ..models.bundled import DEFAULT_MODEL
from ..models.checks import check_device, check_device_map

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
    revisions = _values(args, "revision")
    if not revisions or getattr(args, "command", "") == "sweep":  # sweep pairs them itself
        return
    if getattr(args, "suite", None):
        return  # select / sweep with --suite refuse --revision themselves
    from ..models.load import SOURCE_WORDS, model_source  # imports torch: only with --revision

    models = _values(args, "model") or [DEFAULT_MODEL]
    kinds = {m: model_source(m) for m in models}
    if any(k == "hub" for k in kinds.values()):
        return
    m, kind = next(iter(kinds.items()))
    raise ConfigError(f"--revision applies to hub models only; {m} is "
                      f"{SOURCE_WORDS.get(kind, 'not a hub id')}, which has exactly one version: "
                      "drop --revision (or give a hub id such as EleutherAI/pythia-160m)")


