"""The dispersion regularisers as one family, selectable by name (:data:`REGULARISERS`).

Every member acts on the token states of one layer of a training batch, chosen, flattened,
padding-dropped and (with ``max_tokens``) sampled exactly as :class:`~.losses.DispersionLoss`
does; each returns ``(L_aux, d)`` from ``terms`` (``d``: the dispersion of the same states,
for logging) and plugs into :func:`~.losses.forward_with_aux`, the Trainer mixin and the
training loop unchanged. ``total = L_CE + lam · L_aux``.

With ``u_i = h_i / ‖h_i‖`` the unit states, ``c_ij = u_i·u_j`` and the means over ordered pairs
``i ≠ j`` of the ``n`` kept states:

.. list-table::
   :header-rows: 1

   * - name
     - ``L_aux``
     - effect on ``d``
   * - ``push-away``
     - ``−d``, ``d = mean_{i≠j} (1 − c_ij)`` (METHODS.md)
     - raises
   * - ``squeeze``
     - ``+d`` (the control)
     - lowers
   * - ``none``
     - ``0 · d`` (measure only)
     - none
   * - ``infonce-l2``
     - ``log mean_{i≠j} exp(−‖h_i − h_j‖² / (D · τ))`` on the raw states (``D`` = width; the
       dispersive loss of Wang & He 2025, "Diffuse and Disperse")
     - raises
   * - ``infonce-cos``
     - ``log mean_{i≠j} exp(c_ij / τ)``
     - raises
   * - ``hinge-cos``
     - ``mean_{i≠j} max(0, c_ij − margin)²``
     - raises (while pairs exceed the margin)
   * - ``covariance``
     - ``Σ_{a≠b} C_ab² / D``, ``C`` the covariance (ddof 1) of the unit states (off-diagonal
       decorrelation, as VICReg and Wang & He's covariance variant)
     - none fixed: it decorrelates (below)

``covariance`` targets decorrelation, not the spread: ``d = n/(n−1)·(1 − ‖ū‖²) = trace(C)`` of
the unit states, and the off-diagonal penalty is also lowered by shrinking ``C``. Measured: a
small step on the states always lowers the penalty but raised ``d`` in only 8 of 120 random
batches (30 × 6 and 64 × 32, isotropic or with a shared direction), and 8 Adam steps of
``L_CE + L_aux`` on a tiny Llama ended ``d`` only +0.01 above ``L_CE`` alone (push-away and both
InfoNCE: +0.37, hinge: +0.25, squeeze: −0.64; tests/e2e/test_regularisers_e2e.py). Dividing by
``trace(C)²`` raised ``d`` in 103 of 120 batches but lowered it on the model. It is in the family
because researchers compare it, not as a way to raise ``d``. The other variants raised ``d`` in
120 of 120 batches (squeeze: lowered it in 120).

The InfoNCE and hinge terms build the ``n × n`` similarity matrix (``O(n²)`` memory): cap ``n``
with ``max_tokens`` for long batches. These variants take ``mode="within"`` only (the
cross-domain form is push-away's).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import ConfigError
from ..metrics.dispersion import dispersion
from .losses import DispersionLoss, MeasureOnlyLoss, PushAwayLoss, SqueezeLoss


class SetRegulariser(DispersionLoss):
    """Base of the variants whose ``L_aux`` is not a multiple of ``d``: subclasses define
    ``objective`` over the ``(n, d)`` kept token states. Arguments as
    :class:`~.losses.DispersionLoss` (without ``sign``; ``mode`` must be ``"within"``)."""

    kind = "set"

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("mode", "within") != "within":
            raise ConfigError(f"the {self.kind} regulariser takes mode='within' only (the "
                              "cross-domain form is push-away's)")
        super().__init__(1.0, **kwargs)

    def objective(self, H: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def terms(self, hidden, attention_mask=None, domain=None):
        """``(L_aux, d)`` on the same kept token states (float32, outside autocast)."""
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            H = self.kept_states(hidden, attention_mask)
            if H.shape[0] < 2:
                self.n_degenerate += 1
                zero = hidden.float().sum() * 0.0
                return zero, zero.detach()
            d = self.dispersion_of(H)
            return self.objective(H), d

    @staticmethod
    def dispersion_of(H: torch.Tensor) -> torch.Tensor:
        """``d`` of the states ``H`` (detached), as :func:`lmgeom.metrics.dispersion`."""
        return dispersion(H.detach(), check=False)

    @staticmethod
    def cosines(H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(n, n)`` cosine matrix of the rows of ``H`` and the off-diagonal mask."""
        U = H / H.norm(dim=1, keepdim=True)
        off = ~torch.eye(H.shape[0], dtype=torch.bool, device=H.device)
        return U @ U.T, off


