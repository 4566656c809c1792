"""Push-away / squeeze losses: agreement with the metric and with the O(n²) definition, padding
invariance, the cross-domain variant, gradient direction on a tiny model, Trainer integration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from support.losses import make_tiny

from lmgeom.errors import ConfigError, DataError
from lmgeom.metrics import dispersion, dispersion_between
from lmgeom.training import (
    DispersionLoss,
    PushAwayLoss,
    SqueezeLoss,
    forward_with_aux,
    make_aux_loss,
)


def _explicit_within(H: np.ndarray) -> float:
    """``1/(n(n−1)) Σ_{i≠j} (1 − cos)`` with an explicit double loop."""
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    n = len(U)
    tot = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                tot += 1.0 - float(U[i] @ U[j])
    return tot / (n * (n - 1))


def _explicit_between(A: np.ndarray, B: np.ndarray) -> float:
    UA = A / np.linalg.norm(A, axis=1, keepdims=True)
    UB = B / np.linalg.norm(B, axis=1, keepdims=True)
    return float(np.mean([1.0 - float(a @ b) for a in UA for b in UB]))


def _batch(seed=0, B=4, T=7, d=6, pad_from=(7, 5, 3, 7)):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, d, generator=g, dtype=torch.float64) + 0.7  # a shared offset: d < 1
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, k in enumerate(pad_from):
        mask[b, :k] = 1
    return h, mask


def _valid(h, mask) -> np.ndarray:
    return torch.cat([h[b][mask[b].bool()] for b in range(h.shape[0])]).numpy()


def test_within_equals_dispersion_metric_and_explicit_definition():
    h, mask = _batch()
    H = _valid(h, mask)
    push = PushAwayLoss(lam=0.1)
    sq = SqueezeLoss(lam=0.1)
    d = push.dispersion(h, mask)
    ref = _explicit_within(H)
    assert float(d) == pytest.approx(ref, rel=1e-6)
    assert float(d) == pytest.approx(dispersion(H), rel=1e-6)
    # sign conventions: push-away L_aux = −d, squeeze L_aux = +d, and 1 + L_push = mean cosine
    assert float(push(h, mask)) == pytest.approx(-ref, rel=1e-6)
    assert float(sq(h, mask)) == pytest.approx(ref, rel=1e-6)
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    C = U @ U.T
    n = len(U)
    mean_cos = (C.sum() - np.trace(C)) / (n * (n - 1))
    assert 1.0 + float(push(h, mask)) == pytest.approx(mean_cos, rel=1e-6)
    assert float(make_aux_loss("none")(h, mask)) == 0.0
    assert float(DispersionLoss(sign=-2.5).forward(h, mask)) == pytest.approx(-2.5 * ref, rel=1e-6)


def test_scale_invariant_per_token():
    h, mask = _batch(seed=3)
    scales = torch.rand(h.shape[0], h.shape[1], 1, dtype=torch.float64) * 10 + 0.1
    loss = PushAwayLoss()
    assert float(loss(h * scales, mask)) == pytest.approx(float(loss(h, mask)), rel=1e-9)


def test_padding_has_no_effect_value_or_gradient():
    h, mask = _batch(seed=1, pad_from=(7, 7, 7, 7))
    loss = PushAwayLoss()
    base = float(loss(h, mask))
    # append 5 pad positions with wild values to every row
    junk = torch.randn(h.shape[0], 5, h.shape[2], dtype=torch.float64) * 1e3
    hp = torch.cat([h, junk], 1).requires_grad_(True)
    mp = torch.cat([mask, torch.zeros(h.shape[0], 5, dtype=torch.long)], 1)
    val = loss(hp, mp)
    assert float(val.detach()) == pytest.approx(base, rel=1e-12)
    val.backward()
    assert torch.all(hp.grad[:, 7:] == 0)
    assert torch.isfinite(hp.grad).all() and hp.grad[:, :7].abs().sum() > 0
    # no mask at all = every position counts
    assert float(loss(h)) == pytest.approx(base, rel=1e-12)


def test_cross_domain_matches_explicit_loop():
    h, mask = _batch(seed=2)
    domain = torch.tensor([0, 1, 0, 1])
    A = _valid(h[[0, 2]], mask[[0, 2]])
    B = _valid(h[[1, 3]], mask[[1, 3]])
    loss = PushAwayLoss(mode="cross")
    d = loss.dispersion(h, mask, domain)
    assert float(d) == pytest.approx(_explicit_between(A, B), rel=1e-6)
    assert float(d) == pytest.approx(dispersion_between(A, B), rel=1e-6)
    assert float(loss(h, mask, domain)) == pytest.approx(-float(d))
    # ids need not be 0/1; three domains → mean over the three pairs
    dom3 = torch.tensor([5, 9, 7, 9])
    parts = {k: _valid(h[dom3 == k], mask[dom3 == k]) for k in (5, 7, 9)}
    ref = np.mean([_explicit_between(parts[a], parts[b])
                   for a, b in itertools.combinations((5, 7, 9), 2)])
    assert float(loss.dispersion(h, mask, dom3)) == pytest.approx(ref, rel=1e-6)


def test_cross_domain_degenerate_and_errors():
    h, mask = _batch()
    loss = PushAwayLoss(mode="cross")
    with pytest.raises(ConfigError, match="domain"):
        loss(h, mask)
    hh = h.clone().requires_grad_(True)
    z = loss(hh, mask, torch.zeros(4, dtype=torch.long))  # one domain only
    assert float(z) == 0.0 and loss.n_degenerate == 1
    z.backward()
    assert torch.all(hh.grad == 0)
    with pytest.raises(DataError):
        loss(h, mask, torch.tensor([0.0, 1.0, 0.0, 1.0]))
    with pytest.raises(DataError):
        loss(h, mask, torch.tensor([0, 1]))
    with pytest.raises(DataError):
        PushAwayLoss()(h, mask[:, :3])
    for bad in ({"mode": "pairs"}, {"lam": -1.0}, {"max_tokens": 1}):
        with pytest.raises(ConfigError):
            PushAwayLoss(**bad)
    with pytest.raises(ConfigError):
        make_aux_loss("repel")


def test_max_tokens_sample_is_seeded_and_resumable():
    h = torch.randn(2, 50, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full = float(PushAwayLoss()(h))
    a, b = PushAwayLoss(max_tokens=10, seed=3), PushAwayLoss(max_tokens=10, seed=3)
    va = [float(a(h)) for _ in range(3)]
    vb = [float(b(h)) for _ in range(3)]
    assert va == vb  # same seed → same sample sequence
    assert len(set(va)) == 3 and all(v != full for v in va)  # a new sample each call
    c = PushAwayLoss(max_tokens=10, seed=3)
    c.calls = 2  # restoring the counter restores the stream (resume)
    assert float(c(h)) == va[2]
    # the sampled value is the dispersion of some 10 of the 100 token states
    H = h.reshape(-1, 8).numpy()
    keep = torch.randperm(100, generator=PushAwayLoss(seed=3)._generator())[:10].numpy()
    assert va[0] == pytest.approx(-dispersion(H[keep]), rel=1e-9)
    assert float(PushAwayLoss(max_tokens=1000)(h)) == full


def _ids(lm, B=4, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, lm.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_forward_with_aux_uses_the_named_layer(tiny_dir, family):
    lm = make_tiny(tiny_dir, family)
    batch = _ids(lm)
    m = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = lm.hf_model(**batch, output_hidden_states=True,
                          labels=batch["input_ids"].masked_fill(~m, -100))
    for layer, hs in (("final", ref.hidden_states[-1]), ("1", ref.hidden_states[1])):
        with torch.no_grad():
            out = forward_with_aux(lm.hf_model, batch, PushAwayLoss(lam=0.5, layer=layer))
        d_ref = dispersion(hs[m].double())
        assert float(out.dispersion) == pytest.approx(float(d_ref), rel=1e-5)
        assert float(out.lm_loss) == pytest.approx(float(ref.loss), rel=1e-6)
        assert float(out.total) == pytest.approx(float(ref.loss) - 0.5 * float(d_ref), rel=1e-5)
    # a LanguageModel works too, and "last" is the last block before the final norm
    with torch.no_grad():
        out = PushAwayLoss(layer="last").compute(lm, batch)
    assert float(out.dispersion) != pytest.approx(float(dispersion(ref.hidden_states[-1][m].double())))
    with pytest.raises(ConfigError):
        forward_with_aux(lm.hf_model, batch, PushAwayLoss(layer="1-2"))


@pytest.mark.parametrize("kind", ["push-away", "squeeze"])
def test_gradient_moves_dispersion_the_intended_way(tiny_dir, kind):
    lm = make_tiny(tiny_dir)
    model = lm.hf_model
    model.train()
    batch = _ids(lm, B=4, T=16, seed=1)
    loss = make_aux_loss(kind, lam=1.0)

    def measure():
        with torch.no_grad():
            return float(forward_with_aux(model, batch, loss).dispersion)

    before = measure()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for i in range(8):
        out = forward_with_aux(model, batch, loss)
        out.total.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        opt.step()
        opt.zero_grad()
    after = measure()
    if kind == "push-away":
        assert after > before + 0.02
    else:
        assert after < before - 0.02


def test_lora_model_is_unwrapped(tiny_dir):
    peft = pytest.importorskip("peft")
    lm = make_tiny(tiny_dir)
    batch = _ids(lm)
    with torch.no_grad():
        plain = forward_with_aux(lm.hf_model, batch, PushAwayLoss())
    pm = peft.get_peft_model(lm.hf_model, peft.LoraConfig(r=2, target_modules="all-linear"))
    with torch.no_grad():
        wrapped = forward_with_aux(pm, batch, PushAwayLoss())
    # LoRA B starts at zero: same function, same numbers, through the PEFT wrapper
    assert float(wrapped.dispersion) == pytest.approx(float(plain.dispersion), rel=1e-6)
    assert float(wrapped.lm_loss) == pytest.approx(float(plain.lm_loss), rel=1e-6)

