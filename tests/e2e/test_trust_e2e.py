"""Ownership that survives a move (issue 48): a run folder lmgeom wrote stays resumable and
overwritable by its owner after ``mv``, a copy, or another ``LMGEOM_STATE``; the folder's marker
is the proof. A file the user put there is never removed, and a forged marker proves nothing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.hostile_inputs import ANALYZE, corpus, tiny_path  # noqa: F401 (fixtures)

from conftest import CORPUS
from lmgeom.cli import main


def _run(tiny_path, corpus, out, *extra):
    return main([*ANALYZE, "--model", tiny_path, "--texts", corpus, "--out", str(out), *extra])


@pytest.mark.parametrize("how", ["move", "copy", "state"])
def test_a_run_folder_stays_its_owners(tiny_path, corpus, tmp_path, monkeypatch, capsys, how):
    first = tmp_path / "r" / "c85"
    assert _run(tiny_path, corpus, first) == 0
    marker = json.loads((first / ".lmgeom-run").read_text())
    assert {"manifest.json", "layers.parquet", "layers.csv"} <= set(marker["files"])
    if how == "move":
        out = first.rename(tmp_path / "r" / "c85moved")
    elif how == "copy":
        out = tmp_path / "copied"
        shutil.copytree(first, out)
    else:
        out = first
    monkeypatch.setenv("LMGEOM_STATE", str(tmp_path / f"other-state-{how}"))  # forgets the ledger
    capsys.readouterr()
    assert _run(tiny_path, corpus, out) == 0, capsys.readouterr().err  # same run: resumes
    (out / "notes.txt").write_text("mine\n")
    assert _run(tiny_path, corpus, out, "--k", "3", "--overwrite") == 0, capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine\n"  # never lmgeom's to remove
    assert json.loads((out / "manifest.json").read_text())["settings"]["sweep"]["k"] == 3


def test_an_edited_or_forged_marker_proves_nothing(tiny_path, corpus, tmp_path, monkeypatch,
                                                   capsys):
    out = tmp_path / "run"
    assert _run(tiny_path, corpus, out) == 0
    monkeypatch.setenv("LMGEOM_STATE", str(tmp_path / "other-state"))
    data = json.loads((out / ".lmgeom-run").read_text())
    data["files"]["notes.txt"] = data["files"]["layers.csv"]  # claim a file it did not write
    (out / ".lmgeom-run").write_text(json.dumps(data))
    capsys.readouterr()
    assert _run(tiny_path, corpus, out, "--overwrite") == 2
    assert "holds no lmgeom run" in capsys.readouterr().err
    assert (out / "layers.csv").is_file()  # nothing removed


def test_token_pooling_fits_k_to_the_rows_not_the_texts(tiny_path, corpus, tmp_path):
    """16 texts pooled by tokens hold a few hundred rows per layer: k is not cut to
    16 - 10 - 2 = 4 as the texts alone would allow, only to the width (d = 32: k = 31)."""
    out = tmp_path / "tok"
    assert main(["analyze", "--model", tiny_path, "--texts", corpus, "--n", "16", "--pooling",
                 "tokens", "--layers", "2", "--n-null", "20", "--quiet", "--out", str(out)]) == 0
    info = json.loads((out / "manifest.json").read_text())["models"][0]
    assert info["k"] == 31
    last = tmp_path / "last"  # one row per text: the texts are the limit
    assert main(["analyze", "--model", tiny_path, "--texts", corpus, "--n", "16", "--layers",
                 "2", "--n-null", "20", "--quiet", "--out", str(last)]) == 0
    assert json.loads((last / "manifest.json").read_text())["models"][0]["k"] == 4


def test_converge_fits_k_like_every_command_and_marks_flags(tiny_dir, tmp_path, capsys):
    """converge at n = 16 fits k to the texts (16 - 1 - 2 = 13 with CCR-1) and says so once, in
    words and in the manifest; an explicit k that cannot fit is refused before any model loads;
    a z computed under a flag carries the mark and the footer in the printed table."""
    import pandas as pd

    a, b = str(tiny_dir("llama")), str(tiny_dir("gpt2"))
    base = ["converge", "--model", a, "--model", b, "--texts", "builtin:news", "--n", "16",
            "--layers", "1,2", "--n-null", "20", "--no-heatmap"]
    out = tmp_path / "conv"
    assert main([*base, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    man = json.loads((out / "manifest.json").read_text())
    assert man["k"] == 13 and man["k_asked"] is None and "16 texts" in man["k_note"]
    assert "k=13 (k = 13 instead of 100" in printed
    df = pd.read_parquet(out / "converge.parquet")
    assert (df["flag"].fillna("") == "").all() and "LOW SAMPLE" not in printed
    assert main([*base, "--k", "30", "--out", str(tmp_path / "x")]) == 2
    assert "--k 30 does not fit 16 texts" in capsys.readouterr().err
    # too few distinct states for k: flagged, and the flag shows in the table
    flagged = tmp_path / "flagged"
    assert main([*base, "--max-length", "2", "--out", str(flagged)]) == 0
    printed = capsys.readouterr().out
    fl = pd.read_parquet(flagged / "converge.parquet")
    assert (fl["flag"].fillna("") != "").any()
    assert "* " in printed and "LOW SAMPLE in the rows marked" in printed


def test_converge_token_pooling_follows_the_seed(tiny_dir, tmp_path):
    """The extraction options reach every extract call: token pooling with --seed 1 and 2
    samples different tokens (issue 50: converge was the one call without the seed)."""
    import pandas as pd

    a, b = str(tiny_dir("llama")), str(tiny_dir("gpt2"))
    values = []
    for seed in (1, 2):
        out = tmp_path / f"s{seed}"
        assert main(["converge", "--model", a, "--model", b, "--texts", "builtin:news", "--n",
                     "16", "--pooling", "tokens", "--layers", "2", "--n-null", "20",
                     "--no-heatmap", "--seed", str(seed), "--quiet", "--out", str(out)]) == 0
        df = pd.read_parquet(out / "converge.parquet")
        values.append(df.loc[df.metric == "conv_full", "value"].to_numpy())
    assert not np.allclose(values[0], values[1])


# ------------------------------------------------------------------ contradictions, before work
@pytest.mark.parametrize("case", ["full-merge-lora", "datastore-file", "select-one",
                                  "attach-other-model"])
def test_contradictory_options_are_refused_before_any_work(tiny_dir, tmp_path, monkeypatch,
                                                           capsys, case):
    from support.hostile_inputs import no_model

    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(CORPUS) + "\n")
    model = str(tiny_dir("llama"))
    if case == "attach-other-model":  # a finished run of another model first
        run = tmp_path / "run"
        assert main(["analyze", "--model", str(tiny_dir("gpt2")), "--texts", str(texts),
                     "--k", "4", "--n-null", "20", "--ccr", "1", "--layers", "1", "--quiet",
                     "--out", str(run)]) == 0
        capsys.readouterr()
    no_model(monkeypatch)
    (tmp_path / "afile").write_text("x")
    argv, why = {
        "full-merge-lora": (["train", "--model", model, "--texts", str(texts), "--full",
                             "--merge-lora"], "no adapters to merge"),
        "datastore-file": (["knnlm", "--model", model, "--train-texts", str(texts),
                            "--datastore-dir", str(tmp_path / "afile")], "is a file"),
        "select-one": (["select", "--model", model, "--domain", "math"], "got one"),
        "attach-other-model": (["dispersion", "--model", model, "--texts", str(texts),
                                "--attach", str(tmp_path / "run")], "mix two models"),
    }[case]
    code = main([*argv, "--quiet", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and why in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_dispersion_on_a_small_file_flags_its_correlations_and_says_what_would_do(
        tiny_dir, tmp_path, capsys):
    """A small file gives a handful of groups (and maybe chunks): every correlation over fewer
    than 10 points is flagged in the table and the parquet, and the printed footer says how many chunks
    it found and which --chunk-len would give enough; a file with enough chunks is not."""
    import pandas as pd

    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(" ".join(CORPUS[(i + j) % len(CORPUS)] for j in range(3))
                                 for i in range(5)) + "\n")
    out = tmp_path / "d"
    assert main(["dispersion", "--model", str(tiny_dir("llama")), "--texts", str(small),
                 "--chunk-len", "32", "--n-boot", "50", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    df = pd.read_parquet(out / "dispersion.parquet")
    corr = df[df.metric.str.startswith("corr_")]
    assert ((corr["flag"] == "few_points") == (corr["n"] < 10)).all()
    assert (corr.setting.str.contains("level=group") & (corr["flag"] == "few_points")).any()
    assert "* few_points" in printed and "--chunk-len" in printed and "chunks of 32" in printed
    big = tmp_path / "big.txt"
    big.write_text("\n".join(CORPUS * 40) + "\n")
    out2 = tmp_path / "d2"
    assert main(["dispersion", "--model", str(tiny_dir("llama")), "--texts", str(big),
                 "--chunk-len", "16", "--group-size", "4", "--n-boot", "50", "--quiet",
                 "--out", str(out2)]) == 0
    df2 = pd.read_parquet(out2 / "dispersion.parquet")
    chunk = df2[df2.metric.str.startswith("corr_") & df2.setting.str.contains("level=chunk")]
    assert (chunk["flag"].fillna("") == "").all() and chunk["n"].min() >= 10


def test_a_flagged_run_carries_its_flag_on_every_surface(tiny_path, tmp_path, capsys):
    """One flag rule, every surface (issue 48): an analyze run whose z values rest on too
    little data (9 texts, k = 4 at CCR-1: ``k_rank``; 10 null draws: ``low_null``) carries the
    flag in the printed table (mark + footer), both table files, the manifest (JSON), the
    report (mark + legend), the Reading (no flagged z headlined) and the Python result; the
    same settings on enough texts carry none of it."""
    import pandas as pd

    import lmgeom
    from lmgeom.results.console import FLAG_MARK

    few = tmp_path / "few.txt"
    few.write_text("\n".join(f"{CORPUS[i % len(CORPUS)].replace(chr(10), ' ')} item {i}"
                             for i in range(9)) + "\n")
    out = tmp_path / "flagged"
    assert main(["analyze", "--model", tiny_path, "--texts", str(few), "--k", "4", "--n-null",
                 "10", "--ccr", "0,1", "--layers", "1,2", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = [ln for ln in printed.splitlines() if ln.split()[:1] in (["1"], ["2"], ["final"])]
    assert table and all(f"{FLAG_MARK} " in ln for ln in table), printed  # every row marked
    assert f"{FLAG_MARK} LOW SAMPLE in the rows marked" in printed and "low_null = " in printed
    for df in (pd.read_parquet(out / "layers.parquet"), pd.read_csv(out / "layers.csv",
                                                                    keep_default_na=False)):
        z = df[df.metric == "pga_z"]
        assert (z["flag"].str.contains("low_null")).all()
    flags = json.loads((out / "manifest.json").read_text())["flags"]
    assert flags["low_null"]["rows"] >= 6 and "pga_z" in flags["low_null"]["metrics"]
    html = (out / "report.html").read_text()
    assert 'class="flag"' in html and "LOW SAMPLE in the cells marked" in html
    reading = html.split('id="section-reading"', 1)[1].split("</section>", 1)[0]
    assert "highest PGA z" not in reading and "flagged LOW SAMPLE" in reading
    from lmgeom.experiments import AnalyzeConfig, LayerSweepConfig, TextOptions

    res = AnalyzeConfig(models=(tiny_path,), texts=TextOptions(spec=str(few)),
                        layers=LayerSweepConfig(k=4, n_null=10, ccr=(0, 1), layers="1,2")
                        ).run(work_dir=tmp_path / "api", progress=False)
    z = res.frame[res.frame.metric == "pga_z"]
    assert z["flag"].str.contains("low_null").all()
    import lmgeom.metrics as M  # and the single-layer result object

    acts = lmgeom.extract(lmgeom.load_model(tiny_path), lmgeom.load_texts(str(few)), layers="2")
    r = M.subspace_pga(acts.layer("2"), M.readout_basis(
        lmgeom.load_model(tiny_path).W_U.detach().numpy(), k=4), ccr=0, n_null=10, seed=0)
    assert "low_null" in r.flags and r.warnings
    # the same settings on enough texts and null draws: no mark anywhere
    many = tmp_path / "many.txt"
    many.write_text("\n".join(f"{CORPUS[i % len(CORPUS)].replace(chr(10), ' ')} item {i}"
                              for i in range(48)) + "\n")
    clean = tmp_path / "clean"
    assert main(["analyze", "--model", tiny_path, "--texts", str(many), "--k", "4", "--n-null",
                 "20", "--ccr", "0", "--layers", "1,2", "--pooling", "mean", "--quiet",
                 "--out", str(clean)]) == 0
    printed = capsys.readouterr().out
    assert "LOW SAMPLE" not in printed and FLAG_MARK + " " not in printed
    assert json.loads((clean / "manifest.json").read_text())["flags"] == {}
    assert 'class="flag"' not in (clean / "report.html").read_text()


def test_a_flagged_hardness_run_carries_its_flag_on_every_surface(tiny_path, tmp_path, capsys):
    """hardness on 8 texts: its Spearman (over < 10 texts: few_points) and its decile overlap
    (a quantile of 1 text: small_quantile) carry the flag in the printed lines (mark + footer),
    the tidy table, the manifest and the report (mark + legend in the model-level table)."""
    import pandas as pd

    from lmgeom.results.console import FLAG_MARK

    few = tmp_path / "few.txt"
    few.write_text("\n".join(f"{CORPUS[i % len(CORPUS)].replace(chr(10), ' ')} item {i}"
                             for i in range(8)) + "\n")
    out = tmp_path / "hard"
    assert main(["hardness", "--model", tiny_path, "--texts", str(few), "--quiet",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{FLAG_MARK} Spearman(dispersion, perplexity)" in printed and "[few_points]" in printed
    assert f"{FLAG_MARK} LOW SAMPLE in the lines marked" in printed and "small_quantile" in printed
    df = pd.read_parquet(out / "hardness.parquet")  # the tidy table (the csv is the ranking)
    flags = dict(zip(df.metric, df.flag))
    assert flags["hardness_spearman"] == "few_points"
    assert flags["hardness_decile_overlap"] == "small_quantile"
    man = json.loads((out / "manifest.json").read_text())["flags"]
    assert "hardness_spearman" in man["few_points"]["metrics"]
    html = (out / "report.html").read_text()
    table = html.split('id="table-model-level"', 1)[1].split("</table>", 1)[0]
    assert 'class="flag"' in table and "LOW SAMPLE in the cells marked" in html
