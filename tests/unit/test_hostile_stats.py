"""Hostile sample sizes (issue 26): no statistically empty number without a warning.

Every case either refuses with a typed error that names the value (and the fix), or computes
the number, raises a :class:`~lmgeom.errors.LowSampleWarning` and sets the flag in the result
and in the tidy table's ``flag`` column. Plus: ``analyze`` skips the optional probes when the
classes are too small, identical last tokens are named as the cause, and a sweep with a failed
job exits 1 without retrying a user error. Small random arrays and the tiny models of
``conftest.py`` only.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from support.hostile_stats import data, make_texts, tiny  # noqa: F401 (fixtures)

from lmgeom import metrics as M
from lmgeom.errors import ConfigError, DataError, LmgeomError, LowSampleWarning, ModelError
from lmgeom.metrics import sample_size as S


def _no_low_sample_warning(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LowSampleWarning)
        return fn(*args, **kw)


@pytest.mark.parametrize("n_null", [0, 1])
def test_n_null_below_hard_minimum_is_refused(n_null):
    X, V = data()
    with pytest.raises(ConfigError, match=f"n_null must be >= 2; got {n_null}"):
        M.subspace_pga(X, V, n_null=n_null)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_rows_below_hard_minimum_are_refused(n):
    X, V = data()
    with pytest.raises(DataError, match=f"X has {n} rows; at least 4"):
        M.subspace_pga(X[:n], V, n_null=20)


@pytest.mark.parametrize("pairs", [1, 3, 9])
def test_sampled_pairs_below_hard_minimum_are_refused(pairs):
    X, V = data()
    with pytest.raises(ConfigError, match=rf"pairs={pairs}: .*fewer than 10 .*pairs >= 1000"):
        M.subspace_pga(X, V, n_null=20, pairs=pairs)
    with pytest.raises(ConfigError, match=rf"^layer 7: pairs={pairs}"):
        M.subspace_pga_levels(X, V, ccr=(0, 1), n_null=20, pairs=pairs, label="layer 7")


@pytest.mark.parametrize("pairs", [0, 3, 9])
def test_layer_sweep_refuses_few_pairs_before_any_work(pairs):
    from lmgeom.experiments.layer_sweep import LayerSweepConfig

    with pytest.raises(ConfigError, match=rf"pairs={pairs}: .*--pairs 1000 or more"):
        LayerSweepConfig(pairs=pairs)
    assert LayerSweepConfig(pairs=10).pairs == 10


def test_identical_rows_name_the_same_last_token():
    X, V = data()
    with pytest.raises(DataError, match="identical texts.*same token.*pooling='mean'"):
        M.subspace_pga(np.tile(X[:1], (30, 1)), V, n_null=20)


@pytest.mark.parametrize("distinct,ccr", [(2, 1), (3, 2), (3, 5), (4, 3)])
def test_ccr_beyond_few_distinct_rows_names_them(distinct, ccr):
    """Few distinct states (texts ending in the same few tokens) and a CCR level that removes
    everything they span: the error says so, not just "use a smaller ccr"."""
    X, V = data()
    Xd = np.repeat(X[:distinct], 20, axis=0)
    pat = (rf"^layer 0: only {distinct} distinct states among {20 * distinct} rows "
           r"\(does every text end in the same token\?\).*CCR-\d+.*--pooling mean")
    with pytest.raises(DataError, match=pat):
        M.subspace_pga(Xd, V, ccr=ccr, n_null=20, label="layer 0")


def test_low_rank_with_distinct_rows_keeps_the_ccr_message():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 2)) @ rng.standard_normal((2, 12))
    V = np.linalg.qr(rng.standard_normal((12, 3)))[0]
    with pytest.raises(ConfigError, match="numerical rank 2 .* use a smaller ccr"):
        M.subspace_pga(X, V, ccr=2, n_null=20)


@pytest.mark.parametrize("n", [4, 5, 7, 9])
def test_few_rows_warn_and_flag(n):
    X, V = data(d=30, k=2)
    with pytest.warns(LowSampleWarning, match=rf"only n={n} rows"):
        r = M.subspace_pga(X[:n], V, n_null=20, ccr=0)
    assert "low_n" in r.flags and r.n == n and np.isfinite(r.z)


@pytest.mark.parametrize("pairs", [10, 50, 400, 850])
def test_few_sampled_pairs_warn_and_flag(pairs):
    X, V = data()
    with pytest.warns(LowSampleWarning, match=rf"{pairs} sampled pairs of 7140"):
        r = M.subspace_pga(X, V, n_null=20, pairs=pairs)
    assert r.flags == ("low_pairs",) and not r.exact and r.pairs == pairs


def test_almost_every_pair_is_not_a_small_sample():
    """990 of 1000 pairs: the sampling error is that of a nearly full census (not flagged)."""
    X, V = data(n=46)  # 1035 pairs
    r = _no_low_sample_warning(M.subspace_pga, X, V, n_null=20, pairs=1030)
    assert not r.exact and r.flags == ()


@pytest.mark.parametrize("n,k", [(10, 9), (12, 11), (15, 20)])
def test_k_at_or_above_the_rank_of_few_rows_warns(n, k):
    X, V = data(n=n, d=32, k=k)
    with pytest.warns(LowSampleWarning, match=rf"k={k} >= {n - 1}, the rank of the states"):
        r = M.subspace_pga(X, V, n_null=20, ccr=0)
    assert r.flags == ("k_rank",)


def test_k_above_the_rank_of_low_rank_data_warns():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 3)) @ rng.standard_normal((3, 30)) + rng.standard_normal(30)
    V = np.linalg.qr(rng.standard_normal((30, 4)))[0]
    with pytest.warns(LowSampleWarning, match=r"k=4 >= 3, the numerical rank .*span only 3"):
        r = M.subspace_pga(X, V, n_null=20, ccr=0)
    assert r.flags == ("k_rank",)


def test_ccr_leaving_too_little_rank_flags_that_level_only():
    X, V = data(n=14, d=30, k=6)  # centred rank 13
    with pytest.warns(LowSampleWarning, match=r"CCR-8 leaves rank 5 of the centred states' 13"):
        res = M.subspace_pga_levels(X, V, ccr=(0, 5, 8), n_null=20)
    assert [res[m].flags for m in (0, 5, 8)] == [(), (), ("k_rank",)]
    assert "use a ccr below 7" in res[8].warnings[0]


def test_few_distinct_states_warn_and_flag():
    X, V = data(k=2)
    Xd = np.repeat(X[:6], 10, axis=0)
    with pytest.warns(LowSampleWarning, match=r"only 6 distinct states among 60 rows") as rec:
        r = M.subspace_pga(Xd, V, n_null=20, ccr=1, label="layer 0")
    assert r.flags == ("few_distinct",) and r.n_unique == 6
    assert all(str(w.message).startswith("layer 0: ") for w in rec)


def test_levels_emit_a_shared_message_once_and_warn_false_is_silent():
    X, V = data()
    with pytest.warns(LowSampleWarning) as rec:
        res = M.subspace_pga_levels(X, V, ccr=(0, 1, 5), n_null=5)
    assert len([w for w in rec if issubclass(w.category, LowSampleWarning)]) == 1
    assert all(r.flags == ("low_null",) for r in res.values())
    quiet = _no_low_sample_warning(M.subspace_pga_levels, X, V, ccr=(0, 1), n_null=5,
                                   warn=False)
    assert quiet[1].flags == ("low_null",) and quiet[1].z == res[1].z


def test_several_flags_at_once_in_canonical_order():
    X, V = data(n=8, d=30, k=8)
    with pytest.warns(LowSampleWarning):
        r = M.subspace_pga(X, V, n_null=4, ccr=0, pairs=20)
    assert r.flags == ("low_n", "low_null", "low_pairs", "k_rank")
    assert r.flag == "low_n;low_null;low_pairs;k_rank" == S.join_flags(reversed(r.flags))
    assert S.split_flags(r.flag) == r.flags and S.split_flags("") == () == S.split_flags(None)


def test_ordinary_input_has_no_flag_and_no_warning():
    X, V = data()
    r = _no_low_sample_warning(M.subspace_pga, X, V, n_null=20, ccr=1)
    assert r.flags == () and r.warnings == () and r.flag == "" and not r.low_sample
    lv = _no_low_sample_warning(M.subspace_pga_levels, X, V, ccr=(0, 1, 5, 10), n_null=20,
                                pairs=2000)
    assert all(x.flags == () for x in lv.values())


def test_documented_minimums():
    assert (S.MIN_ROWS_HARD, S.MIN_ROWS, S.MIN_NULL_HARD, S.MIN_NULL) == (4, 10, 2, 20)
    assert (S.MIN_PAIRS_HARD, S.MIN_PAIRS) == (10, 1000)
    assert set(S.FLAG_CODES) == {"low_n", "few_distinct", "low_null", "low_pairs", "k_rank",
                                 "few_points", "few_tokens", "small_class", "small_quantile"}
    assert (S.MIN_QUANTILE_TEXTS, S.MIN_EVAL_TOKENS, S.MIN_PROBE_CLASS) == (5, 1000, 10)
    assert S.MIN_CORR_POINTS == 10 and "10" in S.describe_flag("few_points")
    assert "10" in S.describe_flag("low_n") and S.describe_flag("zzz") == "zzz"


def _pair(n: int = 80):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((n, 20))
    B = A @ rng.standard_normal((20, 24)) + 0.1 * rng.standard_normal((n, 24))
    Va = np.linalg.qr(rng.standard_normal((20, 4)))[0]
    Vb = np.linalg.qr(rng.standard_normal((24, 5)))[0]
    return A, B, Va, Vb


@pytest.mark.parametrize("kw,flags,match", [
    ({"n_null": 5}, ("low_null",), r"n_null=5 null draws"),
    ({"pairs": 200}, ("low_pairs",), r"200 sampled pairs of 3160"),
    ({"rows": 7}, ("low_n",), r"only n=7 rows"),
])
def test_cross_model_alignment_warns_and_flags(kw, flags, match):
    A, B, Va, Vb = _pair()
    n = kw.pop("rows", len(A))
    with pytest.warns(LowSampleWarning, match=match):
        r = M.cross_model_alignment(A[:n], B[:n], Va[:, :2] if n < 10 else Va,
                                    Vb[:, :2] if n < 10 else Vb, **{"n_null": 20, **kw})
    assert r.flags == flags and r.to_dict()["flags"] == ";".join(flags)


def test_cross_model_alignment_k_rank_names_the_model_and_refuses_few_pairs():
    A, B, Va, Vb = _pair()
    low = np.random.default_rng(0).standard_normal((80, 3)) @ np.random.default_rng(1) \
        .standard_normal((3, 24))
    with pytest.warns(LowSampleWarning, match=r"^model B: k=5 >= 2"):
        r = M.cross_model_alignment(A, low, Va, Vb, n_null=20, ccr=1)
    assert r.flags == ("k_rank",)
    ok = _no_low_sample_warning(M.cross_model_alignment, A, B, Va, Vb, n_null=20)
    assert ok.flags == () and ok.flag == ""
    with pytest.raises(ConfigError, match="pairs=5: "):
        M.cross_model_alignment(A, B, Va, Vb, n_null=20, pairs=5)


def test_layer_rows_carry_the_flag_into_the_table(tmp_path):
    from lmgeom.experiments.layer_sweep import LayerSweepConfig, layer_metrics
    from lmgeom.results import table

    X, V = data(n=8, d=30, k=6)
    cfg = LayerSweepConfig(k=6, n_null=5, ccr=(0, 1))
    with pytest.warns(LowSampleWarning, match=r"^layer 3: "):
        rows = layer_metrics(X, V, cfg, "3")
    df = table.frame(table.row(model="m", layer="3", layer_index=3, **r) for r in rows)
    assert tuple(df.columns) == table.COLUMNS
    z = df[df.metric == "pga_z"].set_index("setting")["flag"]
    # 8 rows: centred rank 7 > k = 6; after CCR-1 rank 6 = k
    assert z["ccr=0"] == "low_n;low_null" and z["ccr=1"] == "low_n;low_null;k_rank"
    # the rows' own flag (few texts) also marks the layer's PC1 / spectral rows
    assert set(df[df.metric == "rankme"]["flag"]) == {"low_n"}
    paths = table.write_table(df, tmp_path, "t")
    for p in paths:
        back = table.read_table(p)
        assert list(back["flag"]) == list(df["flag"]), p.suffix
    # a table written before the column existed reads with flag ""
    old = df.drop(columns="flag")
    old.to_parquet(tmp_path / "old.parquet")
    assert set(table.read_table(tmp_path / "old.parquet")["flag"]) == {""}
    assert table.frame([{k: v for k, v in table.row(model="m", metric="x", value=1.0).items()
                         if k != "flag"}])["flag"].tolist() == [""]


def test_ordinary_layer_rows_have_an_empty_flag():
    from lmgeom.experiments.layer_sweep import LayerSweepConfig, layer_rows

    X, V = data(n=120, d=30, k=6)
    rows, notes = _no_low_sample_warning(layer_rows, X, V,
                                         LayerSweepConfig(k=6, n_null=20, ccr=(1,)), "1")
    assert notes == [] and all(r.get("flag", "") == "" for r in rows)


def test_layer_span():
    from lmgeom.experiments.layer_sweep import layer_span

    assert layer_span(["0", "1", "2", "3", "5", "final"]) == "0-3, 5, final"
    assert layer_span(["4"]) == "4" and layer_span([]) == ""


@pytest.mark.parametrize("counts,folds,need", [
    ((3, 3, 3, 3, 4), 5, 25),   # analyze --n 16 on five balanced domains
    ((1, 1), 5, 10),
    ((10, 2), 5, 30),           # unbalanced: in proportion to the rarest class
    ((4, 4, 4), 5, 15),
])
def test_probe_skip_reason_names_enough_texts(counts, folds, need):
    from lmgeom.experiments.probes import probe_skip_reason

    y = np.repeat([f"c{i}" for i in range(len(counts))], counts)
    why = probe_skip_reason(y, folds=folds)
    assert why is not None and why.startswith("linear probes skipped")
    assert f"--n {need} or more" in why and f"folds={folds}" in why


def test_probe_skip_reason_single_class_and_enough():
    from lmgeom.experiments.probes import probe_skip_reason

    assert "single label ('a')" in probe_skip_reason(np.array(["a"] * 30))
    assert probe_skip_reason(np.repeat(["a", "b"], 5), folds=5) is None


def test_cli_every_text_ends_in_the_same_token(tiny, tmp_path, capsys):
    """Last-token states at the embedding layer are identical: the error says why."""
    from lmgeom.cli import main

    p = tmp_path / "same_end.txt"
    p.write_text("\n".join(make_texts(24, end=" end.")) + "\n")
    rc = main(["pga", "--model", tiny, "--texts", str(p), "--k", "4", "--layers", "0",
               "--n-null", "20", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "layer 0:" in err and "same token" in err and "--pooling mean" in err
    # three distinct endings and CCR-5: "only 3 distinct states", not "use a smaller ccr"
    p3 = tmp_path / "three_end.txt"
    p3.write_text("\n".join(t + [" cat", " dog", " fish"][i % 3]
                            for i, t in enumerate(make_texts(24, end=""))) + "\n")
    rc = main(["pga", "--model", tiny, "--texts", str(p3), "--k", "4", "--layers", "0",
               "--ccr", "5", "--n-null", "20", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "layer 0: only 3 distinct states among 24 rows" in err, err
    assert "smaller ccr" not in err
    # with CCR-1 it computes, warns and flags (few_distinct, k_rank)
    with pytest.warns(LowSampleWarning, match="only 3 distinct states among 24 rows"):
        rc = main(["pga", "--model", tiny, "--texts", str(p3), "--k", "4", "--layers", "0",
                   "--ccr", "1", "--n-null", "20", "--quiet", "--csv", str(tmp_path / "z.csv")])
    assert rc == 0
    assert "few_distinct;k_rank" in capsys.readouterr().out
    got = pd.read_csv(tmp_path / "z.csv", keep_default_na=False)
    assert set(got[got.metric == "pga_z"].flag) == {"few_distinct;k_rank"}


def _raise(kind: str, marker: list) -> int:
    marker.append(kind)
    if kind == "model":
        raise ModelError("model path /nowhere does not exist")
    if kind == "custom":
        raise _LateUserError("bad option defined elsewhere")
    if kind == "oserror":
        raise OSError("connection reset by peer")
    raise RuntimeError("worker crashed")


class _LateUserError(LmgeomError):
    """A user error class defined outside lmgeom.errors (still never retried)."""


@pytest.mark.parametrize("kind,attempts", [("model", 1), ("custom", 1), ("runtime", 3),
                                           ("oserror", 3)])
def test_local_engine_retries_infrastructure_failures_only(kind, attempts):
    from lmgeom.engines.base import EngineConfig, retryable
    from lmgeom.engines.local import LocalEngine

    tried: list = []
    out = LocalEngine(EngineConfig(retries=2)).map(_raise, [((kind, tried), {})])
    assert len(tried) == attempts and out[0].attempts == attempts and not out[0].ok
    assert retryable(out[0].error_type) == (attempts > 1)


def test_retryable_by_name_for_returned_failures():
    from lmgeom.engines.base import retryable

    for name in ("ConfigError", "TextsError", "DataError", "ModelError", "CacheError",
                 "LmgeomError", "_LateUserError"):
        assert not retryable(name), name
    for name in ("RuntimeError", "OSError", "MemoryError", "WorkerCrashedError", None):
        assert retryable(name), name


def test_sweep_with_a_missing_model_exits_1_keeps_rows_and_tries_once(tiny, tmp_path, capsys):
    from lmgeom.cli import main

    p = tmp_path / "t.txt"
    p.write_text("\n".join(make_texts(24)) + "\n")
    missing = str(tmp_path / "no-such-model")
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", tiny, "--model", missing, "--texts", str(p), "--k", "4",
               "--n-null", "20", "--ccr", "1", "--max-length", "24", "--no-logit-lens",
               "--retries", "2", "--quiet", "--no-report", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 1, cap.err
    line = [ln for ln in cap.err.splitlines() if ln.startswith("lmgeom sweep:")]
    assert len(line) == 1 and f"1 of 2 jobs failed: {missing} (ModelError)" in line[0]
    df = pd.read_parquet(out / "sweep.parquet")
    assert (df[df.metric == "pga_z"].model == tiny).sum() > 0  # the finished job's rows
    assert list(df[df.metric == "job_failed"].model) == [missing]
    man = json.loads((out / "manifest.json").read_text())
    failed = man["failed_jobs"]
    assert [f["name"] for f in failed] == [missing] and failed[0]["attempts"] == 1
    jobs = {j["name"]: j for j in man["jobs"]}
    assert jobs[missing]["attempts"] == 1 and jobs[missing]["attempt_errors"] == []
    assert jobs[tiny]["ok"] and jobs[tiny]["attempts"] == 1
    assert f"FAILED {missing} (after 1 attempt)" in cap.out
    # every job fine -> 0
    rc = main(["sweep", "--model", tiny, "--texts", str(p), "--k", "4", "--n-null", "20",
               "--ccr", "1", "--max-length", "24", "--no-logit-lens", "--quiet", "--no-report",
               "--out", str(tmp_path / "ok")])
    assert rc == 0


def test_sweep_records_low_sample_jobs(tiny, tmp_path):
    from lmgeom.experiments.layer_sweep import LayerSweepConfig
    from lmgeom.experiments.sweep import JobOptions, JobSpec, run_sweep
    from lmgeom.texts import as_textset

    cfg = LayerSweepConfig(n_null=6, ccr=(1,), max_length=24, layers="1", logit_lens=False)
    with pytest.warns(LowSampleWarning, match="n_null=6"):
        res = run_sweep([JobSpec(model="tiny", spec=tiny)], as_textset(make_texts(24)), cfg,
                        out_dir=tmp_path / "o", options=JobOptions(k=4))
    assert res.entries["low_sample"] == {"tiny": "low_null"}
    assert "LOW SAMPLE tiny: low_null" in res.summary()
    # reused from the job cache: same flags
    again = run_sweep([JobSpec(model="tiny", spec=tiny)], as_textset(make_texts(24)), cfg,
                      out_dir=tmp_path / "o", options=JobOptions(k=4))
    assert again.results[0].info.get("reused")
    pd.testing.assert_series_equal(again.frame["flag"], res.frame["flag"])

