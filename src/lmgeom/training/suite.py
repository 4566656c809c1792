"""A family of small GPT-NeoX (Pythia-architecture) models that differ in width, trained from
scratch on the offline corpora with identical data, data order and seed — the "scale × training
time" axis of the Subspace PGA paper, reproducible on a CPU.

Layout of a suite folder ``DIR``::

    DIR/suite.json                 the settings every width shares (checked on every rerun)
    DIR/manifest.json              widths, shapes, steps, val losses, tokens, seed, data hash,
                                   weights sha256 per checkpoint, duplicate weights, timings
    DIR/tokenizer/                 the byte-level BPE shared by all widths
    DIR/data/train.npy, val.npy    the tokenised training / held-out streams (uint16/uint32)
    DIR/data/data.json             where the streams came from (corpora, hashes, counts)
    DIR/<width>/step<N>/           an ordinary Hugging Face model folder (config.json,
                                   model.safetensors, tokenizer) + lmgeom_checkpoint.json
                                   (step, tokens seen, validation loss, weights hash)
    DIR/<width>/width.json         written when the width is complete
    DIR/<width>/_state/            resume state while training, in the one checkpoint format of
                                   :mod:`lmgeom.training.checkpoint` (weights, AdamW moments,
                                   CPU and CUDA RNG as safetensors; step and schedule as JSON)

Shapes (documented in docs/suite.md): every width has the same depth (``n_layers``, default 6 —
Pythia-70M's), ``n_heads = max(2, width // 64)``, ``intermediate = 4 · width``, parallel residual,
rotary embeddings on 25 % of each head, untied input / output embeddings: only the width varies.

Determinism: the data order is a function of the seed only (an epoch-wise permutation of
fixed-length chunks); model init runs under ``torch.manual_seed(seed)`` inside
``torch.random.fork_rng`` (the caller's global RNG is untouched); there is no dropout. A run that
is interrupted resumes from the last saved state (every checkpoint, and every
``resume_every_s`` seconds between checkpoints) and ends with the same weights, bit for bit, as
an uninterrupted run on the same machine and thread count (tested).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._io import stable_hash, write_json
from ..errors import CacheError, ConfigError, DataError
from .checkpoint import resume, save_checkpoint

log = logging.getLogger(__name__)

FORMAT = "lmgeom-suite/1"
DEFAULT_TEXTS: tuple[str, ...] = ("builtin:wiki", "builtin:news", "builtin:science", "builtin:code")
#: texts held out of training by default: the sweep's default text set, so it is unseen
DEFAULT_EXCLUDE: tuple[str, ...] = ("builtin:domains",)
#: default token budget per width (sized for a 2-core CPU shared with other jobs; docs/suite.md)
DEFAULT_TOKENS = 393_216  # 192 steps of 16 x 128
CHECKPOINT_META = "lmgeom_checkpoint.json"
WIDTH_DONE = "width.json"


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class SuiteConfig:
    """Everything that defines a suite (all recorded in ``suite.json`` and the manifest).

    Attributes:
        widths: residual-stream widths d, one model each.
        n_layers: blocks per model (the same for every width).
        head_width: ``n_heads = max(2, width // head_width)``.
        ffn_mult: ``intermediate_size = ffn_mult · width``.
        tokens: training tokens per width (``steps = tokens // (batch_size · seq_len)``).
        seq_len: tokens per training sequence.
        batch_size: sequences per optimizer step.
        lr: peak AdamW learning rate (linear warmup, cosine decay to ``min_lr_ratio · lr``).
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        warmup_frac: fraction of the steps spent warming up (at least one step).
        weight_decay: AdamW decoupled weight decay on matrices (not on biases / norm gains).
        beta1, beta2, eps: AdamW moments (Pythia: 0.9, 0.95, 1e-8).
        grad_clip: global gradient-norm clip.
        seed: data split, data order and initialisation seed (shared by all widths).
        vocab_size: BPE vocabulary size (special tokens included).
        texts: training corpora (``load_texts`` specs: ``builtin:NAME`` or files).
        exclude_texts: corpora whose texts are removed from training and validation.
        val_fraction: fraction of documents held out for the validation loss.
        val_tokens: tokens of the held-out stream evaluated at every checkpoint.
        n_regular: evenly spaced checkpoints added to the log-spaced ones (0, 1, 2, 4, ...).
        bf16: bfloat16 autocast for the forward/backward (weights and AdamW stay float32).
        tokenizer_chars: characters of (shuffled) training text the tokenizer is trained on.
        max_position_embeddings: the models' position limit (rotary: no learned positions).
    """

    widths: tuple[int, ...] = (64, 128, 256, 512)
    n_layers: int = 6
    head_width: int = 64
    ffn_mult: int = 4
    tokens: int = DEFAULT_TOKENS
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_frac: float = 0.01
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 0
    vocab_size: int = 4096
    texts: tuple[str, ...] = DEFAULT_TEXTS
    exclude_texts: tuple[str, ...] = DEFAULT_EXCLUDE
    val_fraction: float = 0.02
    val_tokens: int = 8192
    n_regular: int = 4
    bf16: bool = True
    tokenizer_chars: int | None = 8_000_000
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        object.__setattr__(self, "texts", tuple(str(t) for t in self.texts))
        object.__setattr__(self, "exclude_texts", tuple(str(t) for t in self.exclude_texts))
        if not self.widths:
            raise ConfigError("give at least one width")
        if len(set(self.widths)) != len(self.widths):
            raise ConfigError(f"widths must be distinct, got {list(self.widths)}")
        for w in self.widths:
            model_shape(w, self)  # raises for impossible widths
        for name in ("n_layers", "tokens", "seq_len", "batch_size", "val_tokens", "ffn_mult",
                     "head_width"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise ConfigError("seq_len must be at least 2 tokens")
        if self.seq_len > self.max_position_embeddings:
            raise ConfigError(
                f"seq_len {self.seq_len} exceeds max_position_embeddings {self.max_position_embeddings}"
            )
        if self.tokens < self.tokens_per_step:
            raise ConfigError(
                f"tokens = {self.tokens} is less than one step (batch_size · seq_len = "
                f"{self.tokens_per_step}); raise --tokens or lower --batch-size / --seq-len"
            )
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or not 0 <= self.warmup_frac < 1:
            raise ConfigError("need lr > 0, 0 <= min_lr_ratio <= 1 and 0 <= warmup_frac < 1")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.texts:
            raise ConfigError("give at least one training corpus (texts)")
        if self.n_regular < 0:
            raise ConfigError("n_regular must be >= 0")

    @classmethod
    def micro(cls, **overrides: Any) -> SuiteConfig:
        """A configuration that trains in seconds (tests, smoke runs): widths 16 and 32, two
        layers, 12 steps of 4 × 16 tokens, a 320-token vocabulary, the news corpus."""
        base: dict[str, Any] = {
            "widths": (16, 32), "n_layers": 2, "tokens": 768, "seq_len": 16, "batch_size": 4,
            "lr": 3e-3, "warmup_frac": 0.0, "vocab_size": 320, "texts": ("builtin:news",),
            "exclude_texts": (), "val_fraction": 0.1, "val_tokens": 256, "n_regular": 3,
            "tokenizer_chars": 200_000, "max_position_embeddings": 128,
        }
        base.update(overrides)
        return cls(**base)

    @property
    def tokens_per_step(self) -> int:
        return int(self.batch_size) * int(self.seq_len)

    @property
    def steps(self) -> int:
        """Optimizer steps per width."""
        return int(self.tokens) // self.tokens_per_step

    @property
    def warmup_steps(self) -> int:
        return max(1, math.ceil(self.warmup_frac * self.steps)) if self.warmup_frac > 0 else 0

    def lr_at(self, update: int) -> float:
        """Learning rate of optimizer update ``update`` (1-based): linear warmup from
        ``lr / warmup`` (never 0, so the first update moves the weights), then cosine decay to
        ``min_lr_ratio · lr`` at the last update."""
        W, S = self.warmup_steps, self.steps
        if W and update <= W:
            return self.lr * update / W
        if S <= W + 1:
            return self.lr
        t = (update - W - 1) / (S - W - 1)
        floor = self.min_lr_ratio * self.lr
        return floor + 0.5 * (self.lr - floor) * (1 + math.cos(math.pi * min(max(t, 0.0), 1.0)))

    def shared_settings(self) -> dict[str, Any]:
        """Every setting except the widths: what two runs into one folder must agree on."""
        d = asdict(self)
        d.pop("widths")
        d["texts"] = list(self.texts)
        d["exclude_texts"] = list(self.exclude_texts)
        return d

    def data_settings(self) -> dict[str, Any]:
        keys = ("seed", "vocab_size", "texts", "exclude_texts", "val_fraction", "tokenizer_chars",
                "max_position_embeddings")
        from ..texts import source_fingerprint

        s = self.shared_settings()
        out = {k: s[k] for k in keys}
        # by content: an edited corpus file rebuilds the data instead of reusing the old split
        prints = {str(t): source_fingerprint(t) for t in (*self.texts, *self.exclude_texts)}
        if any(prints.values()):
            out["texts_sha256"] = prints
        return out


def model_shape(width: int, config: SuiteConfig) -> dict[str, int]:
    """The documented shape rule: same depth for all widths, ``n_heads = max(2, width //
    head_width)``, ``intermediate = ffn_mult · width``.

    Raises:
        ConfigError: the width does not split into heads of an even size >= 4 (rotary needs
            an even number of rotated dims).
    """
    w = int(width)
    if w < 8:
        raise ConfigError(f"width {w} is too small (>= 8)")
    heads = max(2, w // int(config.head_width))
    if w % heads:
        raise ConfigError(
            f"width {w} does not split into {heads} heads (n_heads = max(2, width // "
            f"{config.head_width})); use a multiple of {config.head_width}"
        )
    head_dim = w // heads
    rotary = int(head_dim * 0.25)
    if head_dim < 4 or rotary % 2:
        raise ConfigError(
            f"width {w}: head size {head_dim} gives {rotary} rotary dims (must be even); use a "
            "width whose head size is a multiple of 8"
        )
    return {"width": w, "n_layers": int(config.n_layers), "n_heads": heads, "head_dim": head_dim,
            "intermediate_size": int(config.ffn_mult) * w, "rotary_dims": rotary}


def checkpoint_steps(total: int, n_regular: int = 4) -> list[int]:
    """Pythia-style checkpoint steps: 0, the powers of two up to ``total``, ``n_regular`` evenly
    spaced steps, and ``total``."""
    total = int(total)
    steps = {0, total}
    p = 1
    while p <= total:
        steps.add(p)
        p *= 2
    for i in range(1, int(n_regular) + 1):
        steps.add(round(total * i / n_regular))
    return sorted(s for s in steps if 0 <= s <= total)


def width_label(width: int | str) -> str:
    """The model label of a width in tables and plots: ``w128``."""
    return f"w{int(width)}"


# --------------------------------------------------------------------------- data


@dataclass
class SuiteData:
    """The tokenised streams and the tokenizer of a suite."""

    train: np.ndarray  # (n_train_tokens,) token ids, documents separated by EOS
    val: np.ndarray  # (n_val_tokens,)
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)

    def n_chunks(self, seq_len: int) -> int:
        return len(self.train) // seq_len

    def val_chunks(self, seq_len: int, val_tokens: int) -> np.ndarray:
        """``(m, seq_len)`` held-out chunks, the first ``val_tokens // seq_len`` of the stream."""
        m = min(len(self.val) // seq_len, max(1, val_tokens // seq_len))
        if m < 1:
            raise DataError(
                f"the held-out split has {len(self.val)} tokens, fewer than one sequence of "
                f"{seq_len}; raise val_fraction or add texts"
            )
        return self.val[: m * seq_len].reshape(m, seq_len).astype(np.int64)


def _load_docs(config: SuiteConfig) -> tuple[list[str], dict[str, Any]]:
    from ..texts import load_texts

    excluded: set[str] = set()
    sources: dict[str, Any] = {}
    for spec in config.exclude_texts:
        ts = load_texts(spec)
        excluded.update(ts.texts)
        sources[f"exclude:{spec}"] = {"n": len(ts), "hash": ts.hash}
    docs: list[str] = []
    for spec in config.texts:
        ts = load_texts(spec)
        kept = [t for t in ts.texts if t not in excluded]
        docs.extend(kept)
        sources[spec] = {"n": len(ts), "kept": len(kept), "hash": ts.hash,
                         "chars": int(sum(len(t) for t in kept))}
    if len(docs) < 2:
        raise DataError(f"the training corpora hold {len(docs)} usable texts; need at least 2")
    return docs, sources


def prepare_data(root: str | os.PathLike[str], config: SuiteConfig, *, progress: bool | None = None) -> SuiteData:
    """Split, tokenizer and tokenised streams of a suite: built once into ``root/data`` and
    ``root/tokenizer``, reused afterwards (checked against ``data.json``)."""
    from transformers import AutoTokenizer

    from .tokenizer import tokenizer_sha256, train_tokenizer

    root = Path(root)
    data_dir, tok_dir = root / "data", root / "tokenizer"
    info_path = data_dir / "data.json"
    want = config.data_settings()
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("settings") != want:
            raise CacheError(f"{data_dir} was built with other settings; use a new --out")
        train = np.load(data_dir / "train.npy", allow_pickle=False)
        val = np.load(data_dir / "val.npy", allow_pickle=False)
        tok = AutoTokenizer.from_pretrained(tok_dir)
        if _stream_hash(train, val, tokenizer_sha256(tok)) != info.get("data_hash"):
            raise CacheError(f"{data_dir} does not match its recorded hash (corrupt?); delete "
                             "the suite folder's data/ and tokenizer/ to rebuild them")
        return SuiteData(train, val, tok, info)

    t0 = time.perf_counter()
    docs, sources = _load_docs(config)
    rng = np.random.default_rng([config.seed, 0])
    is_val = rng.random(len(docs)) < config.val_fraction
    if is_val.all() or not is_val.any():
        is_val[:] = False
        is_val[int(rng.integers(len(docs)))] = True
    train_docs = [d for d, v in zip(docs, is_val) if not v]
    val_docs = [d for d, v in zip(docs, is_val) if v]
    order = np.random.default_rng([config.seed, 1]).permutation(len(train_docs))
    t1 = time.perf_counter()
    tok = train_tokenizer((train_docs[i] for i in order), config.vocab_size,
                          max_chars=config.tokenizer_chars,
                          model_max_length=config.max_position_embeddings)
    t2 = time.perf_counter()
    train = _encode(tok, train_docs)
    val = _encode(tok, val_docs)
    t3 = time.perf_counter()
    tok_sha = tokenizer_sha256(tok)
    info = {
        "settings": want,
        "sources": sources,
        "n_docs": {"train": len(train_docs), "val": len(val_docs)},
        "n_tokens": {"train": len(train), "val": len(val)},
        "vocab_size": len(tok),
        "tokenizer_sha256": tok_sha,
        "data_hash": _stream_hash(train, val, tok_sha),
        "dtype": str(train.dtype),
        "timings": {"load_texts_s": t1 - t0, "tokenizer_s": t2 - t1, "encode_s": t3 - t2},
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp_tok = root / "tokenizer.tmp"
    shutil.rmtree(tmp_tok, ignore_errors=True)
    tok.save_pretrained(tmp_tok)
    shutil.rmtree(tok_dir, ignore_errors=True)
    os.replace(tmp_tok, tok_dir)
    for name, arr in (("train", train), ("val", val)):
        tmp = data_dir / f".{name}.tmp.npy"
        np.save(tmp, arr, allow_pickle=False)
        os.replace(tmp, data_dir / f"{name}.npy")
    write_json(info_path, info)  # last: its presence means the data are complete
    log.info("suite data: %d train / %d val tokens from %d documents (tokenizer %d tokens)",
             len(train), len(val), len(docs), len(tok))
    return SuiteData(train, val, tok, info)


def _encode(tok, docs: Sequence[str]) -> np.ndarray:
    eos = tok.eos_token_id
    dtype = np.uint16 if len(tok) <= np.iinfo(np.uint16).max else np.uint32
    parts = []
    for i in range(0, len(docs), 1024):
        for enc in tok.backend_tokenizer.encode_batch(list(docs[i : i + 1024]), add_special_tokens=False):
            parts.append(np.asarray(enc.ids + [eos], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _stream_hash(train: np.ndarray, val: np.ndarray, tok_sha: str) -> str:
    from .._io import sha256_bytes

    return stable_hash([sha256_bytes(np.ascontiguousarray(train).tobytes()), str(train.dtype),
                        sha256_bytes(np.ascontiguousarray(val).tobytes()), tok_sha])


class _Order:
    """Which training chunks make up each step's batch: position ``p = step · B + b`` of the
    concatenation of epoch-wise seeded permutations of the chunks."""

    def __init__(self, n_chunks: int, batch_size: int, seed: int) -> None:
        if n_chunks < 1:
            raise DataError("the training stream is shorter than one sequence; add texts")
        self.n, self.B, self.seed = n_chunks, batch_size, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {k: v for k, v in self._perms.items() if k >= epoch - 1}
            self._perms[epoch] = np.random.default_rng([self.seed, 2, epoch]).permutation(self.n)
        return self._perms[epoch]

    def batch(self, step: int) -> np.ndarray:
        pos = np.arange(step * self.B, (step + 1) * self.B)
        return np.array([self._perm(int(p // self.n))[int(p % self.n)] for p in pos])


# --------------------------------------------------------------------------- models


def build_model(width: int, config: SuiteConfig, tokenizer):
    """A freshly initialised GPT-NeoX model of ``width`` (float32), initialised under
    ``torch.manual_seed(config.seed)`` without touching the caller's RNG."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    s = model_shape(width, config)
    cfg = GPTNeoXConfig(
        vocab_size=len(tokenizer),
        hidden_size=s["width"],
        num_hidden_layers=s["n_layers"],
        num_attention_heads=s["n_heads"],
        intermediate_size=s["intermediate_size"],
        hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        use_parallel_residual=True,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        initializer_range=0.02,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(config.seed))
        model = GPTNeoXForCausalLM(cfg)
    return model.float()


def _optimizer(model, config: SuiteConfig):
    import torch

    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, foreach=False,
    )


# --------------------------------------------------------------------------- resume state


def _save_state(wdir: Path, model, opt, step: int, extra: dict[str, Any]) -> None:
    """The resume state of one width (:mod:`lmgeom.training.checkpoint`, every parameter)."""
    save_checkpoint(wdir / "_state", model, opt, {"step": int(step), **extra}, which="all")


def _load_state(wdir: Path, model, opt) -> dict[str, Any] | None:
    """Restore weights, AdamW state and RNG from ``_state`` (safetensors + JSON, no pickle)."""
    return resume(wdir / "_state", model, opt)


# --------------------------------------------------------------------------- training


def _val_loss(model, chunks: np.ndarray, bf16: bool, batch: int = 16) -> float:
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(chunks), batch):
            x = torch.from_numpy(chunks[i : i + batch])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=x, labels=x).loss
            n = x.shape[0] * (x.shape[1] - 1)
            total += float(loss.float()) * n
            count += n
    model.train()
    return total / count


def _step_bar(total: int, initial: int, desc: str, progress: bool | None):
    from tqdm.auto import tqdm

    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("LMGEOM_QUIET")
    return tqdm(total=total, initial=initial, desc=desc, unit="tok", unit_scale=True,
                disable=not progress, smoothing=0.1)


def _checkpoint_meta(folder: Path) -> dict[str, Any] | None:
    p = folder / CHECKPOINT_META
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError:
        return None


def _save_checkpoint(wdir: Path, model, tokenizer, step: int, meta: dict[str, Any]) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from ..models.load import weights_hash

    hf_logging.disable_progress_bar()
    final = wdir / f"step{step}"
    tmp = wdir / f".step{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    meta = {**meta, "weights_sha256": weights_hash(tmp)}
    write_json(tmp / CHECKPOINT_META, meta)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return meta


class _Stop(Exception):
    """Internal: ``stop_after_steps`` reached (a simulated interruption)."""


def _train_width(root: Path, width: int, config: SuiteConfig, data: SuiteData, *,
                 progress: bool | None, resume_every_s: float,
                 stop_after_steps: int | None) -> dict[str, Any]:
    import torch

    wdir = root / str(width)
    wdir.mkdir(parents=True, exist_ok=True)
    S, B, T = config.steps, config.batch_size, config.seq_len
    ckpts = checkpoint_steps(S, config.n_regular)
    order = _Order(data.n_chunks(T), B, config.seed)
    val = data.val_chunks(T, config.val_tokens)
    train = data.train
    model = build_model(width, config, data.tokenizer)
    model.train()
    opt = _optimizer(model, config)
    n_params = int(sum(p.numel() for p in model.parameters()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(config.seed))
        meta = _load_state(wdir, model, opt)
        step = int(meta["step"]) if meta else 0
        timings = dict(meta.get("timings", {})) if meta else {}
        for k in ("train_s", "eval_s", "save_s"):
            timings.setdefault(k, 0.0)
        ema = meta.get("train_loss_ema") if meta else None
        if meta:
            log.info("w%d: resuming at step %d of %d", width, step, S)
        bar = _step_bar(S * B * T, step * B * T, width_label(width), progress)
        last_state = time.perf_counter()
        done_here = 0
        try:
            while True:
                if step in ckpts and _checkpoint_meta(wdir / f"step{step}") is None:
                    t = time.perf_counter()
                    vl = _val_loss(model, val, config.bf16)
                    timings["eval_s"] += time.perf_counter() - t
                    t = time.perf_counter()
                    cm = _save_checkpoint(wdir, model, data.tokenizer, step, {
                        "width": width, "step": step, "tokens": step * B * T, "val_loss": vl,
                        "val_tokens": int(val.size), "lr": config.lr_at(step) if step else 0.0,
                        "train_loss_ema": ema,
                    })
                    log.info("w%d step %d: val loss %.4f", width, step, vl)
                    if step < S:
                        _save_state(wdir, model, opt, step, {"train_loss_ema": ema, "timings": timings})
                        last_state = time.perf_counter()
                    timings["save_s"] += time.perf_counter() - t
                    bar.set_postfix(val=f"{cm['val_loss']:.3f}", refresh=False)
                if step >= S:
                    break
                if stop_after_steps is not None and done_here >= stop_after_steps:
                    raise _Stop
                t = time.perf_counter()
                idx = order.batch(step)
                x = torch.from_numpy(np.stack([train[i * T : (i + 1) * T] for i in idx]).astype(np.int64))
                lr = config.lr_at(step + 1)
                for g in opt.param_groups:
                    g["lr"] = lr
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
                    loss = model(input_ids=x, labels=x).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                lv = float(loss.detach().float())
                if not math.isfinite(lv):
                    raise DataError(f"w{width}: training loss became {lv} at step {step + 1}; "
                                    "lower --lr or use --no-bf16")
                ema = lv if ema is None else 0.9 * ema + 0.1 * lv
                step += 1
                done_here += 1
                timings["train_s"] += time.perf_counter() - t
                bar.update(B * T)
                bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.1e}", refresh=False)
                if time.perf_counter() - last_state > resume_every_s and step < S and step not in ckpts:
                    t = time.perf_counter()
                    _save_state(wdir, model, opt, step, {"train_loss_ema": ema, "timings": timings})
                    timings["save_s"] += time.perf_counter() - t
                    last_state = time.perf_counter()
        except _Stop:
            bar.close()
            return {"status": "stopped", "step": step}
        finally:
            bar.close()
    timings["tokens_per_s"] = S * B * T / timings["train_s"] if timings["train_s"] > 0 else math.nan
    record = {
        "status": "complete",
        "width": width,
        "label": width_label(width),
        "shape": model_shape(width, config),
        "n_params": n_params,
        "n_params_non_embedding": n_params - 2 * len(data.tokenizer) * width,
        "steps": ckpts,
        "threads": torch.get_num_threads(),
        "bf16": config.bf16,
        "timings": timings,
    }
    write_json(wdir / WIDTH_DONE, record)
    shutil.rmtree(wdir / "_state", ignore_errors=True)
    shutil.rmtree(wdir / "_state.old", ignore_errors=True)
    return record


def _width_complete(root: Path, width: int, config: SuiteConfig) -> bool:
    p = root / str(width) / WIDTH_DONE
    if not p.is_file():
        return False
    steps = checkpoint_steps(config.steps, config.n_regular)
    return all(_checkpoint_meta(root / str(width) / f"step{s}") is not None for s in steps)


def _check_folder(root: Path, config: SuiteConfig, overwrite: bool) -> None:
    from .._io import remove_written, written_by_lmgeom
    from .._paths import check_output_location

    marker = root / "suite.json"
    want = {"format": FORMAT, "settings": config.shared_settings()}
    check_output_location(root)
    if root.exists() and not root.is_dir():
        raise CacheError(f"--out {root} exists and is not a folder")
    if root.is_dir() and any(root.iterdir()):
        have = None
        if marker.is_file() and written_by_lmgeom(marker):
            try:
                have = json.loads(marker.read_text())
            except ValueError:
                have = None
        if have is None:
            raise CacheError(f"{root} is not empty and is not a suite folder lmgeom wrote (no "
                             "suite.json written by lmgeom); choose a new folder for --out")
        if have != want:
            if not overwrite:
                diff = sorted(k for k in want["settings"]
                              if have.get("settings", {}).get(k) != want["settings"][k])
                raise CacheError(
                    f"{root} holds a suite trained with other settings ({', '.join(diff) or 'format'}); "
                    "pass --overwrite to replace it or choose another --out (widths may differ: "
                    "new widths are added to an existing suite)"
                )
            log.warning("replacing the suite in %s (--overwrite): removing the files lmgeom "
                        "wrote there", root)
            _, kept = remove_written(root)
            if kept:
                log.warning("kept %d files in %s that lmgeom did not write (e.g. %s)", len(kept),
                            root, kept[0].relative_to(root))
    root.mkdir(parents=True, exist_ok=True)
    if not marker.is_file():
        write_json(marker, want)


def train_suite(
    out_dir: str | os.PathLike[str],
    config: SuiteConfig | None = None,
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    resume_every_s: float = 300.0,
    stop_after_steps: int | None = None,
    threads: int | None = 1,
) -> dict[str, Any]:
    """Train (or resume, or extend with new widths) a width suite into ``out_dir``.

    Widths that are complete are skipped; an interrupted width resumes from its last saved state.
    Widths train one after another on the same data order.

    Args:
        out_dir: the suite folder (created).
        config: the suite's settings (default :class:`SuiteConfig`).
        overwrite: replace a suite trained with other shared settings.
        progress: progress bars (default: when stderr is a terminal and ``LMGEOM_QUIET`` unset).
        resume_every_s: also save the resume state this often between checkpoints.
        stop_after_steps: stop each unfinished width after this many optimizer steps in this
            call, without saving anything beyond the regular checkpoints — simulates a killed
            run (tests); the manifest then lists those widths as ``partial``.
        threads: torch intra-op threads while training (restored afterwards); ``None`` keeps
            torch's setting. The default 1 is the fastest on a machine whose cores are shared
            (two threads on two busy cores ran 3-25x slower, docs/suite.md); the thread count
            can change float reductions, so resume with the same count for bit-identical weights.

    Returns:
        The manifest (also written to ``out_dir/manifest.json``).

    Raises:
        CacheError: the folder holds something else or another process trains it.
        ConfigError / DataError / TextsError: bad settings or unusable corpora.
    """

    config = config or SuiteConfig()
    root = Path(out_dir)
    from ..results.folder import acquire_output_lock, release_output_lock

    lock = acquire_output_lock(root)  # beside the folder, as every lmgeom output
    t_start_ns = time.time_ns()
    try:
        _check_folder(root, config, overwrite)
    except BaseException:
        release_output_lock(lock)
        raise
    import torch

    prev_threads = torch.get_num_threads()
    if threads is not None:
        if int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    try:
        t0 = time.perf_counter()
        data = prepare_data(root, config, progress=progress)
        t_data = time.perf_counter() - t0
        epochs = config.steps * config.batch_size / max(1, data.n_chunks(config.seq_len))
        if epochs > 1:
            log.warning("the token budget is %.2f passes over the %d training tokens", epochs,
                        len(data.train))
        for w in config.widths:
            if _width_complete(root, w, config):
                log.info("w%d is complete; skipped", w)
                continue
            _train_width(root, w, config, data, progress=progress, resume_every_s=resume_every_s,
                         stop_after_steps=stop_after_steps)
        manifest = write_manifest(root, config, data_s=t_data)
    finally:
        from .._io import record_tree

        record_tree(root, since_ns=t_start_ns)  # what this call wrote (for --overwrite)
        torch.set_num_threads(prev_threads)
        release_output_lock(lock)
    return manifest


# --------------------------------------------------------------------------- manifest


def _widths_on_disk(root: Path) -> list[int]:
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def suite_checkpoints(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every saved checkpoint of a suite folder, sorted by width then step: dicts with
    ``width``, ``label`` (``w128``), ``step``, ``revision`` (``step512``), ``path``,
    ``tokens``, ``val_loss``, ``weights_sha256``."""
    root = Path(root)
    if not (root / "suite.json").is_file():
        raise CacheError(f"{root} is not a suite folder (no suite.json); train one with "
                         "`lmgeom suite train --out DIR`")
    out = []
    for w in _widths_on_disk(root):
        for d in (root / str(w)).iterdir():
            if not (d.is_dir() and d.name.startswith("step") and d.name[4:].isdigit()):
                continue
            meta = _checkpoint_meta(d)
            if meta is None:
                continue
            out.append({"width": w, "label": width_label(w), "step": int(d.name[4:]),
                        "revision": d.name, "path": str(d), "tokens": meta.get("tokens"),
                        "val_loss": meta.get("val_loss"), "weights_sha256": meta.get("weights_sha256")})
    return sorted(out, key=lambda c: (c["width"], c["step"]))


def duplicate_weights(items: Sequence[tuple[str, str | None]]) -> list[list[str]]:
    """Groups of names whose weight hashes are equal: ``[(name, sha), ...]`` → ``[[a, b], ...]``
    (hash ``None`` is skipped)."""
    by: dict[str, list[str]] = {}
    for name, sha in items:
        if sha:
            by.setdefault(sha, []).append(name)
    return [names for names in by.values() if len(names) > 1]


def write_manifest(root: str | os.PathLike[str], config: SuiteConfig | None = None, *,
                   data_s: float | None = None) -> dict[str, Any]:
    """Rebuild ``root/manifest.json`` from what is on disk; warn about identical checkpoints."""
    from ..results.manifest import now, versions

    root = Path(root)
    suite = json.loads((root / "suite.json").read_text())
    settings = suite["settings"]
    info = json.loads((root / "data" / "data.json").read_text())
    cks = suite_checkpoints(root)
    total_steps = int(settings["tokens"]) // (int(settings["batch_size"]) * int(settings["seq_len"]))
    want = checkpoint_steps(total_steps, int(settings["n_regular"]))
    cfg = config or SuiteConfig(widths=tuple(_widths_on_disk(root)) or (64,),
                                **{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()})
    widths: dict[str, Any] = {}
    for w in _widths_on_disk(root):
        done = root / str(w) / WIDTH_DONE
        rec = json.loads(done.read_text()) if done.is_file() else {}
        mine = [c for c in cks if c["width"] == w]
        have = {c["step"] for c in mine}
        status = "complete" if rec.get("status") == "complete" and set(want) <= have else "partial"
        widths[str(w)] = {
            "label": width_label(w),
            "status": status,
            "shape": rec.get("shape") or model_shape(w, cfg),
            "n_params": rec.get("n_params"),
            "n_params_non_embedding": rec.get("n_params_non_embedding"),
            "steps": sorted(have),
            "missing_steps": sorted(set(want) - have),
            "checkpoints": {c["revision"]: {"step": c["step"], "tokens": c["tokens"],
                                            "val_loss": c["val_loss"],
                                            "weights_sha256": c["weights_sha256"],
                                            "path": os.path.relpath(c["path"], root)}
                            for c in mine},
            "threads": rec.get("threads"),
            "timings": rec.get("timings", {}),
        }
    dups = duplicate_weights([(f"{c['label']}@{c['revision']}", c["weights_sha256"]) for c in cks])
    for group in dups:
        log.warning("identical weights in the suite: %s (a checkpoint did not change — "
                    "was the learning rate 0?)", ", ".join(group))
    old = {}
    if (root / "manifest.json").is_file():
        try:
            old = json.loads((root / "manifest.json").read_text())
        except ValueError:
            old = {}
    timings = dict(old.get("timings", {}))
    if data_s is not None:
        timings.setdefault("data_s", data_s)
    timings["train_s_total"] = sum(float(v["timings"].get("train_s", 0.0)) for v in widths.values())
    timings["eval_s_total"] = sum(float(v["timings"].get("eval_s", 0.0)) for v in widths.values())
    timings["save_s_total"] = sum(float(v["timings"].get("save_s", 0.0)) for v in widths.values())
    manifest = {
        "format": FORMAT,
        "created": old.get("created") or now(),
        "updated": now(),
        "settings": settings,
        "tokens_per_width": total_steps * int(settings["batch_size"]) * int(settings["seq_len"]),
        "steps_total": total_steps,
        "checkpoint_steps": want,
        "seed": settings["seed"],
        "tokenizer": {"path": "tokenizer", "vocab_size": info["vocab_size"],
                      "sha256": info["tokenizer_sha256"]},
        "data": {k: info[k] for k in ("data_hash", "n_docs", "n_tokens", "sources", "dtype")},
        "widths": widths,
        "identical_weights": dups,
        "timings": {**info.get("timings", {}), **timings},
        "versions": versions(),
    }
    write_json(root / "manifest.json", manifest)
    return manifest


def read_suite(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a suite folder (rebuilt from disk when missing)."""
    root = Path(root)
    p = root / "manifest.json"
    if p.is_file():
        return json.loads(p.read_text())
    if (root / "suite.json").is_file() and (root / "data" / "data.json").is_file():
        return write_manifest(root)
    raise CacheError(f"{root} is not a suite folder; train one with `lmgeom suite train --out DIR`")


__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_TEXTS",
    "DEFAULT_TOKENS",
    "SuiteConfig",
    "SuiteData",
    "build_model",
    "checkpoint_steps",
    "describe_suite",
    "duplicate_weights",
    "model_shape",
    "plan_line",
    "prepare_data",
    "read_suite",
    "suite_checkpoints",
    "train_suite",
    "width_label",
    "widths_table",
    "write_manifest",
]



# ---------------------------------------------------------------------- summaries (CLI text)
def plan_line(root: str | os.PathLike[str], config: SuiteConfig) -> str:
    """One line: what ``train_suite(root, config)`` is about to train."""
    return (f"suite {root}: widths {', '.join(map(str, config.widths))}, {config.steps} steps "
            f"of {config.tokens_per_step} tokens ({config.steps * config.tokens_per_step:,} "
            f"tokens per width), {config.n_layers} layers, seed {config.seed}")


def widths_table(manifest: dict[str, Any]) -> str:
    """One row per width of a suite manifest: status, shape, checkpoints, first/last held-out
    loss, training time; then a warning line per group of identical weights."""
    from ..results.console import format_table

    rows = []
    for w, v in sorted(manifest["widths"].items(), key=lambda kv: int(kv[0])):
        cks = sorted(v["checkpoints"].values(), key=lambda c: c["step"])
        tm = v.get("timings", {})
        rows.append({
            "width": int(w), "status": v["status"], "layers": v["shape"]["n_layers"],
            "heads": v["shape"]["n_heads"], "params": v.get("n_params") or "",
            "ckpts": len(cks),
            "val loss first": cks[0]["val_loss"] if cks else float("nan"),
            "val loss last": cks[-1]["val_loss"] if cks else float("nan"),
            "train s": float(tm.get("train_s", float("nan"))),
            "tok/s": float(tm.get("tokens_per_s", float("nan"))),
        })
    lines = [format_table(rows, floatfmt="{:.4g}")]
    for group in manifest.get("identical_weights", []):
        lines.append("WARNING: identical weights: " + ", ".join(group))
    return "\n".join(lines)


def describe_suite(root: str | os.PathLike[str], manifest: dict[str, Any], *,
                   steps: bool = False) -> str:
    """What ``lmgeom suite info`` prints: settings, data, checkpoint steps, the widths table
    and, with ``steps``, every checkpoint's held-out loss and weights hash."""
    from ..results.console import format_table

    m, s = manifest, manifest["settings"]
    lines = [
        f"suite {root} ({m['format']}): {m['tokens_per_width']:,} tokens per width, "
        f"{m['steps_total']} steps of {s['batch_size']} x {s['seq_len']}, seed {m['seed']}, "
        f"vocab {m['tokenizer']['vocab_size']}, data {m['data']['data_hash'][:12]}",
        f"texts: {', '.join(s['texts'])} (excluded: {', '.join(s['exclude_texts']) or 'none'}); "
        f"checkpoint steps: {', '.join(map(str, m['checkpoint_steps']))}",
        widths_table(m),
    ]
    if steps:
        rows = []
        for w, v in sorted(m["widths"].items(), key=lambda kv: int(kv[0])):
            for rev, c in sorted(v["checkpoints"].items(), key=lambda kv: kv[1]["step"]):
                rows.append({"width": int(w), "checkpoint": rev, "tokens": c["tokens"],
                             "val loss": c["val_loss"],
                             "weights": (c["weights_sha256"] or "")[:12]})
        lines += ["", format_table(rows, floatfmt="{:.4f}")]
    return "\n".join(lines)
