"""Logit lens per layer: decode ``lm_head(norm(h_ℓ))`` and compare with the final distribution.

Computed on pooled states (with ``last`` pooling: the next-token prediction at each text's last
token), so it reuses the cached activations and needs no extra forward pass. Reported per
layer: top-1 agreement with the final layer's prediction and ``KL(p_final ‖ p_ℓ)`` in nats,
averaged over texts. Vocabulary-sized logits are formed ``chunk`` texts at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class LogitLensResult:
    layer: str
    top1_agreement: float
    kl: float
    kl_std: float
    n: int


def logit_lens(model, acts, *, chunk: int = 64) -> list[LogitLensResult]:
    """Top-1 agreement and KL to the final distribution for every layer in ``acts``.

    Args:
        model: the :class:`~lmgeom.models.LanguageModel` the activations came from.
        acts: :class:`~lmgeom.activations.Activations` that include the ``final`` point.
        chunk: texts per readout matmul (bounds memory at ``chunk × V`` floats).
    """
    import torch

    if "final" not in acts.layers:
        raise ConfigError("logit lens needs the 'final' layer in the activations")
    W_dtype = model.W_U.dtype
    fin = acts.layer("final")
    N = fin.shape[0]
    labels = [lab for lab in acts.layers if "." not in lab]  # sublayer outputs are not states
    agree: dict[str, list[np.ndarray]] = {lab: [] for lab in labels}
    kls: dict[str, list[np.ndarray]] = {lab: [] for lab in labels}
    with torch.no_grad():
        for s in range(0, N, chunk):
            h = torch.from_numpy(fin[s : s + chunk]).to(model.device, W_dtype)
            lp = torch.log_softmax(model.readout(h).float(), -1)
            p = lp.exp()
            top = lp.argmax(-1)
            for label in labels:
                h = torch.from_numpy(acts.layer(label)[s : s + chunk]).to(model.device, W_dtype)
                if label != "final":
                    h = model.apply_final_norm(h)
                lq = torch.log_softmax(model.readout(h).float(), -1)
                kls[label].append((p * (lp - lq)).sum(-1).double().cpu().numpy())
                agree[label].append((lq.argmax(-1) == top).cpu().numpy())
    out: list[LogitLensResult] = []
    for label in labels:
        kl_all = np.concatenate(kls[label])
        out.append(LogitLensResult(label, float(np.concatenate(agree[label]).mean()),
                                   float(kl_all.mean()),
                                   float(kl_all.std(ddof=1)) if N > 1 else 0.0, N))
    return out
