"""Dispersion vs perplexity, hardness ranking and cluster dispersion: chunking, grouping and
statistics against explicit references, per-chunk values against a direct transformers
computation, the cluster rule on a hand-built corpus, and the three commands end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from support.dispersion_experiments import (
    corpus_files,  # noqa: F401 (a fixture)
    llama,  # noqa: F401 (a fixture)
    make_corpus,
    synthetic,
)

from lmgeom.cli import main
from lmgeom.errors import ConfigError, DataError, TextsError
from lmgeom.experiments.clusters import (
    ClusterConfig,
    find_clusters,
)
from lmgeom.experiments.dispersion import (
    DispersionConfig,
    correlation_rows,
)
from lmgeom.experiments.hardness import HardnessConfig, rank_hardness
from lmgeom.lm import perplexity
from lmgeom.metrics.dispersion import group_means
from lmgeom.metrics.uncertainty import quantile_overlap
from lmgeom.results import table
from lmgeom.texts.chunks import make_chunks


# ---------------------------------------------------------------------- chunks
def test_chunks_are_slices_of_the_joined_document(llama):
    texts = make_corpus(12, 0)
    tok = llama.tokenizer
    doc = []
    for i, t in enumerate(texts):
        if i:
            doc.append(tok.eos_token_id)
        doc += tok(t, add_special_tokens=False)["input_ids"]
    ch = make_chunks(llama, texts, 16, bos="off")
    assert ch.n_available == len(doc) // 16 == len(ch) and ch.n_document_tokens == len(doc)
    np.testing.assert_array_equal(ch.tokens.reshape(-1), doc[: len(ch) * 16])  # tail dropped
    assert ch.separator == tok.eos_token_id and not ch.bos

    a = make_chunks(llama, texts, 16, max_chunks=5, seed=3, bos="on")
    b = make_chunks(llama, texts, 16, max_chunks=5, seed=3, bos="on")
    c = make_chunks(llama, texts, 16, max_chunks=5, seed=4, bos="on")
    np.testing.assert_array_equal(a.index, b.index)
    assert not np.array_equal(a.index, c.index)
    assert (np.diff(a.index) > 0).all() and a.tokens.shape == (5, 17) and a.bos
    assert (a.tokens[:, 0] == tok.bos_token_id).all()
    for row, i in zip(a.tokens, a.index):
        np.testing.assert_array_equal(row[1:], doc[i * 16 : (i + 1) * 16])
    with pytest.raises(TextsError, match="fewer than one chunk"):
        make_chunks(llama, ["a b"], 64)
    with pytest.raises(ConfigError):
        make_chunks(llama, texts, 1)


def test_group_means_match_explicit_loop():
    rng = np.random.default_rng(0)
    ppl = rng.lognormal(3, 1, size=103)
    disp = rng.random((2, 103))
    gd, gp, gid = group_means(disp, ppl, group_size=10)
    order = np.argsort(ppl)
    assert len(gp) == 10 and gid.tolist() == list(range(10))  # the incomplete 11th dropped
    for g in range(10):
        m = order[g * 10 : (g + 1) * 10]
        assert gp[g] == pytest.approx(ppl[m].mean())
        np.testing.assert_allclose(gd[:, g], disp[:, m].mean(1))
    assert (np.diff(gp) > 0).all()
    _, gp2, gid2 = group_means(disp, ppl, group_size=2, max_groups=5)  # 51 groups -> 5
    assert gid2.tolist() == [0, 12, 25, 38, 50]
    np.testing.assert_allclose(gp2, gp_all := group_means(disp, ppl, 2, 1000)[1][gid2])
    assert len(gp_all) == 5


def test_correlation_rows_match_scipy():
    m = synthetic()
    cfg = DispersionConfig(group_size=8, n_boot=200, seed=1)
    df = table.frame(correlation_rows(m, cfg))
    gd, gp, _ = group_means(m.dispersion, m.perplexity, 8)
    for li, layer in enumerate(m.layers):
        r = df[df.layer == layer]

        def get(metric, s, r=r):
            return r[(r.metric == metric) & (r.setting == s)].iloc[0]

        sc, sg = "texts=builtin:x;level=chunk", "texts=builtin:x;level=group;g=8"
        assert get("dispersion", sc).value == pytest.approx(m.dispersion[li].mean())
        rho = get("corr_spearman", sc)
        assert rho.value == pytest.approx(scipy.stats.spearmanr(m.dispersion[li], m.perplexity)[0])
        assert rho.ci_low <= rho.ci_high and rho.n == 120 and rho.seed == 1
        assert get("corr_pearson", sc).value == pytest.approx(
            scipy.stats.pearsonr(m.dispersion[li], m.perplexity)[0])
        g = get("corr_pearson", sg)
        assert g.value == pytest.approx(scipy.stats.pearsonr(gd[li], gp)[0]) and g.n == 15
        assert get("corr_spearman", sg).value == pytest.approx(
            scipy.stats.spearmanr(gd[li], gp)[0])
    ml = df[df.layer_index < 0].set_index("metric")
    assert ml.loc["perplexity", "value"] == pytest.approx(math.exp(m.mean_nll.mean()))
    assert ml.loc["n_chunks", "value"] == 120 and ml.loc["n_chunks", "n"] == 127
    assert ml.loc["n_groups", "value"] == 15
    # the signal built in is negative and grows with depth
    chunk_rho = df[(df.metric == "corr_spearman") & df.setting.str.endswith("chunk")]
    assert chunk_rho.value.iloc[-1] < -0.5


# ---------------------------------------------------------------------- hardness
def test_quantile_overlap_known_answers():
    rng = np.random.default_rng(0)
    ppl = rng.lognormal(2, 1, 200)
    obs, null, k = quantile_overlap(-ppl, ppl, 0.1, n_perm=2000, seed=0)
    assert k == 20 and obs == 1.0
    assert quantile_overlap(ppl, ppl, 0.1, n_perm=10)[0] == 0.0
    assert null.mean() == pytest.approx(0.1, abs=0.01)  # k/n for a random ranking
    assert np.all((null >= 0) & (null <= 1))


def test_rank_hardness(llama):
    texts = make_corpus(30, 2)
    res = rank_hardness(llama, texts, HardnessConfig(max_length=32, n_boot=100, n_perm=100),
                        cache=False)
    rk = res.ranking
    assert rk["rank"].tolist() == list(range(1, 31))
    assert (np.diff(rk.dispersion) >= 0).all()  # lowest dispersion first
    ref = perplexity(llama, texts, max_length=32).to_frame().set_index("id")
    np.testing.assert_allclose(rk.perplexity, ref.loc[rk.id, "perplexity"], rtol=1e-6)
    assert res.spearman[0] == pytest.approx(scipy.stats.spearmanr(rk.dispersion, rk.perplexity)[0])
    assert res.layer == "final" and res.k == 3 and 0 < res.p_value <= 1


# ---------------------------------------------------------------------- clusters
class CharTokenizer:
    """One token per character: makes the cluster rule checkable by hand."""

    is_fast = True
    bos_token_id = None

    def __call__(self, texts, add_special_tokens=False, truncation=False, verbose=False,
                 return_offsets_mapping=False):
        out = {"input_ids": [[ord(c) for c in t] for t in texts]}
        if return_offsets_mapping:
            out["offset_mapping"] = [[(i, i + 1) for i in range(len(t))] for t in texts]
        return out

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_cluster_rule_on_a_hand_built_corpus():
    texts = [
        "aaaXYZWqq", "bbbXYZWrr",          # one cluster, two different contexts
        "cccLMNOPQdd", "eeeLMNOPQff",      # a 6-token repeat: only its left-maximal start
        "kkkABCD", "kkkABCD", "mmmABCD",   # identical context windows count once
        "zzzQQQQQQQQ",                     # overlapping occurrences of QQQQ
        "gggSTUVhh", "gggSTUVii",          # same contexts only: no cluster
    ]
    cfg = ClusterConfig(ngram=4, window=3, min_context=3, max_clusters=100, max_members=8)
    cs = find_clusters(CharTokenizer(), texts, cfg)
    got = {c.continuation: (c.members, c.contexts) for c in cs.clusters}
    assert got == {
        "XYZW": (((0, 3), (1, 3)), ("aaa", "bbb")),
        "LMNO": (((2, 3), (3, 3)), ("ccc", "eee")),
        "ABCD": (((4, 3), (6, 3)), ("kkk", "mmm")),
        "QQQQ": (((7, 3), (7, 7)), ("zzz", "QQQ")),
    }
    assert cs.sizes.tolist() == [2, 2, 2, 2] and cs.n_found == 4
    small = find_clusters(CharTokenizer(), texts,
                          ClusterConfig(ngram=4, window=3, min_context=3, max_clusters=2))
    assert len(small) == 2 and {c.continuation for c in small.clusters} <= set(got)
    with pytest.raises(DataError, match="no clusters"):
        find_clusters(CharTokenizer(), ["abcdefghijk", "lmnopqrstuv"], cfg)


def test_bad_options_are_one_line_errors(tiny_dir, corpus_files, tmp_path, capsys):
    model = str(tiny_dir("llama"))
    assert main(["dispersion", "--model", model, "--texts", corpus_files[0], "--chunk-len",
                 "100000", "--out", str(tmp_path / "a"), "--quiet"]) == 2
    assert "fewer than one chunk" in capsys.readouterr().err
    assert main(["hardness", "--model", model, "--texts", corpus_files[0], "--layer", "0,1",
                 "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert "one layer" in capsys.readouterr().err

