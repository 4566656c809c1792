"""``lmgeom train`` end to end on a tiny random model (full and LoRA, within and cross), the
data schedule, and resuming from a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from lmgeom.errors import ConfigError
from lmgeom.experiments.finetune import (
    Domain,
    FinetuneConfig,
    batch_arrays,
    domain_schedule,
)
from lmgeom.texts import as_textset


def test_schedule_split_and_config_checks():
    # the held-out split: TextSet.split with its own stream (tests/test_schedule.py)
    ts = as_textset([f"text {i}" for i in range(50)])
    tr, ho = ts.split(0.1, seed=3, stream=0x5EED)
    assert len(ho) == 5 and not set(tr.ids) & set(ho.ids) and len(tr) + len(ho) == 50
    doms = [Domain("a", 0, np.arange(10 * 3).reshape(10, 3), np.zeros((1, 3)), 9, 1),
            Domain("b", 1, 100 + np.arange(6 * 3).reshape(6, 3), np.zeros((1, 3)), 5, 1)]
    s1, s2 = domain_schedule(doms, 4, seed=0), domain_schedule(doms, 4, seed=0)
    ids, dom = batch_arrays(s1, doms, 7)
    assert np.array_equal(ids, batch_arrays(s2, doms, 7)[0])  # pure in (seed, step)
    assert list(dom) == [0, 0, 1, 1]
    assert (ids[:2] < 100).all() and (ids[2:] >= 100).all()  # each domain's own chunks
    # one epoch of domain a (5 steps x 2 chunks) uses each of its 10 chunks once
    seen = np.concatenate([s1.indices(s)[0] for s in range(5)])
    assert sorted(seen) == list(range(10))
    assert not np.array_equal(batch_arrays(domain_schedule(doms, 4, seed=1), doms, 0)[0],
                              batch_arrays(s1, doms, 0)[0])
    for bad in ({"aux_mode": "cross"}, {"texts": ("a", "b"), "batch_size": 5}, {"arms": ("repel",)},
                {"method": "qlora"}, {"lam": -1.0}, {"steps": 0}):
        with pytest.raises(ConfigError):
            FinetuneConfig(**bad)
    assert FinetuneConfig(method="full").learning_rate == 5e-5
    assert FinetuneConfig().eval_steps == [0, 50, 100, 150, 200]


def test_chunk_ci_is_the_documented_bootstrap():
    """Perplexity CI = exp of the percentile interval of sum(NLL)/sum(tokens) over chunks
    resampled with default_rng(seed).integers(0, n, n), checked against an explicit loop."""
    from lmgeom.metrics.uncertainty import chunk_ci

    rng = np.random.default_rng(3)
    ntok = rng.integers(50, 128, 40).astype(float)
    nll = ntok * rng.uniform(2.5, 3.5, 40)
    disp = rng.uniform(0.3, 0.6, 40)
    got = chunk_ci(nll, ntok, disp, seed=7, n_boot=500)
    r = np.random.default_rng(7)
    reps = []
    for _ in range(500):
        idx = r.integers(0, 40, size=40)
        reps.append(nll[idx].sum() / ntok[idx].sum())
    lo, hi = np.percentile(reps, [2.5, 97.5])
    np.testing.assert_allclose(got["nll"], [lo, hi], rtol=1e-12)
    np.testing.assert_allclose(got["perplexity"], np.exp([lo, hi]), rtol=1e-12)
    assert got["dispersion"][0] < disp.mean() < got["dispersion"][1]
    same = chunk_ci(np.full(10, 30.0), np.full(10, 10.0), np.full(10, 0.5))
    np.testing.assert_allclose(same["perplexity"], [np.exp(3.0)] * 2)
    assert np.isnan(chunk_ci([1.0], [1.0], [0.5])["perplexity"]).all()

