"""Dispersion vs perplexity, hardness ranking and cluster dispersion: chunking, grouping and
statistics against explicit references, per-chunk values against a direct transformers
computation, the cluster rule on a hand-built corpus, and the three commands end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

import lmgeom
from lmgeom.cli import main
from lmgeom.errors import ConfigError, DataError, TextsError
from lmgeom.experiments.clusters import (
    ClusterConfig,
    cluster_rows,
    cluster_states,
    context_rows,
    find_clusters,
)
from lmgeom.experiments.dispersion import (
    ChunkMeasurements,
    DispersionConfig,
    attach_to_run,
    correlation_rows,
    measure_chunks,
)
from lmgeom.experiments.hardness import HardnessConfig, rank_hardness
from lmgeom.lm import perplexity
from lmgeom.metrics.dispersion import group_means
from lmgeom.metrics.uncertainty import quantile_overlap
from lmgeom.results import table
from lmgeom.texts.chunks import Chunks, make_chunks

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Language models map contexts to next-token distributions.",
    "def add(a, b): return a + b",
    "In 1905 Einstein published four papers that changed physics.",
    "Prices rose sharply in the third quarter, analysts said on Monday.",
    "Let x be a real number such that x^2 = 4. Then x = 2 or x = -2.",
]


def _corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(SENTENCES, size=3, replace=False)) for _ in range(n)]


def _pairwise_dispersion(H: np.ndarray) -> float:
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    C = U @ U.T
    n = len(U)
    return float(1 - (C.sum() - np.trace(C)) / (n * (n - 1)))


@pytest.fixture(scope="module")
def llama(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpora")
    paths = []
    for i, n in enumerate((40, 30)):
        p = d / f"c{i}.txt"
        p.write_text("\n".join(_corpus(n, i)) + "\n")
        paths.append(str(p))
    return paths


# ---------------------------------------------------------------------- chunks
def test_chunks_are_slices_of_the_joined_document(llama):
    texts = _corpus(12, 0)
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


def _synthetic(n=120, n_layers=3, seed=0):
    rng = np.random.default_rng(seed)
    nll = rng.normal(3, 0.5, n)
    disp = np.stack([0.5 - 0.05 * nll * k + rng.normal(0, 0.05, n) for k in range(n_layers)])
    layers = tuple(str(i) for i in range(n_layers - 1)) + ("final",)
    ch = Chunks(np.zeros((n, 4), np.int64), np.arange(n), np.arange(n) * 4, n + 7, 4 * n, 4,
                False, None)
    return ChunkMeasurements("m", "builtin:x", layers, tuple(range(n_layers - 1)) + (n_layers,),
                             n_layers - 1, np.exp(nll), nll, disp, ch)


def test_correlation_rows_match_scipy():
    m = _synthetic()
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


def test_measure_chunks_matches_transformers(llama):
    texts = _corpus(20, 1)
    for bos in ("off", "on"):
        m = measure_chunks(llama, texts, chunk_len=16, layers="all", max_chunks=5, seed=0,
                           bos=bos, batch_size=2, cache=False)
        assert m.layers == llama.layer_labels and m.dispersion.shape == (5, 5)
        skip = 1 if bos == "on" else 0
        for i, row in enumerate(m.chunks.tokens):
            x = torch.tensor(row[None])
            with torch.no_grad():
                out = llama.hf_model(input_ids=x, labels=x, output_hidden_states=True)
            assert m.perplexity[i] == pytest.approx(math.exp(out.loss.item()), rel=1e-4)
            for li, h in enumerate(out.hidden_states):  # 0..L-1 then final (post-norm)
                label = "final" if li == len(out.hidden_states) - 1 else str(li)
                ref = _pairwise_dispersion(h[0, skip:].double().numpy())
                assert m.dispersion[m.layers.index(label), i] == pytest.approx(ref, rel=1e-4)
    frame = m.to_frame()
    assert len(frame) == 5 * 5 and set(frame.layer) == set(m.layers)


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
    texts = _corpus(30, 2)
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


def test_cluster_dispersion_matches_explicit_states(tiny_dir):
    shared = " Language models map contexts to next-token distributions."
    texts = [s + shared for s in SENTENCES if "Language" not in s]
    m1 = lmgeom.load_model(str(tiny_dir("llama")))
    m2 = lmgeom.load_model(str(tiny_dir("gpt_neox")))
    cfg = ClusterConfig(ngram=6, window=12, min_context=4, n_boot=50)
    cs = find_clusters(m1.tokenizer, texts, cfg, reference="llama")
    assert len(cs) >= 1 and all(c.size >= 2 for c in cs.clusters)
    states = [cluster_states(m, cs, layers="0,1,2,final", batch_size=3, cache=False)
              for m in (m1, m2)]
    for model, st in zip((m1, m2), states):
        c0 = cs.clusters[0]
        rows = context_rows(model, c0.contexts, cfg.window)
        H = {lab: [] for lab in st.layers}
        for r in rows:
            with torch.no_grad():
                hs = model.hf_model(input_ids=torch.tensor(r[None]),
                                    output_hidden_states=True).hidden_states
            for lab in st.layers:  # hidden_states: 0..L-1, then the post-norm final
                H[lab].append(hs[-1 if lab == "final" else int(lab)][0, -1].double().numpy())
        for li, lab in enumerate(st.layers):
            ref = _pairwise_dispersion(np.stack(H[lab]))
            assert st.cluster_dispersion[li, 0] == pytest.approx(ref, rel=1e-4, abs=1e-7)
    df = table.frame(cluster_rows(states, cs, texts_label="list"))
    w = cs.sizes
    r = df[(df.metric == "cluster_dispersion") & (df.model == states[0].model)]
    np.testing.assert_allclose(r.value, (states[0].cluster_dispersion * w).sum(1) / w.sum())
    diff = df[df.metric == "cluster_dispersion_diff"]
    assert len(diff) == 1 and diff.iloc[0].setting.endswith(f"vs={states[0].model}")


# ---------------------------------------------------------------------- commands
def test_cli_dispersion_end_to_end(tiny_dir, corpus_files, tmp_path, capsys):
    out = tmp_path / "run"
    models = [str(tiny_dir("llama")), str(tiny_dir("gemma3_text"))]
    argv = ["dispersion", "--chunk-len", "16", "--max-chunks", "40", "--group-size", "5",
            "--n-boot", "50", "--out", str(out), "--quiet"]
    for m in models:
        argv += ["--model", m]
    for c in corpus_files:
        argv += ["--texts", c]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "spearman chunk" in text
    for f in ("dispersion.parquet", "dispersion.csv", "chunks.parquet", "manifest.json",
              "report.html", "plots/dispersion_scatter.png", "plots/dispersion.png"):
        assert (out / f).is_file(), f
    df = table.read_table(out / "dispersion.parquet")
    assert set(df.model) == set(models)
    settings = set(df[df.metric == "corr_spearman"].setting)
    assert settings == {f"texts={c};level={lv}" for c in corpus_files for lv in ("chunk", "group;g=5")}
    chunks = pd.read_parquet(out / "chunks.parquet")
    sub = chunks[(chunks.model == models[0]) & (chunks.texts == corpus_files[0])]
    mean = sub.groupby("layer").dispersion.mean()
    rows = df[(df.metric == "dispersion") & (df.model == models[0])
              & (df.setting == f"texts={corpus_files[0]};level=chunk")].set_index("layer")
    np.testing.assert_allclose(rows.loc[mean.index, "value"], mean, rtol=1e-6)
    html = (out / "report.html").read_text()
    assert 'id="section-dispersion"' in html
    man = json.loads((out / "manifest.json").read_text())
    assert man["group_size_used"] == 5 and all(r["batches_cached"] == 0 for r in man["runs"])
    # rerun: same folder, everything from the cache, same numbers
    assert main(argv) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert all(r["batches_cached"] > 0 for r in man["runs"])
    pd.testing.assert_frame_equal(table.read_table(out / "dispersion.parquet"), df)


def test_attach_adds_a_dispersion_section_to_an_analyze_run(tmp_path):
    from lmgeom._io import write_json
    from lmgeom.results.folder import prepare_out_dir

    run = prepare_out_dir(tmp_path / "analyze", "sig")  # an lmgeom run folder (marker)
    layers = table.frame([table.row(model="m", layer=str(i), layer_index=i, metric="pga_z",
                                    setting="ccr=1", value=float(i)) for i in range(4)])
    table.write_table(layers, run, "layers")
    write_json(run / "manifest.json", {"command": "analyze", "models": ["m"]})
    df = table.frame(correlation_rows(_synthetic(), DispersionConfig(group_size=8, n_boot=50)))
    report = attach_to_run(run, df)
    html = report.read_text()
    assert 'id="section-dispersion"' in html and 'id="section-pga"' in html
    assert (run / "dispersion.parquet").is_file()


def test_cli_hardness_and_clusters(tiny_dir, corpus_files, tmp_path, capsys):
    model = str(tiny_dir("llama"))
    out = tmp_path / "hard"
    assert main(["hardness", "--model", model, "--texts", corpus_files[0], "--max-length", "32",
                 "--n-boot", "50", "--n-perm", "50", "--out", str(out), "--quiet",
                 "--show", "2"]) == 0
    assert "Spearman(dispersion, perplexity)" in capsys.readouterr().out
    rk = pd.read_csv(out / "hardness.csv")
    assert list(rk.columns) == ["id", "label", "rank", "dispersion", "perplexity", "n_tokens",
                                "snippet"]
    assert rk["rank"].tolist() == list(range(1, len(rk) + 1))
    ml = table.read_table(out / "hardness.parquet")
    assert {"hardness_spearman", "hardness_decile_overlap", "hardness_overlap_null",
            "hardness_overlap_p"} <= set(ml.metric)

    out = tmp_path / "clus"
    assert main(["clusters", "--model", model, "--model", str(tiny_dir("gpt_neox")),
                 "--texts", corpus_files[1], "--ngram", "6", "--n-boot", "50", "--out", str(out),
                 "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "within-cluster dispersion" in text
    cl = table.read_table(out / "clusters.parquet")
    assert set(cl[cl.metric == "cluster_dispersion"].model) == {model, str(tiny_dir("gpt_neox"))}
    assert (out / "report.html").is_file()


def test_bad_options_are_one_line_errors(tiny_dir, corpus_files, tmp_path, capsys):
    model = str(tiny_dir("llama"))
    assert main(["dispersion", "--model", model, "--texts", corpus_files[0], "--chunk-len",
                 "100000", "--out", str(tmp_path / "a"), "--quiet"]) == 2
    assert "fewer than one chunk" in capsys.readouterr().err
    assert main(["hardness", "--model", model, "--texts", corpus_files[0], "--layer", "0,1",
                 "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert "one layer" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm_chunks(smollm):
    texts = lmgeom.load_texts("builtin:news", limit=20, seed=0)
    m = measure_chunks(smollm, texts, chunk_len=64, layers="final,15", max_chunks=3,
                       batch_size=3, cache=False)
    for i, row in enumerate(m.chunks.tokens):
        x = torch.tensor(row[None])
        with torch.no_grad():
            loss = smollm.hf_model(input_ids=x, labels=x).loss.item()
        assert m.perplexity[i] == pytest.approx(math.exp(loss), rel=1e-4)
    assert np.all((m.dispersion > 0) & (m.dispersion < 1.5))
    assert 2 < np.exp(m.mean_nll.mean()) < 200  # real English news, a real model
