"""Label-free selection with the dispersion gap: token sets, constructed W_U with known gaps,
the agreement statistic, bits per byte, suites and the CLI end to end on tiny models.

End-to-end half (the unit half is tests/unit/test_select.py).
"""

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
from lmgeom.experiments.select import (
    domain_token_ids,
    general_token_ids,
)
from lmgeom.texts import load_texts

MATH_TEXTS = [
    "Let x = 12 + 34. Then x = 46 and 2x = 92.",
    "In 1905 there were 4 papers; 1905 - 4 = 1901.",
    "If 3y = 27 then y = 9, so y^2 = 81 and y + 1 = 10.",
    "The sum 1 + 2 + 3 + 4 + 5 = 15, and 15 / 3 = 5.",
] * 3


def _explicit_gap(W: np.ndarray, T, Tb) -> float:
    """G = D(T) + D(T, T̄) from explicit pairwise cosine loops."""
    def cos(a, b):
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    T, Tb = list(T), list(Tb)
    within = [1 - cos(W[i], W[j]) for i in T for j in T if i != j]
    between = [1 - cos(W[i], W[j]) for i in T for j in Tb]
    return float(np.mean(within) + np.mean(between))


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

