"""Label-free selection with the dispersion gap: token sets, constructed W_U with known gaps,
the agreement statistic, bits per byte, suites and the CLI end to end on tiny models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from support.select import suite  # noqa: F401 (fixtures)

import lmgeom
from conftest import CORPUS
from lmgeom.cli import main
from lmgeom.errors import ConfigError, ModelError
from lmgeom.experiments.select import (
    domain_token_ids,
    domain_words,
    filter_candidates,
    general_token_ids,
    scored_bytes,
    suite_candidates,
)
from lmgeom.metrics.uncertainty import MIN_N_CI, rank_agreement


# ---------------------------------------------------------------------- tokens
def test_domain_words():
    assert domain_words("math") == ("math", tuple("0123456789"))
    name, words = domain_words("code")
    assert name == "code" and "def" in words and "lambda" in words
    assert domain_words(" def, return ,def") == ("custom", ("def", "return"))
    with pytest.raises(ConfigError, match="comma"):
        domain_words("digits")


def test_domain_token_ids_keep_only_single_token_forms(tiny_dir):
    tok = lmgeom.load_model(str(tiny_dir("llama"))).tokenizer
    words = ["0", "7", "def", "return", "xylophonequark", "nonlocal"]
    for forms in ("both", "bare", "space"):
        ts = domain_token_ids(tok, words, forms=forms)
        tried = {"both": ("{}", " {}"), "bare": ("{}",), "space": (" {}",)}[forms]
        for w, form, i, _ in ts.kept:
            assert tok(form, add_special_tokens=False)["input_ids"] == [i]
            assert form in [t.format(w) for t in tried]
        for w in ts.dropped:
            assert all(len(tok(t.format(w), add_special_tokens=False)["input_ids"]) != 1
                       for t in tried)
        assert set(ts.dropped) | {k[0] for k in ts.kept} == set(words)
        assert len(set(ts.ids.tolist())) == len(ts.ids)  # distinct
    assert "xylophonequark" in domain_token_ids(tok, words).dropped
    with pytest.raises(ConfigError):
        domain_token_ids(tok, words, forms="all")


def test_general_tokens_frequent_seeded_and_disjoint(tiny_dir):
    tok = lmgeom.load_model(str(tiny_dir("llama"))).tokenizer
    texts = CORPUS
    T = domain_token_ids(tok, list("0123456789")).ids
    a, info = general_token_ids(tok, texts, T, n=20, pool=40, seed=0)
    b, _ = general_token_ids(tok, texts, T, n=20, pool=40, seed=0)
    c, _ = general_token_ids(tok, texts, T, n=20, pool=40, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len(a) == 20 and info["pool"] == 40
    assert not set(a.tolist()) & set(T.tolist())
    assert not set(a.tolist()) & set(tok.all_special_ids)
    # every sampled id is among the 40 most frequent eligible ids
    from collections import Counter

    cnt = Counter(i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"])
    elig = sorted((i for i in cnt if i not in set(T.tolist())), key=lambda i: (-cnt[i], i))
    assert set(a.tolist()) <= set(elig[:40])
    small, _ = general_token_ids(tok, texts, T, n=10_000, pool=10_000)
    assert len(small) == len(elig)


# ---------------------------------------------------------------------- agreement
def test_rank_agreement():
    x = [0.1, 0.5, 0.3, 0.9, 0.7, 0.2]
    perfect = rank_agreement(x, x, n_boot=200)
    assert perfect.value == pytest.approx(1.0) and perfect.n == 6
    assert perfect.low <= 1.0 <= perfect.high + 1e-12
    rev = rank_agreement(x, [-v for v in x], n_boot=200)
    assert rev.value == pytest.approx(-1.0)
    y = [3, 1, 2, 5, 4, 0]
    assert rank_agreement(x, y).value == pytest.approx(scipy.stats.spearmanr(x, y)[0])
    few = rank_agreement(x[:3], y[:3])
    assert math.isnan(few.low) and few.n == 3 and 3 < MIN_N_CI
    assert few.value == pytest.approx(scipy.stats.spearmanr(x[:3], y[:3])[0])
    assert rank_agreement([1, 2], [5, 7]).value == 1.0
    assert rank_agreement([1, 2], [7, 5]).value == -1.0
    assert math.isnan(rank_agreement([1, 1, 1], [1, 2, 3]).value)
    nan_dropped = rank_agreement([1, 2, np.nan, 4], [1, 2, 3, 4])
    assert nan_dropped.n == 3


def test_scored_bytes(tiny_dir):
    texts = ["def add(a, b):", "The quick brown fox."]
    llama = lmgeom.load_model(str(tiny_dir("llama")))  # no BOS: first token unscored
    tok = llama.tokenizer
    firsts = [tok.decode([tok(t)["input_ids"][0]]) for t in texts]
    assert scored_bytes(llama, texts) == sum(len(t) for t in texts) - sum(len(f) for f in firsts)
    gemma = lmgeom.load_model(str(tiny_dir("gemma3_text")))  # BOS prepended: every byte scored
    assert gemma.bos_prepended
    assert scored_bytes(gemma, texts) == sum(len(t.encode()) for t in texts)


# ---------------------------------------------------------------------- suites
def test_suite_candidates_from_folders_and_manifest(suite, tmp_path):
    cands = suite_candidates(suite)
    assert [c.revision for c in cands] == ["step0", "step100", "step200"]
    assert [c.step for c in filter_candidates(cands, steps=[0, 200])] == [0, 200]
    assert len(filter_candidates(cands, widths=["32"])) == 3
    with pytest.raises(ConfigError, match="matches"):
        filter_candidates(cands, widths=["w64"])
    assert {c.group for c in cands} == {"w32"} and cands[0].label.endswith("/w32")
    # a manifest listing the checkpoints (paths relative to the suite) is honoured
    man = {"checkpoints": [{"width": 32, "step": 200, "path": "w32/step200"},
                           {"width": 32, "step": 0, "path": str(suite / "w32" / "step0")}]}
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    for sub in ("step0", "step200"):
        (tmp_path / "w32").mkdir(exist_ok=True)
        (tmp_path / "w32" / sub).symlink_to(suite / "w32" / sub)
    got = suite_candidates(tmp_path)
    assert [c.step for c in got] == [0, 200]
    with pytest.raises(ModelError, match="no checkpoints"):
        suite_candidates(tmp_path / "w32" / "step0")
    with pytest.raises(ModelError, match="no such folder"):
        suite_candidates(tmp_path / "missing")


def test_cli_select_without_perplexity(suite, tmp_path):
    general = tmp_path / "general.txt"
    general.write_text("\n".join(CORPUS))
    out = tmp_path / "run"
    rc = main(["select", "--model", str(Path(suite) / "w32" / "step0"), "--model",
               str(Path(suite) / "w32" / "step200"), "--domain", "math", "--general-texts",
               str(general), "--no-perplexity", "--out", str(out), "--quiet"])
    assert rc == 0
    df = pd.read_parquet(out / "select.parquet")
    assert not (df.metric == "domain_perplexity").any()
    assert not (df.metric == "gap_rank_agreement").any()
    g = df[df.metric == "dispersion_gap"].value.to_numpy()
    assert g[0] < g[1]

