"""``load_model``: bundled name | hub id | local folder | ``.gguf`` file → :class:`LanguageModel`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from .._io import sha256_file, stable_hash
from .._paths import cache_dir
from ..errors import ConfigError, ModelError
from .adapter import LanguageModel
from .bundled import BUNDLED, DEFAULT_MODEL, gguf_path
from .checks import check_device, check_device_map, check_gguf_file, read_config_json

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": "float32", "fp32": "float32", "f32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
}
#: Default dtype of the forward pass (see docs/dtype.md for the evidence behind it).
DEFAULT_DTYPE = "float32"


def resolve_dtype(dtype: Any):
    """``None``/``"auto"`` → the default; strings and ``torch.dtype`` accepted."""
    if dtype is None or dtype == "auto":
        dtype = DEFAULT_DTYPE
    if isinstance(dtype, torch.dtype):
        return dtype
    key = _DTYPES.get(str(dtype).lower().replace("torch.", ""))
    if key is None:
        raise ConfigError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    return getattr(torch, key)


def load_model(
    spec: str | os.PathLike[str] | LanguageModel = DEFAULT_MODEL,
    *,
    dtype: Any = None,
    device: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    device_map: str | None = None,
) -> LanguageModel:
    """Load a causal LM for analysis.

    Args:
        spec: a bundled name (``smollm2-135m`` — the default — or ``gemma3-270m``; see
            ``lmgeom models``), a Hugging Face hub id (``EleutherAI/pythia-160m``), a local model
            folder (``config.json`` + safetensors), or a path to a ``.gguf`` file.
        dtype: ``float32`` (default), ``bfloat16`` or ``float16``.
        device: ``cpu``, ``cuda``, ``cuda:1``, ``mps``; default: CUDA if available else CPU.
        revision: hub revision / branch / tag (e.g. Pythia's ``step1000``).
        trust_remote_code: run code shipped with a hub model. Off unless you ask; a warning is
            logged when on.
        device_map: passed to transformers (``"auto"`` spreads a big model with accelerate).

    Returns:
        a :class:`LanguageModel` in eval mode.

    Raises:
        ModelError: unknown name (lists the bundled ones), missing path, folder that is not a
            model (no or broken ``config.json``, no weights), a GGUF file that is empty, not
            GGUF or truncated, corrupt weights, a model without a readout head, unreachable hub.
        ConfigError: an unknown dtype, or a device this machine does not have (``banana``,
            ``cuda`` on a CPU-only torch build, ``cuda:7`` beyond the GPUs present).
    """
    if isinstance(spec, LanguageModel):
        return _as_requested(spec, dtype=dtype, device=device, revision=revision,
                             trust_remote_code=trust_remote_code, device_map=device_map)

    torch_dtype = resolve_dtype(dtype)
    device = check_device(device)
    check_device_map(device_map)
    if device is None and device_map is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if trust_remote_code:
        log.warning("trust_remote_code=True: code shipped with %s will run on this machine", spec)
    warn_cpu_half(torch_dtype, device)
    name = str(spec)
    path = Path(name).expanduser()
    if revision and model_source(name) != "hub":
        log.warning("revision %r ignored: revisions apply to hub models only; %s is %s", revision,
                    name, SOURCE_WORDS.get(model_source(name), "not a hub id"))

    source, gguf_file, identity = _model_source(name, path, revision)
    hf_model, tokenizer = _from_pretrained(
        source,
        name=name,
        dtype=torch_dtype,
        revision=revision if identity.get("source") == "hub" else None,
        trust_remote_code=trust_remote_code,
        device_map=device_map,
        gguf_file=gguf_file,
    )
    if identity.get("source") == "hub":
        identity["commit"] = hub_commit(name, revision, hf_model.config)
        snapshot = hub_snapshot(name, revision)
        if snapshot is not None:  # the weights' own hash: identical checkpoints are caught
            with contextlib.suppress(ModelError, OSError):
                identity["weights_sha256"] = weights_hash(snapshot)
    if device_map is None and device is not None:
        hf_model.to(device)
    identity["name"] = name
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    identity["tokenizer_sha256"] = _tokenizer_hash(tokenizer)
    return LanguageModel.wrap(hf_model, tokenizer, name=name, identity=identity)


_half_warned: set[str] = set()


def warn_cpu_half(dtype: Any, device: str | None) -> None:
    """Once per process and dtype: what float16 / bfloat16 cost on a CPU, as measured."""
    if device is None or not str(device).startswith("cpu") or dtype not in (torch.float16,
                                                                             torch.bfloat16):
        return
    name = str(dtype).replace("torch.", "")
    if name in _half_warned:
        return
    _half_warned.add(name)
    if dtype == torch.float16:
        log.warning("float16 on a CPU: most CPUs have no float16 matrix kernels, and the forward "
                    "pass runs slower than in float32 (measured 5x slower on lmgeom's 2-core "
                    "x86 test machine); use --dtype bfloat16 (2-3x faster than float32 there, "
                    "on CPUs with avx512_bf16) or float32")
    else:
        log.info("bfloat16 on a CPU: 2-3x faster than float32 on CPUs with avx512_bf16 "
                 "(measured on lmgeom's 2-core test machine), slower on CPUs without it; z "
                 "moves by at most 0.3 (docs: dtype)")


def _as_requested(model: LanguageModel, *, dtype: Any, device: str | None,
                  revision: str | None, trust_remote_code: bool, device_map: Any) -> LanguageModel:
    """An already loaded model, converted in place to the ``dtype`` / ``device`` asked for
    (``None``: as it is). Options that only apply while loading are refused, not dropped."""
    given = [n for n, v in (("revision", revision), ("trust_remote_code", trust_remote_code),
                            ("device_map", device_map)) if v]
    if given:
        raise ConfigError(
            f"load_model got an already loaded model ({model.name}) and {', '.join(given)}, "
            "which only apply while loading; load the model again from its name or path")
    want_dtype = resolve_dtype(dtype) if dtype is not None else None
    want_device = check_device(device)
    warn_cpu_half(want_dtype, str(want_device or model.device))
    if want_dtype is not None and want_dtype != model.dtype:
        log.info("%s: converting the loaded model from %s to %s (in place)", model.name,
                 str(model.dtype).replace("torch.", ""), str(want_dtype).replace("torch.", ""))
        model.hf_model.to(dtype=want_dtype)
    if want_device is not None and torch.device(want_device) != model.device:
        model.hf_model.to(want_device)
    return model


def _model_source(name: str, path: Path, revision: str | None
                  ) -> tuple[str | Path, str | None, dict[str, Any]]:
    """What :func:`load_model` passes to ``from_pretrained`` for ``name`` (a bundled name, a
    ``.gguf`` file, a model folder or a hub id), the GGUF file name (None: none), and the
    model's identity so far (what its cache keys hash)."""
    if name in BUNDLED:
        folder, identity = _bundled_folder(name)
        return folder, None, identity
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist")
        folder, identity = _gguf_folder(path, name)
        return folder, None, identity
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"{path} is neither a model folder nor a .gguf file")
        if not (path / "config.json").is_file():
            raise ModelError(
                f"folder {path} is not a model: it has no config.json (expected a Hugging Face "
                "model folder saved with save_pretrained, or pass a .gguf file)"
            )
        read_config_json(path)
        return path, None, {"source": "folder", "path": str(path.resolve()),
                            "weights_sha256": weights_hash(path)}
    if _looks_like_path(name):
        raise ModelError(f"model path {name} does not exist")
    if "/" in name:
        return name, None, {"source": "hub", "hub_id": name, "revision": revision or "main"}
    raise ModelError(
        f"unknown model {name!r}; bundled models: {', '.join(BUNDLED)} "
        "(or give a Hugging Face hub id, a local model folder, or a .gguf file)"
    )