def _positive(value: float, name: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


class InfoNCEL2(SetRegulariser):
    """``log mean_{i≠j} exp(−‖h_i − h_j‖² / (D τ))`` on the raw states (``D`` = width).

    Args:
        tau: temperature τ (default 1, as Wang & He's dispersive loss).
        **kwargs: as :class:`~.losses.DispersionLoss`.
    """

    kind = "infonce-l2"

    def __init__(self, *, tau: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tau = _positive(tau, "tau")

    def objective(self, H):
        n, D = H.shape
        sq = (H * H).sum(1)
        dist = (sq[:, None] + sq[None, :] - 2.0 * (H @ H.T)).clamp_min(0.0) / D
        off = ~torch.eye(n, dtype=torch.bool, device=H.device)
        return torch.logsumexp(-dist[off] / self.tau, 0) - math.log(n * (n - 1))


class InfoNCECosine(SetRegulariser):
    """``log mean_{i≠j} exp(cos(h_i, h_j) / τ)``.

    Args:
        tau: temperature τ (default 1).
        **kwargs: as :class:`~.losses.DispersionLoss`.
    """

    kind = "infonce-cos"

    def __init__(self, *, tau: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tau = _positive(tau, "tau")

    def objective(self, H):
        C, off = self.cosines(H)
        n = H.shape[0]
        return torch.logsumexp(C[off] / self.tau, 0) - math.log(n * (n - 1))


class HingeCosine(SetRegulariser):
    """``mean_{i≠j} max(0, cos(h_i, h_j) − margin)²``: only pairs more similar than the margin
    are pushed apart.

    Args:
        margin: cosine similarity above which a pair is penalised (default 0).
        **kwargs: as :class:`~.losses.DispersionLoss`.
    """

    kind = "hinge-cos"

    def __init__(self, *, margin: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not (math.isfinite(margin) and -1.0 <= margin < 1.0):
            raise ConfigError(f"margin must be a cosine similarity in [-1, 1), got {margin}")
        self.margin = float(margin)

    def objective(self, H):
        C, off = self.cosines(H)
        return (C[off] - self.margin).clamp_min(0.0).pow(2).mean()


class CovarianceDecorrelation(SetRegulariser):
    """``Σ_{a≠b} C_ab² / D`` with ``C`` the ``D × D`` covariance (ddof 1) of the unit states: the
    off-diagonal decorrelation penalty (module docstring: it has no fixed effect on ``d``)."""

    kind = "covariance"

    def objective(self, H):
        U = H / H.norm(dim=1, keepdim=True)
        Uc = U - U.mean(0, keepdim=True)
        C = (Uc.T @ Uc) / (U.shape[0] - 1)
        return (C.pow(2).sum() - torch.diagonal(C).pow(2).sum()) / U.shape[1]


#: every dispersion regulariser by name (``make_aux_loss(name, ...)``, ``lmgeom train``)
REGULARISERS: dict[str, type[DispersionLoss]] = {
    "push-away": PushAwayLoss,
    "squeeze": SqueezeLoss,
    "none": MeasureOnlyLoss,
    "infonce-l2": InfoNCEL2,
    "infonce-cos": InfoNCECosine,
    "hinge-cos": HingeCosine,
    "covariance": CovarianceDecorrelation,
}

#: the effect each regulariser's gradient has on the dispersion (+1 raises, -1 lowers, 0 none)
DIRECTION: dict[str, int] = {"push-away": 1, "squeeze": -1, "none": 0, "infonce-l2": 1,
                             "infonce-cos": 1, "hinge-cos": 1, "covariance": 0}


def make_aux_loss(kind: str, **kwargs: Any) -> DispersionLoss:
    """A regulariser by name → the loss object (kwargs as :class:`DispersionLoss`, plus the
    variant's own, e.g. ``tau``): ``"push-away"`` | ``"squeeze"`` | ``"none"`` and the rest of
    the family in :data:`REGULARISERS`."""
    cls = REGULARISERS.get(kind)
    if cls is None:
        raise ConfigError(f"unknown aux loss {kind!r}; use one of {', '.join(REGULARISERS)}")
    return cls(**kwargs)


__all__ = ["DIRECTION", "REGULARISERS", "make_aux_loss", "CovarianceDecorrelation", "HingeCosine", "InfoNCECosine",
           "InfoNCEL2", "SetRegulariser"]
