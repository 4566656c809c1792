"""Inputs that silently change meaning become keys or refusals (issue 48): a TransformerLens
``W_U`` layout, k above the readout's rank, an edited ``config.json``, weights that do not cover
their config, a folder without tokenizer files, texts past the model's context, a loaded model
asked for another dtype, layers of the wrong type. Each rule has a planted case that must be
caught and one that must pass."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import lmgeom
from conftest import CORPUS, build_tiny
from lmgeom import metrics as M
from lmgeom.activations.forward import model_identity
from lmgeom.errors import ConfigError, DataError, ModelError


# ------------------------------------------------------------------ readout layout and rank
def test_transformerlens_layout_is_read_with_d_and_refused_without():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((300, 20)) * np.geomspace(5, 0.5, 20)  # (V, d): lm_head.weight
    ref = M.readout_basis(W, 5)
    np.testing.assert_array_equal(M.readout_basis(W.T, 5, d=20), ref)  # (d, V): TransformerLens
    np.testing.assert_array_equal(M.readout_basis(W, 5, d=20), ref)
    np.testing.assert_allclose(M.readout_basis(torch.tensor(W.T), 5, d=20), ref, atol=1e-12)
    with pytest.raises(DataError, match=r"W_U.T|d=20"):
        M.readout_basis(W.T, 5)
    with pytest.raises(DataError, match="neither axis"):
        M.readout_basis(W, 5, d=7)


def test_d_v_layout_is_refused_before_any_work():
    """A 262k-vocabulary W_U in TransformerLens's layout: refused from its shape alone. The
    array is a zero-stride view (8 bytes of memory): touching its data would be the bug."""
    huge = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(640, 262_144), strides=(0, 0))
    with pytest.raises(DataError, match="d_model, d_vocab"):
        M.readout_basis(huge, 100)


def test_k_above_the_rank_of_w_u_is_refused():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((200, 3)) @ rng.standard_normal((3, 16))  # rank 3
    with pytest.raises(DataError, match="rank 3"):
        M.readout_basis(W, 5)
    assert M.readout_basis(W, 3).shape == (16, 3)  # k = rank is a real subspace


# ------------------------------------------------------------------ model folders
def _copy(src, dst, **config_changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config_changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_edited_config_gives_another_cache_key(tiny_dir, tmp_path):
    """Same weights, another config.json: another key (the states differ), never a reuse."""
    src = tiny_dir("llama")
    a = lmgeom.load_model(str(_copy(src, tmp_path / "a")))
    b = lmgeom.load_model(str(_copy(src, tmp_path / "b", rms_norm_eps=0.5)))
    assert a.identity["weights_sha256"] == b.identity["weights_sha256"]
    assert model_identity(a) != model_identity(b)
    ka = lmgeom.extract(a, CORPUS[:4], layers=[2], cache_root=tmp_path / "c")
    kb = lmgeom.extract(b, CORPUS[:4], layers=[2], cache_root=tmp_path / "c")
    assert kb.timings["batches_computed"] > 0  # not answered from a's cache entry
    assert not np.allclose(ka.states, kb.states)
    c = lmgeom.load_model(str(_copy(src, tmp_path / "c2")))  # an identical copy: same key
    assert model_identity(c) == model_identity(a)


@pytest.mark.parametrize(("layers", "what"), [(5, "missing"), (2, "no place")])
def test_weights_that_do_not_cover_the_config_are_refused(tiny_dir, tmp_path, layers, what):
    """3 blocks of weights under a config of 5 (2 blocks would be random) or of 2 (one block
    would be dropped): refused, naming the tensors."""
    folder = _copy(tiny_dir("llama"), tmp_path / "m", num_hidden_layers=layers)
    with pytest.raises(ModelError, match=what) as err:
        lmgeom.load_model(str(folder))
    assert "model.layers." in str(err.value) and "config.json" in str(err.value)


def test_folder_without_tokenizer_files_is_refused_by_name(tiny_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir("llama"), folder)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name in ("vocab.json",
                                                                             "merges.txt"):
            f.unlink()
    with pytest.raises(ModelError, match=r"no tokenizer files.*tokenizer\.json"):
        lmgeom.load_model(str(folder))


# ------------------------------------------------------------------ context, dtype, layers
def test_texts_past_the_context_are_cut_there_with_a_warning(tmp_path, caplog):
    folder = build_tiny(tmp_path / "m", "gpt2")  # n_positions = 128
    model = lmgeom.load_model(str(folder))
    assert model.context_length == 128
    long = " ".join(CORPUS) * 3
    assert len(model.tokenizer(long)["input_ids"]) > 128
    with caplog.at_level(logging.WARNING, logger="lmgeom"):
        over = lmgeom.extract(model, [long, CORPUS[0]], layers=[1], max_length=400, cache=False)
    assert "exceeds the context" in caplog.text and "cut at 128" in caplog.text
    at = lmgeom.extract(model, [long, CORPUS[0]], layers=[1], max_length=128, cache=False)
    np.testing.assert_array_equal(over.states, at.states)
    assert np.isfinite(over.states).all()


def test_loaded_model_is_converted_to_the_dtype_asked_for(tiny_dir):
    model = lmgeom.load_model(str(tiny_dir("llama")))
    assert model.dtype == torch.float32
    same = lmgeom.load_model(model, dtype="bfloat16")
    assert same is model and model.dtype == torch.bfloat16
    lmgeom.load_model(model, dtype="float32")
    assert model.dtype == torch.float32
    with pytest.raises(ConfigError, match="revision"):
        lmgeom.load_model(model, revision="step1000")


@pytest.mark.parametrize("bad", [0.5, [1, 0.5], {"a": 1}, None, True])
def test_layers_of_the_wrong_type_raise_a_typed_error(tiny_dir, bad):
    model = lmgeom.load_model(str(tiny_dir("llama")))
    with pytest.raises(ConfigError, match="layers"):
        lmgeom.extract(model, CORPUS[:2], layers=bad, cache=False)
    assert model.resolve_points([np.int64(1), "final"]) == ("1", "final")


# ------------------------------------------------------------------ paths, before the model
@pytest.mark.parametrize("case", ["below-a-file", "long-name", "symlink-loop", "unwritable"])
def test_bad_out_paths_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys, case):
    """Each refused in one line naming the true reason, before any model loads (a loader that
    fails the test if called stands in for the model)."""
    import os

    from support.hostile_inputs import no_model

    from lmgeom.cli import main

    no_model(monkeypatch)
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(CORPUS[:8]) + "\n")
    if case == "below-a-file":
        (tmp_path / "afile").write_text("x")
        out, why = tmp_path / "afile" / "run", "is a file, not a folder"
    elif case == "long-name":
        out, why = tmp_path / ("r" * 300), "more than the 255"
    elif case == "symlink-loop":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        out, why = tmp_path / "loop" / "run", "loop"
    else:
        if os.geteuid() == 0:  # root passes permission bits: a pseudo file system refuses it
            out, why = Path("/proc") / "lmgeom-run", "may not write"
        else:
            ro = tmp_path / "ro"
            ro.mkdir()
            ro.chmod(0o500)
            out, why = ro / "run", "may not write"
    code = main(["analyze", "--model", "smollm2-135m", "--texts", str(texts), "--quiet",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and why in err and "Traceback" not in err, err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err


# ------------------------------------------------------------------ one flag, every surface
def test_a_flagged_z_is_marked_in_the_report_and_never_headlines_the_reading(tmp_path):
    """The highest z sits at a flagged layer: the Reading does not headline it and says why,
    the report's table marks the cell and explains the mark; the same table unflagged
    headlines it (the planted case that must pass)."""
    import re

    from support.report import collapse_curve, pga_rows

    from lmgeom.report.html import write_report
    from lmgeom.report.reading import describe_pga
    from lmgeom.results.table import frame

    z = collapse_curve()
    z[0] = 40.0  # the peak, at a layer computed from too few distinct states
    rows = pga_rows("toy", {1: z})
    for r in rows:
        if r["metric"] == "pga_z" and r["layer"] == "0":
            r["flag"] = "k_rank"
    df = frame(rows)
    lines = describe_pga(df)
    assert "flagged LOW SAMPLE (k_rank" in lines[0] and "leaves them out" in lines[0]
    assert not any("z = 40.0" in ln for ln in lines)
    page = write_report(tmp_path / "r", df, {"models": [{"name": "toy", "k_note":
                                                         "k = 4 instead of 100"}]})
    html = page.read_text()
    assert re.search(r'class="num flagged">[^<]*<abbr class="flag"', html)
    assert "LOW SAMPLE in the cells marked" in html and "k = 4 instead of 100" in html
    clean = frame([{**r, "flag": ""} for r in rows])
    assert any("z = 40.0" in ln for ln in describe_pga(clean))
    assert "flagged" not in write_report(tmp_path / "c", clean, {}).read_text().split(
        "<style>")[1].split("</style>")[1]


def test_a_cache_root_that_cannot_be_created_is_a_typed_error(tiny_dir, tmp_path):
    from lmgeom.errors import CacheError

    (tmp_path / "afile").write_text("x")
    model = lmgeom.load_model(str(tiny_dir("llama")))
    with pytest.raises(CacheError, match="cache_root.*is a file"):
        lmgeom.extract(model, CORPUS[:2], layers=[1], cache_root=tmp_path / "afile" / "c")


def test_extract_leaves_no_lock_file_beside_its_outputs(tiny_dir, tmp_path):
    from lmgeom.cli import main

    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(CORPUS[:6]) + "\n")
    out = tmp_path / "outs" / "acts"
    assert main(["extract", "--model", str(tiny_dir("llama")), "--texts", str(texts),
                 "--layers", "1", "--quiet", "--out", str(out)]) == 0
    left = sorted(p.name for p in out.parent.iterdir())
    assert left == ["acts.json", "acts.safetensors"], left


# ------------------------------------------------------------------ low-sample floors beyond PGA

def _hardness(n: int, k: int):
    import pandas as pd

    from lmgeom.experiments.hardness import HardnessResult

    return HardnessResult(ranking=pd.DataFrame({"dispersion": np.linspace(0.2, 0.5, n)}), spearman=(-0.3, -0.6, 0.1), overlap=0.2,
                          null=np.linspace(0, 0.3, 20), k=k, n=n, n_skipped=0, layer="final")


@pytest.mark.parametrize("n,k,want", [(8, 1, {"few_points", "small_quantile"}),
                                      (40, 4, {"small_quantile"}), (64, 6, set())])
def test_hardness_rows_carry_the_floors(n, k, want):
    """A hardness Spearman over fewer than 10 texts is flagged few_points; an overlap share
    over a quantile of fewer than 5 texts small_quantile; n = 64 at q = 0.1 (k = 6) neither."""
    from lmgeom.experiments.hardness import HardnessConfig, hardness_rows

    rows = {r["metric"]: r["flag"] for r in hardness_rows(
        _hardness(n, k), model="m", texts_label="t", config=HardnessConfig())
        if r["metric"].startswith("hardness_")}
    got = {f for f in rows.values() if f}
    assert got == want
    assert rows["hardness_spearman"] == ("few_points" if n < 10 else "")
    assert rows["hardness_overlap_p"] == ("small_quantile" if k < 5 else "")


@pytest.mark.parametrize("per_class,flagged", [(4, True), (12, False)])
def test_probe_rows_flag_a_small_class(per_class, flagged, recwarn):
    """A probe class with fewer than 10 texts flags every probe row of the layer (and warns);
    12 per class does not."""
    from types import SimpleNamespace

    from lmgeom.experiments.probes import probe_rows

    rng = np.random.default_rng(0)
    labels = ["a"] * per_class + ["b"] * per_class + ["c"] * 12
    states = rng.normal(size=(1, len(labels), 8)).astype(np.float32)
    acts = SimpleNamespace(layers=("1",), states=states, labels=labels, row_text=None)
    model = SimpleNamespace(name="m", n_blocks=2, point_index=lambda lab: 1)
    rows = probe_rows(model, acts, folds=3, progress=False)
    assert {r["flag"] for r in rows} == ({"small_class"} if flagged else {""})
    assert any("smallest probe class" in str(w.message) for w in recwarn) == flagged


def test_flag_codes_name_their_floor():
    """Every flag code a table can carry is described, with its number (so the footer under a
    table says what the mark means)."""
    from lmgeom.metrics import sample_size as S

    for code, floor in (("few_points", S.MIN_CORR_POINTS), ("small_quantile",
                        S.MIN_QUANTILE_TEXTS), ("few_tokens", S.MIN_EVAL_TOKENS),
                        ("small_class", S.MIN_PROBE_CLASS)):
        assert str(floor) in S.describe_flag(code)
    assert S.corr_flag(S.MIN_CORR_POINTS - 1) == "few_points" and S.corr_flag(10) == ""


def test_cli_log_warnings_are_one_line_in_the_common_format_once(capsys):
    """Under the CLI every warning a module logs reads ``lmgeom CMD: warning: ...`` on one line
    (the format of the LowSampleWarnings), and a repeated one is said once per run (issue 49)."""
    import logging

    from lmgeom import cli

    root = logging.getLogger()
    saved = root.handlers[:]
    for h in saved:
        root.removeHandler(h)
    try:
        cli._configure_logging(logging.WARNING, "lmgeom hardness")
        log = logging.getLogger("lmgeom.activations.core")
        for _ in range(3):
            log.warning("texts are cut\nat 128")
        log.info("not shown")
        cli._configure_logging(logging.WARNING, "lmgeom dispersion")  # a second main() call
        log.warning("another")
        assert capsys.readouterr().err.splitlines() == [
            "lmgeom hardness: warning: texts are cut at 128",
            "lmgeom dispersion: warning: another"]
    finally:
        for h in [h for h in root.handlers if getattr(h, "lmgeom_cli", False)]:
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)


def test_low_sample_warnings_point_at_the_users_line():
    """A LowSampleWarning from deep inside lmgeom is attributed to the user's own call (this
    file), not to a library line, so Python's filter shows it once per user line (issue 49)."""
    import warnings

    from lmgeom.errors import LowSampleWarning

    rng = np.random.default_rng(0)
    X, W = rng.normal(size=(8, 16)), rng.normal(size=(50, 16))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        M.subspace_pga(X, M.readout_basis(W, k=4), ccr=0, n_null=10, seed=0)
    low = [w for w in got if issubclass(w.category, LowSampleWarning)]
    assert low and all(w.filename == __file__ for w in low), [(w.filename, w.lineno) for w in low]