def hub_commit(repo_id: str, revision: str | None, config: Any = None) -> str | None:
    """The commit hash a hub ``revision`` (branch, tag such as Pythia's ``step1000``, or
    commit) resolved to, read from the local hub cache the load just used (no network).

    transformers 5 no longer sets ``config._commit_hash`` on every load path, so the commit is
    taken from the cached snapshot folder (``models--ORG--NAME/snapshots/<commit>/``). It is
    part of the model identity and so of every cache key: a moved branch gives a new key.
    """
    commit = getattr(config, "_commit_hash", None)
    if commit:
        return str(commit)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    got = try_to_load_from_cache(repo_id, "config.json", revision=revision or "main")
    if isinstance(got, (str, os.PathLike)):
        return Path(got).parent.name
    return None


def hub_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The local snapshot folder of a hub ``revision`` (``None`` when not cached)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    got = try_to_load_from_cache(repo_id, "config.json", revision=revision or "main")
    return Path(got).parent if isinstance(got, (str, os.PathLike)) else None


#: how messages name each :func:`model_source`
SOURCE_WORDS = {"bundled": "a bundled model", "gguf": "a .gguf file", "folder": "a local folder",
                 "missing": "a path that does not exist", "unknown": "not a hub id (ORG/NAME)"}


def model_source(spec: str | os.PathLike[str]) -> str:
    """What kind of model ``spec`` names, without loading anything: ``bundled``, ``gguf`` (a
    ``.gguf`` path), ``folder`` (an existing path), ``missing`` (looks like a path, does not
    exist), ``hub`` (``ORG/NAME``) or ``unknown`` — the order :func:`load_model` tries them."""
    name = str(spec)
    path = Path(name).expanduser()
    if name in BUNDLED:
        return "bundled"
    if path.suffix == ".gguf":
        return "gguf"
    if path.exists():
        return "folder"
    if _looks_like_path(name):
        return "missing"
    return "hub" if "/" in name else "unknown"


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and name.count("/") != 1 or (
        name.endswith((".safetensors", ".bin", ".json"))
    )


