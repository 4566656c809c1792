"""Push-away and squeeze auxiliary losses (METHODS.md "Push-away loss").

The auxiliary term acts on one layer's hidden states within a training batch. The token states
``(B, T, d)`` are flattened across batch and sequence, positions with ``attention_mask == 0``
(padding) are dropped, and each state is L2-normalised (``h̃ = h / ‖h‖``). Then

* **within** (default): ``d_avg = 1/(n(n−1)) Σ_{i≠j} (1 − h̃_i·h̃_j)`` over the ``n`` kept
  token states — exactly :func:`lmgeom.metrics.dispersion` of those states, computed with the
  same O(n·d) identity (``Σ_{i≠j} h̃_i·h̃_j = ‖Σ h̃_i‖² − n``); no n×n matrix is built;
* **cross**: ``d = 1/(|A||B|) Σ_{i∈A, j∈B} (1 − h̃_i·h̃_j)`` between the token states of the
  examples of domain A and those of domain B (a per-example ``domain`` id tensor) — exactly
  :func:`lmgeom.metrics.dispersion_between` (``1 − ū_A·ū_B``). With more than two domains in a
  batch the term is the mean over all pairs of domains.

The training objective is ``L = L_CE + λ·L_aux`` with ``L_aux = −d`` for push-away (spread the
states apart) and ``L_aux = +d`` for the squeeze control (pull them together). A third kind,
``none``, has ``L_aux = 0·d``: it measures ``d`` for logging and changes nothing. The rest of
the dispersion-regulariser family (InfoNCE over squared L2 distances or cosines, hinge on
cosine similarity, covariance decorrelation) is in :mod:`lmgeom.training.regularisers`; every
member is chosen by name with :func:`lmgeom.training.regularisers.make_aux_loss` and returns ``(L_aux, d)`` from
:meth:`DispersionLoss.terms`.

Layer: ``layer="final"`` (default) is the output of the final norm — the vector the readout
reads, identical to Hugging Face's ``hidden_states[-1]`` — which is what "last-layer vectors"
means in the paper's setting. Any lmgeom measurement point can be chosen instead: ``"L"`` or
``"last"`` is the last block's raw (pre-norm) output, ``"12"`` the residual after block 12,
``"12.attn_out"`` a sublayer (see :meth:`lmgeom.models.LanguageModel.resolve_points`).

Token sampling: ``max_tokens`` keeps a seeded uniform sample of at most that many token
states per call (per domain in cross mode); the k-th call of a loss object uses the seed
``SeedSequence([seed, k])``, so a run is reproducible and resumable (``calls``). Because the
term is O(n·d), sampling is only a memory/speed convenience; the default keeps all tokens.

Use in a plain PyTorch loop::

    from lmgeom.training import PushAwayLoss
    aux = PushAwayLoss(lam=0.01)                  # layer="final", mode="within"
    out = aux.compute(model, batch)               # batch: input_ids, attention_mask[, labels, domain]
    out.total.backward()                          # out.lm_loss, out.aux, out.dispersion

or with a Hugging Face ``Trainer``: ``DispersionTrainer(model=..., args=..., aux_loss=aux, ...)``
(or mix :class:`DispersionLossMixin` into your own ``Trainer`` subclass).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import torch

from ..errors import ConfigError, DataError, ModelError
from ..models.adapter import LanguageModel
from ..models.registry import spec_for

log = logging.getLogger(__name__)

__all__ = [
    "AUX_KINDS",
    "AUX_MODES",
    "AuxOutput",
    "DispersionLoss",
    "DispersionLossMixin",
    "DispersionTrainer",  # noqa: F822 - built lazily by the module __getattr__
    "PushAwayLoss",
    "SqueezeLoss",
    "forward_with_aux",
    "points_adapter",
]

#: kind → coefficient of ``d`` in ``L_aux``
AUX_KINDS: dict[str, float] = {"push-away": -1.0, "squeeze": 1.0, "none": 0.0}
AUX_MODES = ("within", "cross")
DEFAULT_LAYER = "final"


def _metrics():
    return importlib.import_module("lmgeom.metrics.dispersion")


# ---------------------------------------------------------------------- the loss
class DispersionLoss(torch.nn.Module):
    """``L_aux = sign · d`` on one layer's token states; ``total = L_CE + lam · L_aux``.

    Args:
        sign: coefficient of the dispersion ``d`` in ``L_aux``: ``-1`` push-away, ``+1``
            squeeze, ``0`` measure only.
        lam: λ, the weight of ``L_aux`` in the total loss (the paper tuned it in 0.001–0.1).
        layer: measurement point whose states enter the term (default ``"final"``: after the
            final norm, = ``hidden_states[-1]``; ``"last"`` = the last block's pre-norm output).
        mode: ``"within"`` (all kept tokens of the batch) or ``"cross"`` (between the tokens of
            different domains; needs a per-example ``domain`` tensor).
        max_tokens: keep a seeded sample of at most this many token states per call (per
            domain in cross mode); ``None`` keeps all.
        seed: seed of that sampling.
        skip_first: also drop position 0 of every row (a prepended BOS / attention sink).
        check: validate the states (finite, no zero rows) on every call; off by default
            because it synchronises with the device.

    Attributes:
        calls: number of :meth:`dispersion` calls so far (the sampling seed of the next call
            is ``SeedSequence([seed, calls])``); save and restore it to resume a run exactly.
    """

    kind = "custom"

    def __init__(
        self,
        sign: float = -1.0,
        *,
        lam: float = 0.01,
        layer: str | int = DEFAULT_LAYER,
        mode: str = "within",
        max_tokens: int | None = None,
        seed: int = 0,
        skip_first: bool = False,
        check: bool = False,
    ) -> None:
        super().__init__()
        if not np.isfinite(sign):
            raise ConfigError(f"sign must be a finite number (-1 push-away, +1 squeeze), got {sign}")
        if not np.isfinite(lam) or lam < 0:
            raise ConfigError(f"lam (λ) must be a finite number >= 0, got {lam}")
        if mode not in AUX_MODES:
            raise ConfigError(f"mode must be one of {', '.join(AUX_MODES)}, got {mode!r}")
        if max_tokens is not None and int(max_tokens) < 2:
            raise ConfigError(f"max_tokens must be >= 2 (or None for all), got {max_tokens}")
        self.sign = float(sign)
        self.lam = float(lam)
        self.layer = layer
        self.mode = mode
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.seed = int(seed)
        self.skip_first = bool(skip_first)
        self.check = bool(check)
        self.calls = 0
        self.n_degenerate = 0

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, sign={self.sign:g}, lam={self.lam:g}, layer={self.layer!r}, "
                f"mode={self.mode!r}, max_tokens={self.max_tokens}, seed={self.seed}")

    # -------------------------------------------------------------- pieces
    def _generator(self) -> torch.Generator:
        state = np.random.SeedSequence([self.seed, self.calls]).generate_state(2, dtype=np.uint32)
        g = torch.Generator(device="cpu")
        g.manual_seed(int(state[0]) << 32 | int(state[1]))
        return g

    def _sample(self, H: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if self.max_tokens is None or H.shape[0] <= self.max_tokens:
            return H
        keep = torch.randperm(H.shape[0], generator=g)[: self.max_tokens].to(H.device)
        return H[keep]

    def token_states(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flatten ``hidden`` to the kept token states.

        Args:
            hidden: ``(B, T, d)`` states (or ``(T, d)`` for one row).
            attention_mask: ``(B, T)`` (or ``(T,)``); 0 marks padding. ``None``: all positions.

        Returns:
            ``(H, rows)``: ``(n, d)`` states in float32 (float64 kept; half precision widened),
            not yet normalised (the dispersion core normalises), and ``(n,)`` the batch row of
            each.
        """
        if not isinstance(hidden, torch.Tensor):
            raise DataError(f"hidden must be a torch tensor (B, T, d), got {type(hidden).__name__}")
        if hidden.ndim == 2:
            hidden = hidden[None]
            if attention_mask is not None and attention_mask.ndim == 1:
                attention_mask = attention_mask[None]
        if hidden.ndim != 3:
            raise DataError(f"hidden must be (B, T, d); got shape {tuple(hidden.shape)}")
        B, T, _ = hidden.shape
        if attention_mask is None:
            mask = torch.ones(B, T, dtype=torch.bool, device=hidden.device)
        else:
            if tuple(attention_mask.shape) != (B, T):
                raise DataError(f"attention_mask has shape {tuple(attention_mask.shape)} but the "
                                f"hidden states are {tuple(hidden.shape)}; expected ({B}, {T})")
            mask = attention_mask.to(hidden.device).bool()
        if self.skip_first:
            mask = mask.clone()
            mask[:, 0] = False
        rows, cols = mask.nonzero(as_tuple=True)
        H = hidden[rows, cols]
        if H.dtype not in (torch.float32, torch.float64):
            H = H.float()
        return H, rows

    def kept_states(self, hidden: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The ``(n, d)`` token states one call uses in ``mode="within"``: padding dropped, then
        the call's seeded sample of at most ``max_tokens`` (advances ``calls``)."""
        H, _ = self.token_states(hidden, attention_mask)
        g = self._generator()
        self.calls += 1
        return self._sample(H, g)

    def dispersion(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        domain: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The dispersion ``d`` of a batch's token states (differentiable 0-d tensor, float32 or
        float64 for float64 input; computed outside autocast).

        Args:
            hidden: ``(B, T, d)`` states of the chosen layer.
            attention_mask: ``(B, T)``, 0 = padding (excluded). ``None``: all positions count.
            domain: ``(B,)`` integer domain id per example; required in ``mode="cross"``,
                ignored in ``mode="within"``.

        Returns:
            ``d_avg`` (within) or the mean cross-domain distance (cross). A batch without two
            tokens (within) or without two domains (cross) gives 0 with a zero gradient and
            counts in ``n_degenerate``.
        """
        # float32 even under autocast (autocast would run the O(n·d) matmul in bf16)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self._dispersion(hidden, attention_mask, domain)

    def _dispersion(self, hidden, attention_mask, domain) -> torch.Tensor:
        core = _metrics()
        H, rows = self.token_states(hidden, attention_mask)
        g = self._generator()
        self.calls += 1
        zero = hidden.float().sum() * 0.0
        if self.mode == "within":
            H = self._sample(H, g)
            if H.shape[0] < 2:
                self.n_degenerate += 1
                return zero
            return core.dispersion(H, check=self.check)
        if domain is None:
            raise ConfigError("mode='cross' needs a per-example domain tensor (B,) (batch key "
                              "'domain'); use mode='within' for single-domain batches")
        domain = torch.as_tensor(domain, device=hidden.device)
        if domain.ndim != 1 or domain.shape[0] != (hidden.shape[0] if hidden.ndim == 3 else 1):
            raise DataError(f"domain must be (B,) with one id per example; got shape "
                            f"{tuple(domain.shape)} for hidden {tuple(hidden.shape)}")
        if domain.dtype.is_floating_point:
            raise DataError(f"domain ids must be integers; got {domain.dtype}")
        dom = domain[rows]
        groups = [self._sample(H[dom == k], g) for k in torch.unique(dom).tolist()]
        groups = [G for G in groups if G.shape[0] > 0]
        if len(groups) < 2:
            self.n_degenerate += 1
            return zero
        terms = [core.dispersion_between(groups[i], groups[j], check=self.check)
                 for i in range(len(groups)) for j in range(i + 1, len(groups))]
        return torch.stack(terms).mean()

    def terms(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        domain: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L_aux, d)``: the auxiliary term (with graph) and the dispersion ``d`` of the same
        token states. Here ``L_aux = sign · d``; the other regularisers of the family
        (:mod:`lmgeom.training.regularisers`) override this."""
        d = self.dispersion(hidden, attention_mask, domain)
        return self.sign * d, d

    def forward(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        domain: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``L_aux`` (unweighted; the total adds ``lam · L_aux``): ``sign · d`` here."""
        return self.terms(hidden, attention_mask, domain)[0]

    def compute(self, model: Any, batch: Mapping[str, Any], **forward_kwargs: Any) -> AuxOutput:
        """Run ``model`` on ``batch`` and return ``(lm_loss, aux, total)``; see :func:`forward_with_aux`."""
        return forward_with_aux(model, batch, self, **forward_kwargs)


class PushAwayLoss(DispersionLoss):
    """Push-away: ``L_aux = −d`` (raises the dispersion). Arguments as :class:`DispersionLoss`."""

    kind = "push-away"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(AUX_KINDS["push-away"], **kwargs)


class SqueezeLoss(DispersionLoss):
    """Squeeze control: ``L_aux = +d`` (lowers the dispersion). Arguments as :class:`DispersionLoss`."""

    kind = "squeeze"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(AUX_KINDS["squeeze"], **kwargs)


class MeasureOnlyLoss(DispersionLoss):
    """``L_aux = 0·d``: ``d`` is measured for logging; the objective is plain ``L_CE``."""

    kind = "none"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(AUX_KINDS["none"], **kwargs)


# ---------------------------------------------------------------------- forward helper
@dataclass
class AuxOutput:
    """What :func:`forward_with_aux` returns.

    Attributes:
        lm_loss: the model's cross-entropy loss (0-d tensor, with graph).
        aux: ``L_aux = sign · d`` (0-d, with graph, unweighted).
        total: ``lm_loss + lam · aux`` — call ``.backward()`` on this.
        dispersion: ``d`` (0-d, detached), for logging.
        outputs: the model's own output object (logits etc.).
    """

    lm_loss: torch.Tensor
    aux: torch.Tensor
    total: torch.Tensor
    dispersion: torch.Tensor
    outputs: Any = None


def _unwrap(model: Any) -> Any:
    """The ``transformers`` model inside a LanguageModel / PeftModel / DDP wrapper."""
    if isinstance(model, LanguageModel):
        return model.hf_model
    m = model
    for _ in range(4):
        if callable(getattr(m, "get_base_model", None)):
            m = m.get_base_model()
        elif isinstance(getattr(m, "module", None), torch.nn.Module):
            m = m.module
        else:
            break
    return m


def points_adapter(model: Any):
    """A :class:`~lmgeom.models.LanguageModel` view of ``model`` for its hooks (no copy, no
    ``eval()``): works for a LanguageModel, a ``transformers`` causal LM, a PeftModel or a DDP
    wrapper. Cached on the model object."""
    if isinstance(model, LanguageModel):
        return model
    hf = _unwrap(model)
    cached = getattr(hf, "_lmgeom_points_adapter", None)
    if cached is not None:
        return cached
    prefix = getattr(hf, "base_model_prefix", None)
    base = getattr(hf, prefix, None) if prefix else None
    if base is None or not hasattr(hf, "config"):
        raise ModelError(f"{type(hf).__name__} is not a transformers causal LM lmgeom can hook "
                         "(no base model / config)")
    arch = spec_for(hf.config.model_type, base)
    lm = LanguageModel(hf_model=hf, tokenizer=None, name=type(hf).__name__, identity={}, arch=arch)
    lm._check_structure()
    hf.__dict__["_lmgeom_points_adapter"] = lm  # plain attribute, not a submodule
    return lm


def resolve_layer(adapter, layer: str | int) -> str:
    """One canonical point label for ``layer`` on ``adapter`` (ConfigError if it names several)."""
    pts = adapter.resolve_points(layer)
    if len(pts) != 1:
        raise ConfigError(f"the aux loss needs exactly one layer; {layer!r} names {len(pts)}")
    return pts[0]


class _Capture:
    """Context manager: hooks ``label`` on ``adapter`` and keeps the last tensor it saw."""

    def __init__(self, adapter, label: str) -> None:
        self.adapter, self.label, self.value = adapter, label, None

    def __enter__(self) -> Self:
        def sink(_p, h):
            self.value = h

        self._cm = self.adapter.capture([self.label], sink, stop_early=False)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._cm.__exit__(*exc)

    def get(self) -> torch.Tensor:
        if self.value is None:  # pragma: no cover - adapter bug
            raise RuntimeError(f"the hook for {self.label} did not fire during the forward pass")
        return self.value


def default_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Causal-LM labels: the inputs, with padding set to -100 (ignored). The model shifts them."""
    if attention_mask is None:
        return input_ids.clone()
    return input_ids.masked_fill(attention_mask.to(input_ids.device) == 0, -100)


def forward_with_aux(
    model: Any, batch: Mapping[str, Any], aux_loss: DispersionLoss, **forward_kwargs: Any
) -> AuxOutput:
    """One forward pass giving the LM loss, the auxiliary term and the total.

    The states of ``aux_loss.layer`` are taken with a forward hook during the model's own
    forward (no second pass, no ``output_hidden_states`` copy of every layer).

    Args:
        model: a ``transformers`` causal LM, a PeftModel, or a LanguageModel (its
            ``hf_model`` is run).
        batch: ``input_ids`` ``(B, T)``; optional ``attention_mask`` ``(B, T)`` (0 = pad),
            ``labels`` (default: the inputs with padding set to -100) and ``domain`` ``(B,)``.
        aux_loss: the :class:`DispersionLoss` (its ``lam``, ``layer``, ``mode``...).
        **forward_kwargs: passed to the model.

    Returns:
        :class:`AuxOutput` with ``total = lm_loss + lam · aux``.
    """
    if "input_ids" not in batch:
        raise ConfigError("batch needs 'input_ids' (and usually 'attention_mask')")
    input_ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    labels = batch.get("labels")
    if labels is None:
        labels = default_labels(input_ids, mask)
    adapter = points_adapter(model)
    label = resolve_layer(adapter, aux_loss.layer)
    run = model.hf_model if isinstance(model, LanguageModel) else model
    with _Capture(adapter, label) as cap:
        out = run(input_ids=input_ids, attention_mask=mask, labels=labels, use_cache=False,
                  **forward_kwargs)
    aux, d = aux_loss.terms(cap.get(), mask, batch.get("domain"))
    lm_loss = out.loss
    return AuxOutput(lm_loss=lm_loss, aux=aux, total=lm_loss + aux_loss.lam * aux,
                     dispersion=d.detach(), outputs=out)


# ---------------------------------------------------------------------- Trainer integration
class DispersionLossMixin:
    """Mix into a ``transformers.Trainer`` subclass to add ``lam · L_aux`` to its loss.

    ``class MyTrainer(DispersionLossMixin, Trainer): ...`` then ``MyTrainer(..., aux_loss=loss)``.
    The Trainer's own loss (labels, label smoothing, ``num_items_in_batch``) is kept; the
    states of ``aux_loss.layer`` are caught by a hook during that same forward. A ``domain``
    column/key in the batch is passed to the loss (and kept by ``remove_unused_columns``), not to
    the model. The term is added only in training mode, so ``eval_loss`` stays the plain LM loss.
    With gradient accumulation the term is scaled like the LM loss. The mean ``dispersion``,
    ``aux_loss`` and ``lm_loss`` since the last log are added to the Trainer's logs.
    """

    def __init__(self, *args: Any, aux_loss: DispersionLoss | None = None, **kwargs: Any) -> None:
        if not isinstance(aux_loss, DispersionLoss):
            raise ConfigError("pass aux_loss=PushAwayLoss(...) (or SqueezeLoss / DispersionLoss) "
                              "to the trainer")
        self.aux_loss = aux_loss
        self._aux_sums = {"dispersion": 0.0, "aux_loss": 0.0, "lm_loss": 0.0}
        self._aux_n = 0
        super().__init__(*args, **kwargs)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()  # type: ignore[misc]
        cols = self._signature_columns
        if cols is not None and "domain" not in cols:
            cols.append("domain")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        domain = inputs.pop("domain", None)
        adapter = points_adapter(model)
        label = resolve_layer(adapter, self.aux_loss.layer)
        with _Capture(adapter, label) as cap:
            loss, outputs = super().compute_loss(  # type: ignore[misc]
                model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            aux, d = self.aux_loss.terms(cap.get(), inputs.get("attention_mask"), domain)
            scaled = self.loss_is_scaled_for_ga  # type: ignore[attr-defined]
            if scaled is None:
                scaled = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) \
                    or self.compute_loss_func is not None  # type: ignore[attr-defined]
            ga = self.current_gradient_accumulation_steps if scaled else 1  # type: ignore[attr-defined]
            self._aux_sums["dispersion"] += float(d.detach())
            self._aux_sums["aux_loss"] += float(aux.detach())
            self._aux_sums["lm_loss"] += float(loss.detach()) * ga
            self._aux_n += 1
            loss = loss + (self.aux_loss.lam / ga) * aux
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self._aux_n and "loss" in logs:
            logs = {**logs, **{k: v / self._aux_n for k, v in self._aux_sums.items()}}
            self._aux_sums = dict.fromkeys(self._aux_sums, 0.0)
            self._aux_n = 0
        super().log(logs, *args, **kwargs)  # type: ignore[misc]


_TRAINER: Any = None


def __getattr__(name: str) -> Any:
    # DispersionTrainer is built on first use so importing this module does not import the
    # (slow) transformers Trainer.
    global _TRAINER
    if name == "DispersionTrainer":
        if _TRAINER is None:
            from transformers import Trainer

            _TRAINER = type("DispersionTrainer", (DispersionLossMixin, Trainer), {
                "__doc__": "``transformers.Trainer`` with the push-away / squeeze term: "
                           "``DispersionTrainer(..., aux_loss=PushAwayLoss(lam=0.01))``. See "
                           ":class:`DispersionLossMixin`.",
                "__module__": __name__,
            })
        return _TRAINER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
