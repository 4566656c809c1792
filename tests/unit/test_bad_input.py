"""Bad input: every user mistake gives one clear line on the CLI (exit 2, no traceback) and a
typed exception from the library. One test per case from the reliability issue."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support.bad_input import cli_error, corpus, tiny_path  # noqa: F401 (fixtures)

import lmgeom
from conftest import CORPUS
from lmgeom import metrics as M
from lmgeom.errors import ConfigError, DataError, ModelError


def test_whitespace_texts_are_dropped_and_counted(tmp_path):
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join(json.dumps({"text": t}) for t in ["hello there", "  ", "", "more text"]) + "\n")
    ts = lmgeom.load_texts(str(p))
    assert len(ts) == 2 and ts.n_dropped == 2


def test_non_utf8_file(tmp_path, capsys):
    p = tmp_path / "latin1.txt"
    p.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    line = cli_error(["texts", str(p)], capsys)
    assert "UTF-8" in line or "utf-8" in line


def test_bad_jsonl_line_names_the_line(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok"}\n{"text": "ok too"}\n{not json\n')
    line = cli_error(["texts", str(p)], capsys)
    assert "line 3" in line


def test_missing_text_column(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n")
    line = cli_error(["texts", str(p), "--text-column", "body"], capsys)
    assert "body" in line


# ------------------------------------------------------------------ models
def test_unknown_bundled_name_lists_known(capsys):
    line = cli_error(["extract", "--model", "smollm2-999m"], capsys)
    assert "smollm2-135m" in line and "gemma3-270m" in line


def test_folder_that_is_not_a_model(tmp_path, capsys):
    assert "is not a model" in cli_error(["extract", "--model", str(tmp_path)], capsys)


def test_corrupt_safetensors(tiny_path, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_path, bad)
    st = bad / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 3])
    with pytest.raises(ModelError, match="corrupt or truncated"):
        lmgeom.load_model(str(bad))
    assert "corrupt or truncated" in cli_error(["extract", "--model", str(bad)], capsys)


def test_corrupt_gguf(tmp_path, capsys):
    p = tmp_path / "broken.gguf"
    p.write_bytes(b"GGUF" + b"\x00" * 64)
    line = cli_error(["extract", "--model", str(p)], capsys)
    assert "broken.gguf" in line


def test_encoder_without_readout(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32)
    BertModel(cfg).save_pretrained(tmp_path / "enc")
    line = cli_error(["extract", "--model", str(tmp_path / "enc")], capsys)
    assert "no causal-LM readout head" in line


def test_layers_out_of_range(tiny_path, corpus, capsys):
    line = cli_error(["extract", "--model", tiny_path, "--texts", corpus, "--layers", "0,9"], capsys)
    assert "out of range" in line


def test_nan_states_name_the_layer(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = lmgeom.load_model(str(tiny_dir("llama")))
    with torch.no_grad():
        model.blocks[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(DataError, match=r"layer 2: .*non-finite"):
        lmgeom.extract(model, CORPUS[:3], cache=False)
    del AutoModelForCausalLM


# ------------------------------------------------------------------ metric options
@pytest.mark.parametrize("extra, needle", [
    (["--k", "32"], "does not fit 12 texts"),  # refused before the model loads
    (["--k", "0"], "k"),
    (["--k", "4", "--n-null", "1"], "--n-null must be >= 2"),
    (["--k", "4", "--ccr", "40"], "CCR"),
])
def test_pga_option_errors(extra, needle, tiny_path, corpus, capsys):
    line = cli_error(["pga", "--model", tiny_path, "--texts", corpus, "--layers", "2", "--quiet", *extra], capsys)
    assert needle.lower() in line.lower()


def test_library_raises_typed_errors():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 8))
    B = np.linalg.qr(rng.standard_normal((8, 3)))[0]
    with pytest.raises(ConfigError):
        M.subspace_pga(X, np.eye(8), n_null=10)  # k == d
    with pytest.raises(ConfigError):
        M.subspace_pga(X, B, n_null=1)
    with pytest.raises(ConfigError):
        M.subspace_pga(X, B, ccr=20)
    with pytest.raises(DataError):
        M.subspace_pga(np.vstack([X[:1]] * 20), B, n_null=10)  # identical texts
    Xn = X.copy()
    Xn[3, 2] = np.nan
    with pytest.raises(DataError):
        M.subspace_pga(Xn, B, n_null=10)
    with pytest.raises(DataError):
        M.subspace_pga(X[:3], B, n_null=10)  # N < 4


def test_identical_texts_give_a_clear_error(tiny_path, tmp_path, capsys):
    p = tmp_path / "same.txt"
    p.write_text("the same line\n" * 10)
    line = cli_error(["pga", "--model", tiny_path, "--texts", str(p), "--k", "4", "--layers", "1",
                       "--n-null", "5", "--quiet"], capsys)
    assert "layer 1" in line


def test_single_text_corpus(tiny_path, tmp_path, capsys):
    p = tmp_path / "one.txt"
    p.write_text("only one text here\n")
    line = cli_error(["pga", "--model", tiny_path, "--texts", str(p), "--k", "4", "--layers", "1",
                       "--n-null", "5", "--quiet"], capsys)
    assert "1 texts are too few" in line and "--n 5 or more" in line