def _from_pretrained(source, *, name, dtype, revision, trust_remote_code, device_map, gguf_file):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # lmgeom shows its own progress; keep logs clean

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except OSError as exc:
        raise ModelError(_hub_message(name, exc, revision)) from exc
    except ValueError as exc:
        raise ModelError(f"cannot read the config of {name}: {_first_line(exc)}") from exc
    except Exception as exc:  # strict config validation raises many types
        raise ModelError(f"the config of {name} is not usable ({type(exc).__name__}: "
                         f"{_first_line(exc)}); fix config.json or re-save the model") from exc
    archs = getattr(config, "architectures", None) or []
    archs = [str(a) for a in archs] if isinstance(archs, (list, tuple)) else []
    if archs and not any(("CausalLM" in a or "LMHead" in a) for a in archs):
        raise ModelError(
            f"model {name!r} ({', '.join(archs)}) has no causal-LM readout head: lmgeom needs a "
            "decoder-only causal LM with W_U (encoders such as BERT, encoder-decoders such as T5 "
            "and multimodal wrappers cannot be analysed)"
        )
    if not gguf_file:  # a .gguf carries its tokenizer inside
        _check_tokenizer_files(source, name)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=dtype, device_map=device_map, output_loading_info=True,
            **kwargs
        )
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc) or "does not support" in str(exc):
            raise ModelError(
                f"model {name!r} ({config.model_type}) has no causal-LM readout head: lmgeom needs a "
                "decoder-only causal LM with W_U (encoders such as BERT, encoder-decoders such as "
                "T5 and multimodal wrappers cannot be analysed)"
            ) from exc
        raise ModelError(f"could not load {name}: {_first_line(exc)}") from exc
    except OSError as exc:
        raise ModelError(_hub_message(name, exc, revision)) from exc
    except Exception as exc:  # safetensors/gguf parse errors come as many types
        raise ModelError(
            f"could not build or load the model {name} ({type(exc).__name__}: "
            f"{_first_line(exc)}); check its config.json — or the weights may be corrupt or "
            "truncated: re-download or re-save them"
        ) from exc
    if not gguf_file:  # a GGUF is dequantized whole; its saved folder is checked on load
        _check_coverage(name, info)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception as exc:
        raise ModelError(f"could not load the tokenizer of {name}: {_first_line(exc)}") from exc
    if tokenizer is None:
        raise ModelError(f"{name} has no tokenizer files (tokenizer.json / tokenizer_config.json); "
                         "save the tokenizer beside the model (tokenizer.save_pretrained)")
    return model, tokenizer


