"""Dispersion vs perplexity, hardness ranking and cluster dispersion: chunking, grouping and
statistics against explicit references, per-chunk values against a direct transformers
computation, the cluster rule on a hand-built corpus, and the three commands end to end.

End-to-end half (the unit half is tests/unit/test_dispersion_experiments.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from support.dispersion_experiments import (
    SENTENCES,
    corpus_files,  # noqa: F401 (a fixture)
    llama,  # noqa: F401 (a fixture)
    make_corpus,
    synthetic,
)

import lmgeom
from lmgeom.cli import main
from lmgeom.experiments.clusters import (
    ClusterConfig,
    cluster_rows,
    cluster_states,
    context_rows,
    find_clusters,
)
from lmgeom.experiments.dispersion import (
    DispersionConfig,
    attach_to_run,
    correlation_rows,
    measure_chunks,
)
from lmgeom.results import table


def _pairwise_dispersion(H: np.ndarray) -> float:
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    C = U @ U.T
    n = len(U)
    return float(1 - (C.sum() - np.trace(C)) / (n * (n - 1)))


def test_measure_chunks_matches_transformers(llama):
    texts = make_corpus(20, 1)
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
    df = table.frame(correlation_rows(synthetic(), DispersionConfig(group_size=8, n_boot=50)))
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
    # every job the README lists writes plots/ (issue 49: hardness wrote none)
    assert (out / "plots" / "hardness.png").is_file() and "hardness.png" in (
        out / "report.html").read_text()

    out = tmp_path / "clus"
    assert main(["clusters", "--model", model, "--model", str(tiny_dir("gpt_neox")),
                 "--texts", corpus_files[1], "--ngram", "6", "--n-boot", "50", "--out", str(out),
                 "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "within-cluster dispersion" in text
    cl = table.read_table(out / "clusters.parquet")
    assert set(cl[cl.metric == "cluster_dispersion"].model) == {model, str(tiny_dir("gpt_neox"))}
    assert (out / "report.html").is_file()


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

