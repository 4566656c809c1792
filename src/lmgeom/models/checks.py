"""Cheap checks of a model's inputs, run before anything is loaded or converted.

* :func:`check_device`: a device string torch understands *and* this machine has (``banana``,
  ``cuda`` on a CPU-only torch build, ``cuda:7`` on a one-GPU machine, ``mps`` off a Mac).
* :func:`check_gguf_file`: a ``.gguf`` file whose header parses, with every tensor's data inside
  the file (an empty file, random bytes, a file cut inside its header or its tensor data).
* :func:`read_config_json`: a model folder's ``config.json`` is a JSON object with a string
  ``model_type`` that transformers knows, and a list ``architectures``.

Each raises a typed :mod:`lmgeom.errors` exception whose message names the input and the fix.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelError

# ------------------------------------------------------------------------------ devices


def check_device(device: Any, *, option: str = "device") -> str | None:
    """Check that ``device`` names a device this machine has; returns it as a string.

    ``None``, ``""`` and ``"auto"`` mean the default (CUDA when available, else CPU) and come
    back as ``None``. ``option`` is how the message names the setting (``--device``).

    Raises:
        ConfigError: not a device string (``banana``), a backend this torch build or machine
            lacks (``cuda`` on a CPU-only build, ``mps`` off Apple silicon), or an index beyond
            the devices present (``cuda:7`` with one GPU).
    """
    if device is None:
        return None
    import torch

    text = str(device).strip()
    if not text or text.lower() == "auto":
        return None
    try:
        dev = device if isinstance(device, torch.device) else torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"{option} {text!r} is not a device: use cpu, cuda, cuda:N or mps "
                          "(or leave it out: CUDA when available, else CPU)") from None
    kind = dev.type
    if kind == "cpu":
        return str(dev)
    fallback = f"use {option} cpu, or leave {option} out (CUDA when available, else CPU)"
    if kind == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support (a CPU-only wheel)"
                   if torch.version.cuda is None and getattr(torch.version, "hip", None) is None
                   else "no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)")
            raise ConfigError(f"{option} {text}: {why}; {fallback}")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ConfigError(f"{option} {text}: this machine has {n} CUDA device"
                              f"{'' if n == 1 else 's'} (cuda:0..cuda:{n - 1}); pick one of those")
        return str(dev)
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(f"{option} {text}: Apple's MPS backend is not available on this "
                              f"machine; {fallback}")
        return str(dev)
    backend = getattr(torch, kind, None)
    available = getattr(backend, "is_available", None)
    if not callable(available) or not available():
        raise ConfigError(f"{option} {text}: the {kind!r} backend is not available in this torch "
                          f"build or on this machine; {fallback}")
    count = getattr(backend, "device_count", None)
    if dev.index is not None and callable(count) and dev.index >= count():
        raise ConfigError(f"{option} {text}: this machine has {count()} {kind} device(s)")
    return str(dev)


#: ``device_map`` values that are strategies, not devices
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map: Any, *, option: str = "device_map") -> None:
    """A ``device_map`` string is a strategy (``auto``, ...) or a device :func:`check_device`
    accepts; dicts pass through to transformers."""
    if device_map is None or not isinstance(device_map, str):
        return
    if device_map.strip().lower() in DEVICE_MAP_STRATEGIES:
        return
    try:
        check_device(device_map, option=option)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (device maps: {', '.join(DEVICE_MAP_STRATEGIES)}, or a "
                          "device)") from None


# ------------------------------------------------------------------------------ GGUF files

_GGUF_VERSIONS = (2, 3)
#: byte size of the GGUF scalar value types (``GGUFValueType``); 8 = string, 9 = array
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Cut(Exception):
    """The header claims more bytes than the file has."""


def check_gguf_file(path: str | os.PathLike[str]) -> None:
    """Check that ``path`` is a whole GGUF file: magic, a supported version, a header that
    parses to its end, and every tensor's data inside the file. Reads only the header (memory
    mapped), so it costs milliseconds even for a large model.

    Raises:
        ModelError: empty file, not a GGUF file, an unsupported version, or a file that ends
            inside its header or its tensor data (cut short by a download or a copy).
    """
    p = Path(path)
    size = p.stat().st_size
    redo = "re-download or re-export it"
    if size == 0:
        raise ModelError(f"GGUF file {p} is empty (0 bytes); {redo}")
    with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if size < 4 or blob[:4] != b"GGUF":
            raise ModelError(f"{p} is not a GGUF file (it does not start with the GGUF magic "
                             f"bytes); pass a .gguf model file, or {redo}")
        try:
            data_end = _gguf_extent(blob, size)
        except _Cut:
            raise ModelError(f"GGUF file {p} is truncated or corrupt: it ends ({size:,} bytes) "
                             f"inside its header; {redo}") from None
        except _Version as exc:
            raise ModelError(f"{p} is GGUF version {exc.args[0]}; lmgeom (through transformers) "
                             f"reads versions {' and '.join(map(str, _GGUF_VERSIONS))}; convert "
                             "it with a current llama.cpp") from None
    if data_end > size:
        raise ModelError(f"GGUF file {p} is truncated: its tensors need {data_end:,} bytes but "
                         f"the file has {size:,}; {redo}")


class _Version(Exception):
    pass


def _gguf_extent(blob, size: int) -> int:
    """Walk the header; returns the byte where the last tensor's data ends (0 if unknown)."""
    pos = 4

    def unpack(fmt: str) -> tuple:
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise _Cut
        out = struct.unpack_from(fmt, blob, pos)
        pos += n
        return out

    def skip_string() -> str | None:
        nonlocal pos
        (n,) = unpack("<Q")
        if pos + n > size:
            raise _Cut
        pos += n
        return None

    def read_string() -> str:
        nonlocal pos
        (n,) = unpack("<Q")
        if pos + n > size:
            raise _Cut
        s = bytes(blob[pos:pos + n]).decode("utf-8", "replace")
        pos += n
        return s

    def skip_value(vtype: int) -> Any:
        nonlocal pos
        if vtype in _SCALAR:
            n = _SCALAR[vtype]
            if pos + n > size:
                raise _Cut
            value = blob[pos:pos + n]
            pos += n
            return value
        if vtype == _STRING:
            return skip_string()
        if vtype == _ARRAY:
            itype, count = unpack("<IQ")
            if itype in _SCALAR:
                n = _SCALAR[itype] * count
                if pos + n > size:
                    raise _Cut
                pos += n
                return None
            if itype != _STRING and itype != _ARRAY:
                raise _Cut
            if count * 8 > size - pos:  # every item needs at least its 8-byte length
                raise _Cut
            for _ in range(count):
                skip_value(itype)
            return None
        raise _Cut  # unknown value type: not a GGUF header we can walk

    (version,) = unpack("<I")
    if version not in _GGUF_VERSIONS:
        raise _Version(version)
    n_tensors, n_kv = unpack("<QQ")
    if n_kv * 13 > size or n_tensors * 28 > size:  # each entry needs at least that many bytes
        raise _Cut
    alignment = 32
    for _ in range(n_kv):
        key = read_string()
        (vtype,) = unpack("<I")
        value = skip_value(vtype)
        if key == "general.alignment" and vtype == 4 and value is not None:
            alignment = struct.unpack("<I", value)[0] or 32
    tensors = []
    for _ in range(n_tensors):
        skip_string()
        (n_dims,) = unpack("<I")
        if n_dims > 8:
            raise _Cut
        dims = unpack(f"<{n_dims}Q")
        ggml_type, offset = unpack("<IQ")
        tensors.append((dims, ggml_type, offset))
    data_start = (pos + alignment - 1) // alignment * alignment
    try:
        from gguf.constants import GGML_QUANT_SIZES
    except ImportError:  # pragma: no cover - gguf is a dependency
        return 0
    end = data_start
    for dims, ggml_type, offset in tensors:
        n = 1
        for d in dims:
            n *= int(d)
        block = GGML_QUANT_SIZES.get(ggml_type)  # keyed by an IntEnum: plain ints match
        nbytes = (n // block[0]) * block[1] if block else 0  # unknown type: offset only
        end = max(end, data_start + offset + nbytes)
    return end


# ------------------------------------------------------------------------------ model folders


def read_config_json(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``folder/config.json``: a JSON object whose ``model_type`` is a string
    transformers knows and whose ``architectures`` (if present) is a list of class names.

    Raises:
        ModelError: naming the file and what to fix.
    """
    path = Path(folder) / "config.json"
    fix = "fix it or re-save the model with save_pretrained"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelError(f"{path} is not UTF-8 text; {fix}") from None
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}); {fix}") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{path} holds a JSON {type(cfg).__name__}, not an object of model "
                         f"settings; {fix}")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        what = "has no model_type" if model_type is None else (
            f"has model_type {model_type!r}, not a name")
        raise ModelError(f"{path} {what} (e.g. \"llama\"), so the architecture is unknown; "
                         f"{fix}")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise ModelError(f"{path}: architectures must be a list of class names such as "
                         f"[\"LlamaForCausalLM\"], got {archs!r}; {fix}")
    if "auto_map" not in cfg:
        try:
            from transformers import CONFIG_MAPPING
        except ImportError:  # pragma: no cover
            return cfg
        if model_type not in CONFIG_MAPPING:
            import transformers

            raise ModelError(f"{path}: model_type {model_type!r} is an architecture this "
                             f"transformers ({transformers.__version__}) does not know, so "
                             "lmgeom cannot load it; check the model_type, or upgrade "
                             "transformers if the model is newer")
    return cfg