#: tensors a checkpoint may carry that the model rebuilds itself (causal masks of old GPT-2
#: checkpoints, rotary frequencies): unexpected, but they change nothing
_BENIGN_UNEXPECTED = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")

#: the files a tokenizer can be read from (any one of these groups is enough)
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"),
                   ("tokenizer_config.json",))


def _check_tokenizer_files(source: Any, name: str) -> None:
    """A local model folder without tokenizer files is refused before its weights load."""
    folder = Path(str(source))
    if not folder.is_dir():
        return  # a hub id: transformers resolves its files
    if any(all((folder / f).is_file() for f in group) for group in TOKENIZER_FILES):
        return
    raise ModelError(
        f"{name} has no tokenizer files: {folder} holds none of tokenizer.json, "
        "tokenizer.model, vocab.json + merges.txt, tokenizer_config.json; save the tokenizer "
        "beside the model (tokenizer.save_pretrained(folder))")


def _names(keys: list[str], limit: int = 6) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _check_coverage(name: str, info: dict[str, Any]) -> None:
    """The weights must cover the config exactly: a tensor the config asks for and the files
    lack would be randomly initialised (transformers only reports it), and a tensor in the
    files that the config has no place for (more blocks than ``num_hidden_layers``) would be
    dropped. Either silently changes what is measured, so both are refused, by name."""
    missing = list(info.get("missing_keys") or [])
    unexpected = [k for k in info.get("unexpected_keys") or []
                  if not any(k.endswith(b) for b in _BENIGN_UNEXPECTED)]
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensors the config needs are missing from the weights "
                     f"({_names(missing)}) and would be random")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors in the weights have no place in the config "
                     f"({_names(unexpected)}) and would be dropped")
    raise ModelError(
        f"the weights of {name} do not match its config: {'; '.join(parts)}. Check config.json "
        "(num_hidden_layers, hidden_size, tie_word_embeddings) against the weight files, or "
        "re-save the model with save_pretrained")


def _first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, cut to ``limit`` characters (transformers' run to
    paragraphs)."""
    text = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
    return (text or type(exc).__name__)[:limit]


def _hub_message(name: str, exc: Exception, revision: str | None = None) -> str:
    what = f"{name!r} at revision {revision!r}" if revision else repr(name)
    hint = ("the hub may be unreachable from this machine (use a bundled model, a local folder "
            "or a .gguf)")
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        hint = (f"HF_HUB_OFFLINE is set and the local hub cache ({constants.HF_HUB_CACHE}) has no "
                "such snapshot: download it on a machine with a hub first, or unset HF_HUB_OFFLINE")
    return f"could not load {what}: {str(exc).splitlines()[0][:200]} — if this is a hub id, {hint}"


# ---------------------------------------------------------------------- conversion cache
def prepare_bundled(name: str) -> Path:
    """Dequantize the bundled model ``name`` into the cache now, once (a no-op when done; locked
    against a second process), and return its folder: what the first :func:`load_model` of it
    would do, without loading it. ``make test`` does this per worker before any test."""
    if name not in BUNDLED:
        raise ModelError(f"unknown bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    return _bundled_folder(name)[0]


def _bundled_folder(name: str) -> tuple[Path, dict[str, Any]]:
    bm = BUNDLED[name]
    root = cache_dir("models")
    gguf = gguf_path(bm, root)
    sha = bm.sha256 or cached_file_hash(gguf)
    folder, identity = _convert_gguf(gguf, sha, f"{name}-{sha[:12]}")
    identity.update({"source": "bundled", "bundled": name, "package": bm.package})
    return folder, identity


def _gguf_folder(path: Path, name: str) -> tuple[Path, dict[str, Any]]:
    sha = cached_file_hash(path)
    folder, identity = _convert_gguf(path, sha, f"gguf-{sha[:16]}")
    identity.update({"source": "gguf", "path": str(path.resolve())})
    return folder, identity


def _convert_gguf(gguf: Path, sha: str, key: str) -> tuple[Path, dict[str, Any]]:
    """Dequantize ``gguf`` once into a safetensors folder under the cache (atomic, locked)."""
    folder = cache_dir("models") / key
    identity = {"gguf_sha256": sha, "weights_sha256": sha}
    done = folder / ".lmgeom-converted"
    if done.is_file():
        return folder, identity
    check_gguf_file(gguf)  # before the slow conversion: empty, not GGUF, cut short
    with FileLock(str(folder) + ".lock"):
        if done.is_file():
            return folder, identity
        log.warning("first load of %s: dequantizing the GGUF once into %s", gguf.name, folder)
        model, tokenizer = _from_pretrained(
            gguf.parent, name=str(gguf), dtype=torch.float32, revision=None,
            trust_remote_code=False, device_map=None, gguf_file=gguf.name,
        )
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / ".lmgeom-converted").write_text(json.dumps({"gguf": str(gguf), "sha256": sha}))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    return folder, identity


def cached_file_hash(path: Path) -> str:
    """sha256 of a file, memoised in the cache by (path, inode, size, mtime, ctime): a file
    replaced or edited in place (even with its old mtime restored) is hashed again."""
    st = path.stat()
    memo = cache_dir("hashes") / (stable_hash([str(path.resolve()), st.st_dev, st.st_ino,
                                               st.st_size, st.st_mtime_ns, st.st_ctime_ns])[:32])
    if memo.is_file():
        return memo.read_text().strip()
    sha = sha256_file(path)
    memo.write_text(sha)
    return sha


def weights_hash(folder: Path) -> str:
    """Content hash of a model folder's weight files (safetensors / bin / gguf)."""
    files = sorted(
        p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf", ".pt")
    )
    if not files:
        raise ModelError(f"folder {folder} has no weight files (*.safetensors)")
    return stable_hash([[p.name, cached_file_hash(p)] for p in files])


