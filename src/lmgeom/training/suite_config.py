"""The settings of a width suite (:class:`SuiteConfig`) and its documented rules: the shape of
each width (:func:`model_shape`), the checkpoint steps (:func:`checkpoint_steps`) and the model
labels (:func:`width_label`). The suite itself: :mod:`lmgeom.training.suite`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

FORMAT = "lmgeom-suite/1"
DEFAULT_TEXTS: tuple[str, ...] = ("builtin:wiki", "builtin:news", "builtin:science", "builtin:code")
#: texts held out of training by default: the sweep's default text set, so it is unseen
DEFAULT_EXCLUDE: tuple[str, ...] = ("builtin:domains",)
#: default token budget per width (sized for a 2-core CPU shared with other jobs; docs/suite.md)
DEFAULT_TOKENS = 393_216  # 192 steps of 16 x 128
CHECKPOINT_META = "lmgeom_checkpoint.json"
WIDTH_DONE = "width.json"


def _cli(**spec: Any) -> dict[str, Any]:
    """How a field appears as a ``lmgeom suite train`` option (read by
    ``lmgeom.commands.options.add_options``; types by name, see its ``TYPES``)."""
    return {"cli": spec}


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
        beta1: AdamW β1 (Pythia: 0.9).
        beta2: AdamW β2 (Pythia: 0.95).
        eps: AdamW ε (Pythia: 1e-8).
        grad_clip: global gradient-norm clip.
        seed: data split, data order and initialisation seed (shared by all widths).
        vocab_size: BPE vocabulary size (special tokens included).
        texts: training corpus (a ``load_texts`` spec: ``builtin:NAME`` or a file); repeat
            for several.
        exclude_texts: corpus whose texts are kept out of training and validation; repeat
            for several.
        val_fraction: held-out fraction of the documents, for the validation loss (split by
            TextSet.split).
        val_tokens: tokens of the held-out stream evaluated at every checkpoint.
        n_regular: evenly spaced checkpoints added to the log-spaced ones (0, 1, 2, 4, ...).
        bf16: bfloat16 autocast for the forward/backward (weights and AdamW stay float32).
        tokenizer_chars: characters of (shuffled) training text the tokenizer is trained on.
        max_position_embeddings: the models' position limit (rotary: no learned positions).
    """

    widths: tuple[int, ...] = (64, 128, 256, 512)
    n_layers: int = field(default=6, metadata=_cli(type="positive_int"))
    head_width: int = 64
    ffn_mult: int = 4
    tokens: int = field(default=DEFAULT_TOKENS, metadata=_cli(type="positive_int"))
    seq_len: int = field(default=128, metadata=_cli(type="int>=2"))
    batch_size: int = field(default=16, metadata=_cli(type="positive_int"))
    lr: float = field(default=1e-3, metadata=_cli(type="positive_float"))
    min_lr_ratio: float = 0.1
    warmup_frac: float = field(default=0.01, metadata=_cli(type="[0,1)"))
    weight_decay: float = field(default=0.01, metadata=_cli(type="nonneg_float"))
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = field(default=0, metadata=_cli(type="seed_int"))
    vocab_size: int = field(default=4096, metadata=_cli(type="positive_int"))
    texts: tuple[str, ...] = field(default=DEFAULT_TEXTS,
                                   metadata=_cli(action="append", metavar="SPEC"))
    exclude_texts: tuple[str, ...] = field(default=DEFAULT_EXCLUDE,
                                           metadata=_cli(action="append", metavar="SPEC"))
    val_fraction: float = field(default=0.02, metadata=_cli(type="open_fraction"))
    val_tokens: int = field(default=8192, metadata=_cli(type="positive_int"))
    n_regular: int = field(default=4, metadata=_cli(flag="--regular-checkpoints", dest="n_regular",
                                                    type="nonneg_int"))
    bf16: bool = field(default=True, metadata=_cli(flag="--no-bf16", dest="bf16",
                                                   action="store_false"))
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

__all__ = ["CHECKPOINT_META", "DEFAULT_EXCLUDE", "DEFAULT_TEXTS", "DEFAULT_TOKENS", "FORMAT",
           "WIDTH_DONE", "SuiteConfig", "checkpoint_steps", "model_shape", "width_label"]
