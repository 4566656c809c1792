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
import torch
from conftest import CORPUS

import lmgeom
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
from lmgeom.texts import load_texts

MATH_TEXTS = [
    "Let x = 12 + 34. Then x = 46 and 2x = 92.",
    "In 1905 there were 4 papers; 1905 - 4 = 1901.",
    "If 3y = 27 then y = 9, so y^2 = 81 and y + 1 = 10.",
    "The sum 1 + 2 + 3 + 4 + 5 = 15, and 15 / 3 = 5.",
] * 3

ALPHAS = (0.0, 0.5, 1.0)


def _explicit_gap(W: np.ndarray, T, Tb) -> float:
    """G = D(T) + D(T, T̄) from explicit pairwise cosine loops."""
    def cos(a, b):
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    T, Tb = list(T), list(Tb)
    within = [1 - cos(W[i], W[j]) for i in T for j in T if i != j]
    between = [1 - cos(W[i], W[j]) for i in T for j in Tb]
    return float(np.mean(within) + np.mean(between))


@pytest.fixture(scope="module")
def suite(tiny_dir, tmp_path_factory):
    """A fake 'suite': one tiny llama whose digit rows of W_U move from one shared direction
    (alpha = 0: D(T) = 0) to independent random directions (alpha = 1), saved as
    <root>/w32/step0, step100, step200 — a known, increasing dispersion gap."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tiny_dir("llama")
    tok = AutoTokenizer.from_pretrained(src)
    digits = [tok(str(i), add_special_tokens=False)["input_ids"][0] for i in range(10)]
    root = tmp_path_factory.mktemp("suite")
    g = torch.Generator().manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(src)
    W0 = base.lm_head.weight.detach().clone()
    d = W0.shape[1]
    others = torch.ones(W0.shape[0], dtype=torch.bool)
    others[digits] = False
    m = W0[others].mean(0)
    c = torch.randn(d, generator=g)
    c -= (c @ m) / (m @ m) * m  # shared direction orthogonal to the other rows' mean
    c = c / c.norm() * W0[others].norm(dim=1).mean()
    R = torch.randn(len(digits), d, generator=g) * W0[others].norm(dim=1).mean() / math.sqrt(d)
    for step, a in zip((0, 100, 200), ALPHAS):
        model = AutoModelForCausalLM.from_pretrained(src)
        with torch.no_grad():
            model.lm_head.weight[digits] = (1 - a) * c + a * R
        out = root / "w32" / f"step{step}"
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return root


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


@pytest.mark.slow
def test_domain_tokens_on_smollm(smollm):
    """Known answer on the bundled tokenizer: digits are single ids only without a space
    (' 0' is 'Ġ' + '0'); 'def' has both forms; 'nonlocal' splits in both."""
    tok = smollm.tokenizer
    ts = domain_token_ids(tok, list("0123456789"))
    assert len(ts.ids) == 10 and {k[1] for k in ts.kept} == set("0123456789")
    assert ts.ids[0] == tok.convert_tokens_to_ids("0")
    code = domain_token_ids(tok, ["def", "nonlocal"])
    assert [k[1] for k in code.kept] == ["def", " def"] and code.dropped == ("nonlocal",)


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


# ---------------------------------------------------------------------- CLI
def test_cli_select_suite_known_gap_order(suite, tmp_path):
    general = tmp_path / "general.txt"
    general.write_text("\n".join(CORPUS))
    math_txt = tmp_path / "math.txt"
    math_txt.write_text("\n".join(MATH_TEXTS))
    out = tmp_path / "run"
    rc = main(["select", "--suite", str(suite), "--domain", "math",
               "--general-texts", str(general), "--n-general", "30", "--general-pool", "60",
               "--domain-texts", str(math_txt), "--eval-texts", str(math_txt),
               "--state-tokens", "60", "--n-boot", "50", "--out", str(out), "--quiet"])
    assert rc == 0
    df = pd.read_parquet(out / "select.parquet")
    man = json.loads((out / "manifest.json").read_text())
    assert (out / "report.html").is_file() and (out / "plots" / "select.png").is_file()
    wu = df[(df.metric == "dispersion_gap") & df.setting.str.startswith("variant=W_U")]
    assert list(wu.revision) == ["step0", "step100", "step200"]
    g = wu.value.to_numpy()
    assert g[0] < g[1] < g[2]  # constructed: digits spread out step by step
    # each G equals the explicit pairwise computation on the ids the run recorded
    for cand, val in zip(man["candidates"], g):
        W = lmgeom.load_model(cand["spec"]).W_U.detach().double().numpy()
        T = [k[2] for k in cand["domain_tokens"]["kept"]]
        assert len(T) == 10
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cand["spec"])
        Tb, _ = general_token_ids(tok, load_texts(str(general)).texts, T, n=30, pool=60, seed=0)
        assert val == pytest.approx(_explicit_gap(W, T, Tb), abs=1e-9)
    ranks = df[(df.metric == "gap_rank") & df.setting.str.startswith("variant=W_U")]
    assert list(ranks.value) == [3.0, 2.0, 1.0]
    # the states variant ran and is labelled; the held-out texts are disjoint from the states
    st = df[(df.metric == "dispersion_gap") & df.setting.str.startswith("variant=states")]
    assert len(st) == 3 and st.value.notna().all()
    assert "split" in man["corpora"]
    # agreement rows agree with a direct Spearman of G and -bits/byte (n = 3: no CI)
    bpb = df[df.metric == "domain_bits_per_byte"].value.to_numpy()
    row = df[(df.metric == "gap_rank_agreement") & df.setting.str.contains("variant=W_U;")]
    assert len(row) == 1 and row.n.iloc[0] == 3 and math.isnan(row.ci_low.iloc[0])
    assert row.value.iloc[0] == pytest.approx(scipy.stats.spearmanr(g, -bpb)[0])
    # known answer: the checkpoints differ only in W_U, so their states (and the states gap)
    # are identical and the states variant cannot rank them
    assert np.ptp(st.value.to_numpy()) < 1e-9
    row = df[(df.metric == "gap_rank_agreement") & df.setting.str.contains("variant=states;")]
    assert math.isnan(row.value.iloc[0])
    assert set(man["variants"]) == {"W_U", "states"}


def test_cli_select_across_families(tiny_dir, tmp_path, capsys):
    """Two families (Llama without BOS, Gemma-3 with BOS), W_U only, custom code tokens."""
    general = tmp_path / "general.txt"
    general.write_text("\n".join(CORPUS))
    code = tmp_path / "code.txt"
    code.write_text("\n".join(["def add(a, b):\n    return a + b"] * 4))
    out = tmp_path / "run"
    rc = main(["select", "--model", str(tiny_dir("llama")), "--model",
               str(tiny_dir("gemma3_text")), "--domain", "+,=,(,),:,qqqzzzx",
               "--general-texts", str(general), "--n-general", "20", "--eval-texts", str(code),
               "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "variant=W_U" in text and "dropped qqqzzzx" in text
    df = pd.read_parquet(out / "select.parquet")
    assert not df.setting.str.contains("variant=states").any()
    assert (df.metric == "domain_bits_per_byte").sum() == 2
    agree = df[df.metric == "gap_rank_agreement"]
    assert len(agree) == 1 and agree.n.iloc[0] == 2 and abs(agree.value.iloc[0]) == 1.0
    # no candidates / both kinds of candidates are user errors
    assert main(["select", "--out", str(tmp_path / "x")]) == 2
    assert main(["select", "--model", "a", "--suite", str(tmp_path), "--out",
                 str(tmp_path / "y")]) == 2


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


def test_agreement_within_each_suite_width(suite, tmp_path):
    from lmgeom.experiments.select import Candidate, SelectConfig, run_select, select_rows

    general = tmp_path / "general.txt"
    general.write_text("\n".join(CORPUS))
    math_txt = tmp_path / "math.txt"
    math_txt.write_text("\n".join(MATH_TEXTS[:4]))
    ck = {s: str(Path(suite) / "w32" / f"step{s}") for s in (0, 100, 200)}
    cands = [Candidate(ck[0], "a", "step0", 0, "g1"), Candidate(ck[200], "a", "step200", 200, "g1"),
             Candidate(ck[100], "b", "step100", 100, "g2"), Candidate(ck[0], "b", "step0", 0, "g2")]
    cfg = SelectConfig(domain="math", general_texts=str(general), n_general=30,
                       eval_texts=str(math_txt), n_boot=50)
    run = run_select(cands, cfg)
    assert set(run.by_group["W_U"]) == {"g1", "g2"}
    g, q = run.gaps("W_U"), -run.bits_per_byte
    for grp, ix in (("g1", [0, 1]), ("g2", [2, 3])):
        a = run.by_group["W_U"][grp]
        assert a.n == 2 and a.value == np.sign((g[ix[1]] - g[ix[0]]) * (q[ix[1]] - q[ix[0]]))
    rows = pd.DataFrame(select_rows(run))
    assert set(rows[rows.metric == "gap_rank_agreement"].model) == {
        "(candidates)", "(group g1)", "(group g2)"}
