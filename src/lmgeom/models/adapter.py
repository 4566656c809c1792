"""``LanguageModel``: a loaded causal LM plus everything lmgeom needs to know about it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConfigError, ModelError
from .registry import ArchSpec, get_attr, spec_for

SUBLAYER_POINTS = ("attn_out", "ffn_in", "ffn_out")


@dataclass
class LanguageModel:
    """A causal LM with named measurement points.

    Attributes:
        hf_model: the underlying ``transformers`` ``*ForCausalLM`` (drop down to it freely).
        tokenizer: its tokenizer (``padding_side`` is forced to ``"right"`` for extraction).
        name: the spec the user gave (``smollm2-135m``, a hub id, a path).
        identity: everything that identifies the weights (source, revision, sha256, ...); part
            of every cache key.
        arch: the registry entry for this architecture.
    """

    hf_model: Any
    tokenizer: Any
    name: str
    identity: dict[str, Any]
    arch: ArchSpec = field(repr=False)

    # ------------------------------------------------------------------ structure
    @classmethod
    def wrap(cls, hf_model, tokenizer, *, name: str, identity: dict[str, Any]) -> LanguageModel:
        if hf_model.get_output_embeddings() is None:
            raise ModelError(
                f"model {name!r} has no readout head (W_U): lmgeom needs a causal LM, not an "
                "encoder; load a *ForCausalLM checkpoint"
            )
        base = getattr(hf_model, hf_model.base_model_prefix, None)
        if base is None:
            raise ModelError(f"model {name!r}: cannot find its base model")
        arch = spec_for(hf_model.config.model_type, base)
        hf_model.eval()
        lm = cls(hf_model=hf_model, tokenizer=tokenizer, name=name, identity=identity, arch=arch)
        lm._check_structure()
        return lm

    def _check_structure(self) -> None:
        try:
            blocks = self.blocks
            _ = self.final_norm
            first = blocks[0]
            get_attr(first, self.arch.attn)
            get_attr(first, self.arch.mlp)
        except (AttributeError, IndexError, TypeError) as exc:
            raise ModelError(
                f"model {self.name!r} ({self.model_type}) does not match lmgeom's registry "
                f"entry: {exc}"
            ) from exc

    @property
    def base_model(self) -> torch.nn.Module:
        """The decoder without the readout head (``model.model`` for Llama)."""
        return getattr(self.hf_model, self.hf_model.base_model_prefix)

    @property
    def model_type(self) -> str:
        return str(self.hf_model.config.model_type)

    @property
    def blocks(self) -> Sequence[torch.nn.Module]:
        return get_attr(self.base_model, self.arch.blocks)

    @property
    def n_blocks(self) -> int:
        """L, the number of transformer blocks."""
        return len(self.blocks)

    @property
    def width(self) -> int:
        """d, the residual-stream width."""
        return int(self.W_U.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.W_U.shape[0])

    @property
    def final_norm(self) -> torch.nn.Module:
        return get_attr(self.base_model, self.arch.final_norm)

    @property
    def W_U(self) -> torch.Tensor:
        """The unembedding ``(V, d)`` (the ``lm_head`` weight; often tied to the embedding)."""
        return self.hf_model.get_output_embeddings().weight

    @property
    def readout_bias(self) -> torch.Tensor | None:
        return getattr(self.hf_model.get_output_embeddings(), "bias", None)

    @property
    def logit_softcap(self) -> float | None:
        attr = self.arch.softcap_attr
        val = getattr(self.hf_model.config, attr, None) if attr else None
        return float(val) if val else None

    @property
    def final_norm_gain(self) -> torch.Tensor | None:
        """γ of the final norm as the readout sees it (``offset + weight``), or None."""
        w = getattr(self.final_norm, "weight", None)
        if w is None:
            return None
        return w.detach() + self.arch.gain_offset

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    @property
    def context_length(self) -> int | None:
        """The longest sequence the model's positions cover, from its config
        (``max_position_embeddings``, ``n_positions``, ...); None when the config does not say."""
        cfg = self.hf_model.config
        for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
            v = getattr(cfg, name, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return None

    @property
    def layer_labels(self) -> tuple[str, ...]:
        """``("0", "1", ..., "L", "final")``: embeddings, residual after each block, post-norm."""
        return tuple(str(i) for i in range(self.n_blocks + 1)) + ("final",)

    @property
    def points(self) -> tuple[str, ...]:
        """Every named measurement point: the layer labels plus ``"ℓ.attn_out"`` etc."""
        subs = tuple(f"{i}.{p}" for i in range(1, self.n_blocks + 1) for p in SUBLAYER_POINTS)
        return self.layer_labels + subs

    @property
    def bos_prepended(self) -> bool:
        """Whether the tokenizer prepends a BOS token (excluded from ``mean`` pooling)."""
        if not hasattr(self, "_bos"):
            bos = self.tokenizer.bos_token_id
            ids = self.tokenizer("a", add_special_tokens=True)["input_ids"]
            self._bos = bos is not None and len(ids) > 0 and ids[0] == bos
        return self._bos

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_type": self.model_type,
            "n_blocks": self.n_blocks,
            "width": self.width,
            "vocab_size": self.vocab_size,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            **{k: v for k, v in self.identity.items() if k not in ("name",)},
        }

    # ------------------------------------------------------------------ points & readout
    def resolve_points(self, spec: str | int | Sequence[str | int] = "all") -> tuple[str, ...]:
        """Normalise a layer/point spec into canonical labels.

        Accepts ``"all"`` (every layer label), ``"blocks"`` (1..L), ``"sublayers"``, ``"final"``,
        ints (negative counts from the end of ``0..L``: ``-1`` is ``L``), label strings,
        comma-separated lists, ranges ``"3-7"`` and points ``"12.attn_out"`` / ``"last.ffn_out"``.
        """
        L = self.n_blocks
        if isinstance(spec, bool) or not isinstance(spec, (int, str, Sequence)) and not hasattr(
                spec, "__iter__"):
            raise ConfigError(f"layers must be a label, an int or a list of them (e.g. 'all', "
                              f"12, [0, 6, 'final']); got {type(spec).__name__} {spec!r}")
        if isinstance(spec, (int, str)):
            items: list[str | int] = [spec]
        else:
            items = list(spec)
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                if hasattr(item, "__index__"):  # numpy integers
                    continue
                raise ConfigError(f"layers: each entry is a label or an int (e.g. 12, 'final', "
                                  f"'3-7'); got {type(item).__name__} {item!r}")
        items = [int(i) if not isinstance(i, (int, str)) else i for i in items]
        out: list[str] = []
        for item in items:
            if isinstance(item, str) and "," in item:
                out.extend(self.resolve_points([s.strip() for s in item.split(",") if s.strip()]))
                continue
            out.extend(self._resolve_one(item, L))
        # keep order, drop duplicates
        seen: dict[str, None] = {}
        for p in out:
            seen.setdefault(p, None)
        if not seen:
            raise ConfigError("no layers selected")
        return tuple(seen)

    def _resolve_one(self, item: str | int, L: int) -> list[str]:
        valid = f"valid: 0..{L}, final, all, blocks, sublayers, ranges like 3-7, points like {L}.attn_out"
        if isinstance(item, int) or (isinstance(item, str) and item.lstrip("-").isdigit()):
            i = int(item)
            j = i + L + 1 if i < 0 else i
            if not 0 <= j <= L:
                raise ConfigError(f"layer {i} is out of range for {self.name} ({valid})")
            return [str(j)]
        s = str(item).strip()
        if s == "all":
            return list(self.layer_labels)
        if s == "blocks":
            return [str(i) for i in range(1, L + 1)]
        if s == "sublayers":
            return [f"{i}.{p}" for i in range(1, L + 1) for p in SUBLAYER_POINTS]
        if s in ("final", "last"):
            return ["final"] if s == "final" else [str(L)]
        if "." in s:
            layer, point = s.split(".", 1)
            if point not in SUBLAYER_POINTS:
                raise ConfigError(f"unknown measurement point {point!r} (known: {', '.join(SUBLAYER_POINTS)})")
            li = L if layer == "last" else None
            if li is None:
                if not layer.lstrip("-").isdigit():
                    raise ConfigError(f"bad point {s!r} ({valid})")
                li = int(layer)
                li = li + L + 1 if li < 0 else li
            if not 1 <= li <= L:
                raise ConfigError(f"sublayer point {s!r}: block must be in 1..{L}")
            return [f"{li}.{point}"]
        if "-" in s:
            a, b = s.split("-", 1)
            if a.isdigit() and b.isdigit():
                lo, hi = int(a), int(b)
                if not (0 <= lo <= hi <= L):
                    raise ConfigError(f"layer range {s!r} is out of range ({valid})")
                return [str(i) for i in range(lo, hi + 1)]
        raise ConfigError(f"cannot parse layer {s!r} ({valid})")

    def point_index(self, label: str) -> int:
        """Position of a label on the layer axis: ``0..L``, ``final`` = L+1; sublayers use ℓ."""
        if label == "final":
            return self.n_blocks + 1
        return int(label.split(".", 1)[0])

    def apply_final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.final_norm(h)

    def readout(self, h_normed: torch.Tensor) -> torch.Tensor:
        """Logits from post-norm states ``(..., d)`` → ``(..., V)``, with bias and soft-cap."""
        W = self.W_U
        logits = torch.nn.functional.linear(h_normed.to(W.dtype), W, self.readout_bias)
        cap = self.logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ------------------------------------------------------------------ hooks
    @contextlib.contextmanager
    def capture(
        self,
        points: Sequence[str],
        sink: Callable[[str, torch.Tensor], None],
        *,
        stop_early: bool = True,
    ) -> Iterator[None]:
        """Register hooks that hand each requested point's ``(B, T, d)`` tensor to ``sink``.

        While the context is active, any forward of :attr:`base_model` calls
        ``sink(label, tensor)`` once per point. With ``stop_early`` the forward is cut short
        (:class:`StopForward`) after the last block that any point needs, so extracting early
        layers does not pay for the rest of the model; use :meth:`run_base` to swallow it.
        """
        L = self.n_blocks
        handles = []
        needed_block = 0
        blocks = self.blocks

        def first_tensor(x):
            return x[0] if isinstance(x, (tuple, list)) else x

        for p in points:
            if p == "0":
                def pre(mod, args, kwargs, _p=p):
                    h = args[0] if args else kwargs["hidden_states"]
                    sink(_p, h)
                handles.append(blocks[0].register_forward_pre_hook(pre, with_kwargs=True))
            elif p == "final":
                needed_block = L + 1
                handles.append(
                    self.final_norm.register_forward_hook(
                        lambda mod, a, out, _p=p: sink(_p, first_tensor(out))
                    )
                )
            elif "." in p:
                li, kind = p.split(".", 1)
                block = blocks[int(li) - 1]
                needed_block = max(needed_block, int(li))
                handles.append(self._hook_sublayer(block, kind, p, sink))
            else:
                li = int(p)
                needed_block = max(needed_block, li)
                handles.append(
                    blocks[li - 1].register_forward_hook(
                        lambda mod, a, out, _p=p: sink(_p, first_tensor(out))
                    )
                )
        if stop_early and needed_block <= L:
            stop_at = max(needed_block, 1)

            def stop(mod, a, out):
                raise StopForward

            handles.append(blocks[stop_at - 1].register_forward_hook(stop))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _hook_sublayer(self, block, kind: str, label: str, sink):
        arch = self.arch

        def out_hook(mod, a, out):
            sink(label, out[0] if isinstance(out, (tuple, list)) else out)

        if kind == "attn_out":
            mod = get_attr(block, arch.attn_post_norm or arch.attn)
            return mod.register_forward_hook(out_hook)
        if kind == "ffn_out":
            mod = get_attr(block, arch.ffn_post_norm or arch.mlp)
            return mod.register_forward_hook(out_hook)
        if kind == "ffn_in":
            mlp = get_attr(block, arch.mlp)

            def pre(mod, args, kwargs):
                sink(label, args[0] if args else next(iter(kwargs.values())))

            return mlp.register_forward_pre_hook(pre, with_kwargs=True)
        raise ConfigError(f"unknown sublayer point {kind!r}")

    def run_base(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Forward the base model (no logits, no KV cache), swallowing :class:`StopForward`."""
        with torch.no_grad():
            try:
                self.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            except StopForward:
                pass


class StopForward(Exception):
    """Raised by a hook to end a forward pass once every needed point is captured."""
