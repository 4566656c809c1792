"""Per-architecture knowledge, in one place.

Everything lmgeom needs to know about an architecture — where the blocks and the final norm
live, which sub-modules define the sublayer measurement points, how the final norm's gain is
parameterised — is an :class:`ArchSpec` in :data:`ARCHS`, keyed by ``config.model_type``.
Metric and experiment code never branches on the architecture.

Measurement points (METHODS.md):

::

    ``attn_out``  the attention sublayer's contribution to the residual stream, after any post-norm
                  the architecture applies (Gemma-2/3 and OLMo-2 norm the sublayer outputs).
    ``ffn_in``    the input of the FFN sublayer: the input of the MLP module, i.e. after its
                  pre-norm (OLMo-2 has no pre-norm there: it is the residual itself).
    ``ffn_out``   the FFN's contribution to the residual, after any post-norm.


For every supported architecture ``block_out − block_in == attn_out + ffn_out`` (tested).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ModelError


@dataclass(frozen=True)
class ArchSpec:
    """Where things live inside a ``*ForCausalLM``'s base model (dotted attribute paths)."""

    blocks: str
    final_norm: str
    attn: str
    mlp: str
    attn_post_norm: str | None = None
    ffn_post_norm: str | None = None
    #: the final norm multiplies by ``gain_offset + weight`` (Gemma's RMSNorm uses 1 + w)
    gain_offset: float = 0.0
    #: name of the config attribute holding a final-logit soft-cap, if the family has one
    softcap_attr: str | None = None
    #: families whose embedding output is scaled inside the embedding module (informational)
    notes: str = ""


_PRE_NORM = ArchSpec(blocks="layers", final_norm="norm", attn="self_attn", mlp="mlp")

ARCHS: dict[str, ArchSpec] = {
    "llama": _PRE_NORM,
    "mistral": _PRE_NORM,
    "qwen2": _PRE_NORM,
    "qwen3": _PRE_NORM,
    "olmo": _PRE_NORM,
    "phi3": _PRE_NORM,
    "gemma": ArchSpec(blocks="layers", final_norm="norm", attn="self_attn", mlp="mlp", gain_offset=1.0),
    "gemma2": ArchSpec(
        blocks="layers",
        final_norm="norm",
        attn="self_attn",
        mlp="mlp",
        attn_post_norm="post_attention_layernorm",
        ffn_post_norm="post_feedforward_layernorm",
        gain_offset=1.0,
        softcap_attr="final_logit_softcapping",
        notes="embedding output scaled by sqrt(d)",
    ),
    "gemma3_text": ArchSpec(
        blocks="layers",
        final_norm="norm",
        attn="self_attn",
        mlp="mlp",
        attn_post_norm="post_attention_layernorm",
        ffn_post_norm="post_feedforward_layernorm",
        gain_offset=1.0,
        softcap_attr="final_logit_softcapping",
        notes="embedding output scaled by sqrt(d)",
    ),
    "olmo2": ArchSpec(
        blocks="layers",
        final_norm="norm",
        attn="self_attn",
        mlp="mlp",
        attn_post_norm="post_attention_layernorm",
        ffn_post_norm="post_feedforward_layernorm",
    ),
    "gpt2": ArchSpec(blocks="h", final_norm="ln_f", attn="attn", mlp="mlp"),
    "gpt_neox": ArchSpec(
        blocks="layers", final_norm="final_layer_norm", attn="attention", mlp="mlp",
        notes="parallel residual by default (x + attn(ln1 x) + mlp(ln2 x))",
    ),
    "phi": ArchSpec(
        blocks="layers", final_norm="final_layernorm", attn="self_attn", mlp="mlp",
        notes="parallel attention and MLP on one input norm",
    ),
}

#: Families each tested on a tiny random model (tests/unit/test_models_arch.py).
TESTED_FAMILIES = tuple(sorted(ARCHS))

_GENERIC_BLOCKS = ("layers", "h", "blocks", "decoder.layers")
_GENERIC_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")


def get_attr(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def spec_for(model_type: str, base) -> ArchSpec:
    """The :class:`ArchSpec` for ``model_type``; unknown types are probed generically."""
    if model_type in ARCHS:
        return ARCHS[model_type]

    blocks = next((b for b in _GENERIC_BLOCKS if _has(base, b)), None)
    norm = next((n for n in _GENERIC_NORMS if _has(base, n)), None)
    if blocks is None or norm is None:
        raise ModelError(
            f"architecture {model_type!r} is not in lmgeom's registry and its blocks/final norm "
            f"could not be found (known: {', '.join(sorted(ARCHS))}); please open an issue"
        )
    first = get_attr(base, blocks)[0]
    attn = next((a for a in ("self_attn", "attn", "attention") if hasattr(first, a)), "self_attn")
    logging.getLogger(__name__).warning(
        "architecture %r is not in lmgeom's registry; using generic paths blocks=%s norm=%s "
        "(residual points are reliable; check sublayer points before relying on them)",
        model_type, blocks, norm,
    )
    return ArchSpec(blocks=blocks, final_norm=norm, attn=attn, mlp="mlp")


def _has(obj, dotted: str) -> bool:
    try:
        get_attr(obj, dotted)
        return True
    except AttributeError:
        return False
