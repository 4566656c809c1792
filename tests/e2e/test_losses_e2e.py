"""Push-away / squeeze losses: agreement with the metric and with the O(n²) definition, padding
invariance, the cross-domain variant, gradient direction on a tiny model, Trainer integration.

End-to-end half (the unit half is tests/unit/test_losses.py).
"""

from __future__ import annotations

import pytest
import torch
from support.losses import make_tiny

from lmgeom.errors import ConfigError
from lmgeom.training import (
    PushAwayLoss,
    forward_with_aux,
)


class _Rows(torch.utils.data.Dataset):
    def __init__(self, ids, domain):
        self.ids, self.domain = ids, domain

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "domain": self.domain[i]}


def _collate(rows):
    ids = torch.stack([r["input_ids"] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(),
            "domain": torch.tensor([int(r["domain"]) for r in rows])}


def test_trainer_integration_runs_and_adds_the_term(tiny_dir, tmp_path):
    from transformers import TrainingArguments

    from lmgeom.training import DispersionTrainer

    lm = make_tiny(tiny_dir)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, lm.vocab_size, (8, 12), generator=g)
    data = _Rows(ids, [0, 1] * 4)
    aux = PushAwayLoss(lam=0.3, mode="cross")
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=2, per_device_train_batch_size=4,
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                             learning_rate=1e-3, disable_tqdm=True)
    trainer = DispersionTrainer(model=lm.hf_model, args=args, train_dataset=data,
                                data_collator=_collate, aux_loss=aux)
    trainer._set_signature_columns_if_needed()
    assert "domain" in trainer._signature_columns
    # compute_loss = the LM loss + λ·(−d) in training mode, the plain LM loss in eval mode
    batch = _collate([data[i] for i in range(4)])
    lm.hf_model.train()
    with torch.no_grad():
        got = float(trainer.compute_loss(lm.hf_model, dict(batch)))
        ref = forward_with_aux(lm.hf_model, batch, aux)
        lm.hf_model.eval()
        plain = float(trainer.compute_loss(lm.hf_model, dict(batch)))
    assert got == pytest.approx(float(ref.total), rel=1e-5)
    assert plain == pytest.approx(float(ref.lm_loss), rel=1e-5)
    assert got < plain  # push-away lowers the objective by λ·d
    trainer._aux_n = 0
    trainer._aux_sums = dict.fromkeys(trainer._aux_sums, 0.0)
    result = trainer.train()
    assert result.global_step == 2
    logged = [h for h in trainer.state.log_history if "dispersion" in h]
    assert len(logged) == 2
    assert all(0.0 < h["dispersion"] < 1.5 and h["aux_loss"] == pytest.approx(-h["dispersion"])
               for h in logged)
    with pytest.raises(ConfigError):
        DispersionTrainer(model=lm.hf_model, args=args, train_dataset=data)

