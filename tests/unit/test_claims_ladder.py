"""``lmgeom claims --n-ladder`` (issue 34): the PGA claims decided at several n in one run.

* the rungs are nested, label-balanced, seeded subsets of the texts;
* ``Activations.subset`` gives the states a forward pass over only those texts would give;
* the growth of |z| with n is measured from the rungs (a planted n^0.5 comes back);
* a verdict that differs between the two largest n is ``unstable``; ``underpowered`` becoming
  decided is not a change;
* on the bundled model: one forward pass, every rung's verdicts in ``claims_ladder.parquet``,
  the rungs' states sliced (no second extraction), and bad ladders refused before any work.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmgeom.cli import main
from lmgeom.errors import ConfigError
from lmgeom.metrics.claims import (
    CONTRADICTED,
    SUPPORTED,
    UNDERPOWERED,
    UNSTABLE,
    ClaimVerdict,
    ModelInfo,
    Power,
    mark_unstable,
    z_call,
)
from lmgeom.metrics.claims_profile import ladder_powers
from lmgeom.results import table
from lmgeom.texts import nested_sample_indices, sample_indices

M = ModelInfo("m", d=576, family="llama", tuned="instruct", n_layers=8)


def test_rungs_are_nested_balanced_and_seeded():
    labels = ["a"] * 40 + ["b"] * 100 + ["c"] * 116
    got = nested_sample_indices(256, [64, 128, 256, 32], labels=labels, seed=3)
    assert sorted(got) == [32, 64, 128, 256]
    assert got[256].tolist() == list(range(256))
    for small, big in ((32, 64), (64, 128), (128, 256)):
        assert set(got[small]) < set(got[big])
        assert len(got[small]) == small and np.all(np.diff(got[small]) > 0)
    for m in (32, 64, 128):  # balanced as sample_indices balances: the same label counts
        lab = np.asarray(labels)
        want = np.unique(lab[sample_indices(256, m, labels=labels, seed=3)], return_counts=True)
        have = np.unique(lab[got[m]], return_counts=True)
        assert np.abs(want[1] - have[1]).max() <= 1, (m, want, have)
    again = nested_sample_indices(256, [64, 128], labels=labels, seed=3)
    assert all(np.array_equal(again[m], got[m]) for m in (64, 128))
    other = nested_sample_indices(256, [64], labels=labels, seed=4)
    assert not np.array_equal(other[64], got[64])


def test_an_activation_subset_is_what_extracting_the_subset_gives(tiny_dir):
    from lmgeom.activations import extract
    from lmgeom.models import load_model
    from lmgeom.texts import as_textset

    model = load_model(str(tiny_dir("llama")))
    texts = as_textset([f"text number {i} " + "word " * (i % 5) for i in range(12)])
    idx = np.array([1, 4, 5, 9])
    for pooling in ("last", "mean", "tokens"):
        full = extract(model, texts, pooling=pooling, batch_size=4, cache=False, progress=False)
        part = texts.subset(idx)
        alone = extract(model, part, pooling=pooling, batch_size=4, cache=False, progress=False)
        sub = full.subset(idx, texts_hash=part.hash)
        assert sub.texts_hash == alone.texts_hash and sub.text_ids == alone.text_ids
        assert sub.states.shape == alone.states.shape, pooling
        if pooling != "tokens":  # the sampled token rows are drawn per set
            np.testing.assert_allclose(sub.states, alone.states, rtol=1e-4, atol=1e-5)
        else:
            assert set(sub.row_text.tolist()) == set(range(len(idx)))
    with pytest.raises(ConfigError):
        full.subset([3, 1], texts_hash="x")


def _table(model: str, z_by_layer: np.ndarray, n: int) -> list[dict]:
    rows = []
    for i, z in enumerate(z_by_layer):
        common = dict(model=model, layer=str(i), layer_index=i, depth=i / len(z_by_layer))
        rows += [table.row(metric="pga_z", value=float(z), setting="ccr=1", **common),
                 table.row(metric="pc1_share", value=0.01, n=n, **common)]
    return rows


def test_the_growth_of_z_is_measured_from_the_rungs():
    base = np.array([5.0, -8.0, 12.0, 6.5, 0.3, -1.0])  # three |z| >= 4 layers carry the fit
    tables = {n: table.frame(_table("m", base * (n / 256) ** 0.5, n)) for n in (64, 128, 256)}
    powers = ladder_powers(tables, [M])
    assert set(powers) == {64, 128, 256}
    p = powers[128]["m"]
    assert p.n == 128 and math.isclose(p.growth, 0.5, rel_tol=1e-6)
    assert "measured" in p.source
    # too few layers with a clear effect: the model keeps the assumed growth (no entry)
    weak = {n: table.frame(_table("m", np.array([1.0, 2.0, 5.0]) * (n / 256) ** 0.5, n))
            for n in (64, 256)}
    assert ladder_powers(weak, [M]) == {64: {}, 256: {}}


def _v(claim: str, verdict: str, reason: str = "r") -> ClaimVerdict:
    return ClaimVerdict(claim=claim, statement="s", verdict=verdict, reason=reason)


def test_a_verdict_that_changes_between_the_two_largest_n_is_unstable():
    top = [_v("P2", SUPPORTED, "zone 4-6"), _v("P3", SUPPORTED), _v("P5", CONTRADICTED),
           _v("P7", SUPPORTED)]
    lower = [_v("P2", CONTRADICTED, "no zone"), _v("P3", UNDERPOWERED), _v("P5", CONTRADICTED)]
    got = {v.claim: v for v in mark_unstable(top, lower, n_top=256, n_lower=128)}
    assert got["P2"].verdict == UNSTABLE
    assert "supported at n = 256 but contradicted at n = 128" in got["P2"].reason
    assert got["P2"].details["verdict_at_n"] == {256: SUPPORTED, 128: CONTRADICTED}
    assert got["P3"].verdict == SUPPORTED  # underpowered → decided: what more texts are for
    assert got["P5"].verdict == CONTRADICTED  # the same at both
    assert got["P7"].verdict == SUPPORTED  # no smaller-n verdict to compare with
    decided_then_not = mark_unstable([_v("P2", UNDERPOWERED)], [_v("P2", SUPPORTED)],
                                     n_top=256, n_lower=128)
    assert decided_then_not[0].verdict == UNSTABLE


def test_bad_ladders_are_refused_before_any_work(tmp_path, capsys):
    for args, needle in ((["--n-ladder", "64"], "two or more"),
                         (["--n-ladder", "4,64"], "at least 8"),
                         (["--n-ladder", "64,x"], "two or more"),
                         (["--n", "100", "--n-ladder", "32,64"], "largest n is the run's n"),
                         (["--n-ladder", "24,64", "--k", "40"], "")):
        out = tmp_path / "never"
        rc = main(["claims", "--model", "smollm2-135m", *args, "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2, (args, err)
        assert needle in err and "Traceback" not in err, err
        assert not out.exists()



def test_an_n_on_its_own_loads_the_texts_of_its_rung():
    """``within`` (what ``claims`` sets: 256): the n texts are the nested subset of the seeded
    sample of 256, so ``--n 24`` and ``--n 48`` load exactly the texts of the 24 and 48 rungs of
    a ladder topped at 48 or at 256; the 256 sample itself is the plain seeded sample (the
    n = 256 results do not move); without ``within`` the ladder is as before."""
    from dataclasses import replace

    from lmgeom.experiments import TextOptions
    from lmgeom.experiments.claims import ClaimsConfig

    opts = TextOptions(n=48, seed=0, within=256)
    ts48, ts24 = opts.load(), replace(opts, n=24).load()
    assert len(ts48) == 48 and len(ts24) == 24 and set(ts24.ids) < set(ts48.ids)
    assert ts48.subset(opts.nested_picks(ts48, [24])[24]).ids == ts24.ids
    top = replace(opts, n=256)
    ts256 = top.load()
    assert ts256.ids == TextOptions(n=256, seed=0).load().ids
    picks = top.nested_picks(ts256, [24, 48])
    assert ts256.subset(picks[24]).ids == ts24.ids and ts256.subset(picks[48]).ids == ts48.ids
    plain = TextOptions(n=256, seed=0)
    got = plain.nested_picks(ts256, [24, 48])
    want = nested_sample_indices(256, [24, 48], labels=ts256.labels, seed=0)
    assert all(np.array_equal(got[m], want[m]) for m in (24, 48))
    assert ClaimsConfig(models=("smollm2-135m",), texts=TextOptions(n=64)).texts.within == 256
    assert ClaimsConfig(models=("smollm2-135m",), texts=TextOptions(n=512)).texts.within == 512


def test_the_decision_at_n_does_not_depend_on_a_measured_growth():
    """Whether an effect of the papers' size is visible at n uses the assumed growth, so a
    rung whose ladder measured a steep growth decides as the same n run on its own does; the
    measured growth only moves the "needs n" figure."""
    assumed = Power(64)
    steep = Power(64, growth=1.0, source="measured on this run's n-ladder")
    for z in (-6.0, -2.2, 0.5, 3.5):
        a, b = z_call(z, -2.0, 2.0, "<", assumed), z_call(z, -2.0, 2.0, "<", steep)
        assert a[0] == b[0], (z, a, b)
    assert steep.n_to_clear(2.5, 2.0) != assumed.n_to_clear(2.5, 2.0)
