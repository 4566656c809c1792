"""One checkpoint / resume format for every training loop in lmgeom (the push-away fine-tuning
arms and the width-suite trainer).

A checkpoint is a folder (safetensors + JSON, never pickle), written atomically (``X.tmp`` →
``X``, the previous one kept as ``X.old`` until the new one is complete):

``trainable.safetensors``  the trained parameters (all of them, or only those with
                           ``requires_grad`` — LoRA adapters), by name
``optimizer.safetensors``  every tensor of the optimizer state (``state.<i>.<name>``), the CPU
                           RNG (``torch_rng``) and every CUDA device's RNG (``cuda_rng.<j>``)
``state.json``             ``version``, ``param_names``, ``param_groups`` (without the params,
                           with ``n_params``), non-tensor optimizer entries, and the loop's own
                           state (step, logs, ...)

Restoring puts back the weights, the optimizer state and the RNGs, so a resumed run continues
bit-identically.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from .._io import write_json
from ..errors import ConfigError

log = logging.getLogger(__name__)

#: version of the format (``state.json["version"]``)
CHECKPOINT_VERSION = 1


def trainable_parameters(model, *, which: str = "trainable") -> list[tuple[str, Any]]:
    """``(name, parameter)`` pairs a checkpoint holds: those with ``requires_grad``
    (``trainable``) or every parameter (``all``)."""
    if which not in ("trainable", "all"):
        raise ConfigError(f"which must be 'trainable' or 'all', got {which!r}")
    return [(n, p) for n, p in model.named_parameters() if which == "all" or p.requires_grad]


def save_checkpoint(folder: str | os.PathLike[str], model, optimizer, state: dict[str, Any], *,
                    which: str = "trainable") -> Path:
    """Write the parameters, the optimizer state, the RNGs and ``state`` (JSON) into
    ``folder`` atomically. Returns ``folder``."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    params = trainable_parameters(model, which=which)
    save_file({n: p.detach().contiguous().cpu() for n, p in params},
              str(tmp / "trainable.safetensors"))
    sd = optimizer.state_dict()
    tensors: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    for i, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{i}.{k}"] = v.detach().contiguous().cpu()
            else:
                scalars[f"{i}.{k}"] = v
    tensors["torch_rng"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for j, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda_rng.{j}"] = s
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    groups = [{k: v for k, v in g.items() if k != "params"} | {"n_params": len(g["params"])}
              for g in sd["param_groups"]]
    write_json(tmp / "state.json", {**state, "version": CHECKPOINT_VERSION, "which": which,
                                    "param_names": [n for n, _ in params],
                                    "param_groups": groups, "optimizer_scalars": scalars})
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def find_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """``folder`` if it holds a complete checkpoint, else its ``.old`` twin, else ``None``."""
    folder = Path(folder)
    for f in (folder, folder.with_name(folder.name + ".old")):
        if (f / "state.json").is_file() and (f / "optimizer.safetensors").is_file():
            return f
    return None


def load_checkpoint(folder: str | os.PathLike[str], model, optimizer) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote into ``model`` and ``optimizer`` (and the
    RNGs); returns the loop's ``state``. A checkpoint of another format or for other
    parameters is a :class:`ConfigError` that says to rerun with ``--overwrite``."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    state = json.loads((folder / "state.json").read_text())
    if state.get("version") != CHECKPOINT_VERSION:
        raise ConfigError(f"checkpoint {folder} has format {state.get('version')}, expected "
                          f"{CHECKPOINT_VERSION}; rerun with --overwrite")
    params = trainable_parameters(model, which=state.get("which", "trainable"))
    if [n for n, _ in params] != state["param_names"]:
        raise ConfigError(f"checkpoint {folder} was written for other trainable parameters; "
                          "rerun with --overwrite")
    weights = load_file(str(folder / "trainable.safetensors"))
    with torch.no_grad():
        for n, p in params:
            p.copy_(weights[n].to(p.device, p.dtype))
    tens = load_file(str(folder / "optimizer.safetensors"))
    st: dict[int, dict[str, Any]] = {}
    for k, v in tens.items():
        if k.startswith("state."):
            _, i, name = k.split(".", 2)
            st.setdefault(int(i), {})[name] = v
    for k, v in state.get("optimizer_scalars", {}).items():
        i, name = k.split(".", 1)
        st.setdefault(int(i), {})[name] = v
    groups, start = [], 0
    for g in state["param_groups"]:
        g = dict(g)
        n = g.pop("n_params")
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append({**g, "params": list(range(start, start + n))})
        start += n
    optimizer.load_state_dict({"state": st, "param_groups": groups})
    torch.set_rng_state(tens["torch_rng"])
    if torch.cuda.is_available():
        cuda = [tens[k] for k in sorted((k for k in tens if k.startswith("cuda_rng.")),
                                        key=lambda s: int(s.split(".")[1]))]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    return state


def resume(folder: str | os.PathLike[str], model, optimizer) -> dict[str, Any] | None:
    """:func:`load_checkpoint` of the newest usable checkpoint in ``folder`` (or its ``.old``
    twin); ``None`` when there is none. An unreadable one is skipped with a warning."""
    folder = Path(folder)
    for f in (folder, folder.with_name(folder.name + ".old")):
        if not (f / "state.json").is_file():
            continue
        if not (f / "optimizer.safetensors").is_file() or not (f / "trainable.safetensors").is_file():
            raise ConfigError(f"{f} is a checkpoint of an older lmgeom format; rerun with "
                              "--overwrite (or remove it) to start this run afresh")
        try:
            return load_checkpoint(f, model, optimizer)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            log.warning("checkpoint %s is unusable (%s); trying the previous one", f, exc)
    return None


__all__ = ["CHECKPOINT_VERSION", "find_checkpoint", "load_checkpoint", "resume",
           "save_checkpoint", "trainable_parameters"]
