"""The data order of training: :meth:`TextSet.split` (the one train / held-out splitter),
:class:`~lmgeom.training.schedule.BatchSchedule` (the one batch scheduler) and the one training
loop's hooks (:func:`~lmgeom.training.loop.train_loop`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmgeom.errors import ConfigError, DataError, TextsError
from lmgeom.texts import as_textset
from lmgeom.training.loop import train_loop
from lmgeom.training.schedule import BatchSchedule


def _texts(n: int):
    return as_textset([f"text number {i}" for i in range(n)])


# ------------------------------------------------------------------------------ TextSet.split


@pytest.mark.parametrize(("n", "fraction", "k"), [(50, 0.1, 5), (10, 0.25, 2), (3, 0.01, 1),
                                                  (3, 0.99, 2), (2, 0.5, 1), (101, 0.5, 50)])
def test_split_is_disjoint_covers_all_and_respects_the_fraction(n, fraction, k):
    ts = _texts(n)
    train, held = ts.split(fraction, seed=3)
    assert len(held) == k and len(train) == n - k  # round(f·n), clamped to [1, n-1]
    assert not set(train.ids) & set(held.ids)
    assert sorted(train.ids + held.ids, key=int) == list(ts.ids)
    # both parts keep the set's order
    assert list(train.ids) == sorted(train.ids, key=int)
    assert list(held.ids) == sorted(held.ids, key=int)


def test_split_is_deterministic_and_seeded():
    ts = _texts(200)
    a, b = ts.split(0.2, seed=7), ts.split(0.2, seed=7)
    assert a[0].ids == b[0].ids and a[1].ids == b[1].ids
    assert ts.split(0.2, seed=8)[1].ids != a[1].ids
    assert ts.split(0.2, seed=7, stream=1)[1].ids != a[1].ids
    # the documented rule: the first k of default_rng(seed).permutation(N) are held out
    perm = np.random.default_rng(7).permutation(200)
    assert [int(i) for i in a[1].ids] == sorted(perm[:40].tolist())
    perm = np.random.default_rng([7, 0x5EED]).permutation(200)
    assert [int(i) for i in ts.split(0.2, 7, stream=0x5EED)[1].ids] == sorted(perm[:40].tolist())


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_split_fraction_outside_the_open_interval_is_refused(fraction):
    with pytest.raises(ConfigError, match=r"held-out fraction must be in \(0, 1\)"):
        _texts(10).split(fraction, seed=0)


def test_split_needs_two_texts_and_a_valid_seed():
    with pytest.raises(TextsError, match="at least 2"):
        _texts(1).split(0.5, seed=0)
    with pytest.raises(ConfigError, match="seed"):
        _texts(5).split(0.5, seed=-1)
    with pytest.raises(ConfigError, match="stream"):
        _texts(5).split(0.5, seed=0, stream=1.5)


# ------------------------------------------------------------------------------ BatchSchedule


def test_schedule_is_deterministic_from_the_seed():
    a, b = BatchSchedule([37, 11], 3, seed=5), BatchSchedule([37, 11], 3, seed=5)
    for s in (0, 1, 4, 12, 40, 99):
        assert all(np.array_equal(x, y) for x, y in zip(a.indices(s), b.indices(s)))
    other = BatchSchedule([37, 11], 3, seed=6)
    assert not np.array_equal(other.indices(0)[0], a.indices(0)[0])
    # the documented stream: default_rng([seed, stream, epoch]).permutation(n)
    one = BatchSchedule([20], 4, seed=9, streams=(2,))
    perm = np.random.default_rng([9, 2, 1]).permutation(20)
    assert one.batch(5).tolist() == perm[0:4].tolist()  # step 5 = positions 20..23 = epoch 1


def test_schedule_is_resumable_at_any_step():
    """A fresh schedule asked for step s (no history) gives what an uninterrupted one gave."""
    ref = BatchSchedule([13, 7], 2, seed=1)
    want = [ref.indices(s) for s in range(60)]
    for s in (0, 3, 6, 7, 31, 59):
        fresh = BatchSchedule([13, 7], 2, seed=1)
        got = [fresh.indices(t) for t in range(s, 60)]
        assert all(np.array_equal(x, y) for g, w in zip(got, want[s:]) for x, y in zip(g, w))


def test_each_epoch_is_a_permutation_of_each_pool():
    sched = BatchSchedule([12, 8], 4, seed=0)
    stream = [np.concatenate([sched.indices(s)[k] for s in range(12)]) for k in range(2)]
    for k, n in enumerate((12, 8)):
        epochs = stream[k][: len(stream[k]) // n * n].reshape(-1, n)
        assert len(epochs) >= 4
        for e in epochs:
            assert sorted(e.tolist()) == list(range(n))
        assert not all(np.array_equal(epochs[0], e) for e in epochs[1:])  # reshuffled
    assert sched.epochs(6) == pytest.approx(2.0)  # passes over the largest pool
    # a batch that straddles an epoch boundary: step 2 of 10 items x 4 = positions 8..11
    ten = BatchSchedule([10], 4, seed=3)
    e0, e1 = (np.random.default_rng([3, 0, e]).permutation(10) for e in (0, 1))
    assert ten.batch(2).tolist() == [*e0[8:10].tolist(), *e1[0:2].tolist()]


def test_schedule_refuses_empty_pools():
    with pytest.raises(DataError):
        BatchSchedule([0], 2, seed=0)
    with pytest.raises(DataError):
        BatchSchedule([], 2, seed=0)
    with pytest.raises(ValueError):
        BatchSchedule([5, 5], 1, seed=0).batch(0)  # one pool only


# ------------------------------------------------------------------------------ the loop's hooks


def _quadratic():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([3.0, -2.0]))
    opt = torch.optim.SGD([w], lr=0.1)

    def objective(model, batch):
        loss = ((w - batch["target"]) ** 2).sum()
        return {"total": loss, "lm_loss": loss}

    return w, opt, objective


def test_hooks_run_after_each_step_and_can_stop():
    w, opt, objective = _quadratic()
    seen, monitored = [], []

    class Monitor:
        def step(self, step):
            monitored.append((step, w.detach().clone()))

    def hook(step, entry):
        seen.append((step, entry["step"], entry["lm_loss"], w.detach().clone()))
        return step == 3

    ran = train_loop(None, opt, [w], start=0, steps=10,
                     batch_at=lambda s: {"target": torch.zeros(2)}, lr_at=lambda s: 0.1,
                     objective=objective, hooks=[hook, Monitor()])
    assert ran == 3 and [s for s, *_ in seen] == [1, 2, 3] and [s for s, _ in monitored] == [1, 2, 3]
    # after the optimiser step: the weights a hook sees are already updated (w <- 0.8 w)
    np.testing.assert_allclose(seen[0][3].numpy(), [2.4, -1.6], rtol=1e-6)
    assert seen[0][2] == pytest.approx(13.0)  # the loss of the step, before the update
    assert torch.equal(monitored[2][1], seen[2][3])
    # an object hook only observes: rows returned by .step (GeometryMonitor.step) never stop
    class Rows:
        def step(self, step):
            return [{"metric": "pga_z", "value": 1.0}]

    assert train_loop(None, opt, [w], start=0, steps=4,
                      batch_at=lambda s: {"target": torch.zeros(2)}, lr_at=lambda s: 0.1,
                      objective=objective, hooks=[Rows()]) == 4


def test_a_non_finite_loss_stops_before_touching_the_weights():
    w, opt, objective = _quadratic()
    before = w.detach().clone()
    with pytest.raises(ConfigError, match="non-finite.*step 1; lower --lr"):
        train_loop(None, opt, [w], start=0, steps=2,
                   batch_at=lambda s: {"target": torch.tensor([float("inf"), 0.0])},
                   lr_at=lambda s: 0.1, objective=objective)
    assert torch.equal(w.detach(), before)