def _tokenizer_hash(tokenizer) -> str:
    try:
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        if backend is not None:
            return stable_hash(backend.to_str())[:16]
    except Exception:  # pragma: no cover - exotic tokenizers
        pass
    return stable_hash(sorted(tokenizer.get_vocab().items()))[:16]


def model_fingerprint(spec: str, revision: str | None = None) -> dict[str, Any]:
    """The content identity of a model spec, without loading it: what a result computed from
    this model must be keyed by so that replaced weights or a moved hub revision recompute.

    bundled name → its published sha256 (else the assembled GGUF's); ``.gguf`` file → the
    file's sha256; local folder → the hash of its weight files and of its config / tokenizer
    files; hub id → the commit ``revision`` resolves to (from the hub when reachable, else the
    local hub cache; ``None`` when neither knows it)."""
    name = str(spec)
    path = Path(name).expanduser()
    if name in BUNDLED:
        bm = BUNDLED[name]
        sha = bm.sha256
        if sha is None:
            with contextlib.suppress(ModelError, OSError):
                gguf = gguf_path(bm, cache_dir("models"))
                sha = cached_file_hash(gguf)
        return {"bundled": name, "sha256": sha}
    if path.suffix == ".gguf" and path.is_file():
        return {"gguf_sha256": cached_file_hash(path)}
    if path.is_dir():
        side = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".model",
                                                                                  ".txt", ".tiktoken"))
        return {"weights": weights_hash(path),
                "files": [[p.name, cached_file_hash(p)] for p in side]}
    if "/" in name and not _looks_like_path(name):
        return {"hub_id": name, "revision": revision or "main",
                "commit": resolve_hub_commit(name, revision)}
    return {"spec": name}


def resolve_hub_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit a hub ``revision`` points at now: asked of the hub unless it is offline
    (``HF_HUB_OFFLINE``), else read from the local hub cache's refs."""
    rev = revision or "main"
    if len(rev) == 40 and all(c in "0123456789abcdef" for c in rev):
        return rev
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if not offline:
        with contextlib.suppress(Exception):  # no hub reachable: fall back to the cache
            from huggingface_hub import HfApi

            sha = HfApi().model_info(repo_id, revision=rev, timeout=10).sha
            if sha:
                return str(sha)
    return hub_commit(repo_id, rev)
