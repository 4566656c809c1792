"""Hostile command lines (issue 26): every user mistake ends in exit 2 and ONE stderr line
``lmgeom CMD: error: ...`` naming the input and the fix, with no traceback; an unexpected
exception in one line and exit 1 (``-v`` logs its traceback). Options, devices, the
environment and optional packages are checked *before* any model is loaded: the ``no_work``
fixture makes loading a model fail the test, and the option error must still come out.

Tiny random models and hand-made files only: nothing here loads a bundled model.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys

import numpy as np
import pytest
import torch

import lmgeom
from conftest import CORPUS
from lmgeom.cli import main
from lmgeom.errors import ConfigError, ModelError


def _fail(argv, capsys, *, rc: int = 2) -> str:
    """Run ``lmgeom argv`` in-process; assert the exit code and the one-line contract; return
    the line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == rc, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    cmd = next(a for a in argv if not a.startswith("-"))
    assert lines[0].startswith(f"lmgeom {cmd}"), lines[0]
    assert ": error: " in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def no_work(monkeypatch):
    """Loading (or converting) any model fails the test: what is checked "before working"
    must come out before this point."""
    from lmgeom.models import load

    def boom(*args, **kwargs):
        raise AssertionError("should not be reached: a model was loaded")

    monkeypatch.setattr(load, "_from_pretrained", boom)


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> str:
    return str(tiny_dir("llama"))


@pytest.fixture()
def corpus(tmp_path) -> str:
    p = tmp_path / "corpus.txt"
    p.write_text("\n".join(t.replace("\n", " ") for t in CORPUS[:12]) + "\n")
    return str(p)


# ------------------------------------------------------------------ option values (argparse)
OPTION_CASES = [
    # (argv after the command's model/texts, needle in the line)
    (["extract", "--seed", "-1", "--n", "3"], "--seed must be in 0..4294967295 (got -1)"),
    (["pga", "--seed", "-7"], "--seed must be"),
    (["ppl", "--seed", "-1", "--n", "2"], "--seed must be"),
    (["analyze", "--seed", "-1"], "--seed must be"),
    (["texts", "builtin:news", "--limit", "2", "--seed", "-5"], "--seed must be"),
    (["train", "--seed", "-1"], "--seed must be"),
    (["extract", "--n", "0"], "--n must be >= 1 (got 0)"),
    (["analyze", "--n", "-3"], "--n must be >= 1 (got -3)"),
    (["extract", "--n", "abc"], "--n must be an integer, got 'abc'"),
    (["extract", "--batch-size", "0"], "--batch-size must be >= 1 (got 0)"),
    (["extract", "--max-length", "0"], "--max-length must be >= 1"),
    (["ppl", "--max-length", "1"], "--max-length must be >= 2"),
    (["pga", "--k", "0"], "--k must be >= 1"),
    (["analyze", "--n-null", "1"], "--n-null must be >= 2 (got 1)"),
    (["converge", "--k", "-1"], "--k must be >= 1"),
    (["probe", "--folds", "1"], "--folds must be >= 2"),
    (["knnlm", "--k", "0"], "--k must be >= 1"),
    (["knnlm", "--lambda", "1.5"], "--lambda must be in [0, 1] (got 1.5)"),
    (["knnlm", "--lambda", "nan"], "--lambda must be in [0, 1] (got nan)"),
    (["hardness", "--quantile", "0.9"], "--quantile must be in (0, 0.5]"),
    (["dispersion", "--n-boot", "5"], "--n-boot must be >= 10"),
    (["clusters", "--max-members", "1"], "--max-members must be >= 2"),
    (["select", "--n-eval", "0"], "--n-eval must be >= 1"),
    (["sweep", "--n-null", "0"], "--n-null must be >= 2"),
    (["train", "--heldout-fraction", "1"], "--heldout-fraction must be in (0, 1) (got 1)"),
    (["train", "--lr", "0"], "--lr must be > 0"),
    (["train", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
    (["suite", "train", "--out", "never-written", "--seq-len", "1"], "--seq-len must be >= 2"),
    (["analyze", "--cpus-per-job", "0"], "--cpus-per-job must be > 0"),
    (["analyze", "--retries", "-1"], "--retries must be >= 0"),
    (["texts", "--width", "0"], "--width must be >= 1"),
    (["extract", "--dtype", "float8"], "--dtype: invalid choice: 'float8'"),
    (["extract", "--bogus-option"], "unrecognized arguments: --bogus-option"),
    (["extract", "--n"], "--n: expected one argument"),
]


@pytest.mark.parametrize("argv, needle", OPTION_CASES, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_bad_option_value_is_one_line_before_any_work(argv, needle, no_work, capsys):
    line = _fail(argv, capsys)
    assert needle in line, line
    assert f"see `lmgeom {argv[0]}" in line  # the fix: where the accepted values are


def test_stride_not_below_max_length_before_any_work(no_work, capsys):
    line = _fail(["ppl", "--max-length", "64", "--stride", "64"], capsys)
    assert "--stride must be smaller than --max-length" in line


def test_api_negative_seed_is_a_config_error():
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        lmgeom.load_texts("builtin:news", limit=2, seed=-1)


def test_n_zero_is_named_as_n_not_limit(no_work, capsys):
    line = _fail(["extract", "--n", "0"], capsys)
    assert "limit" not in line and "--n must be >= 1 (got 0)" in line


# ------------------------------------------------------------------ devices
def _missing_devices() -> list[tuple[str, str]]:
    cases = [("--device", "banana"), ("--device", "cuda:99"), ("--device", "meta")]
    if not torch.cuda.is_available():
        cases.append(("--device", "cuda"))
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        cases.append(("--device", "mps"))
    return cases


@pytest.mark.parametrize("option, value", _missing_devices())
def test_device_this_machine_lacks(option, value, tiny, corpus, no_work, capsys):
    line = _fail(["extract", "--model", tiny, "--texts", corpus, option, value], capsys)
    assert f"{option} {value}" in line or f"{option} {value!r}" in line
    assert "cpu" in line  # the fix


@pytest.mark.parametrize("cmd", ["pga", "analyze", "probe"])
@pytest.mark.parametrize("value", ["banana", "cuda:99"])
def test_metrics_device_is_checked_before_extraction(cmd, value, tiny, corpus, no_work, capsys):
    line = _fail([cmd, "--model", tiny, "--texts", corpus, "--metrics-device", value], capsys)
    assert "--metrics-device" in line and value in line


def test_device_map_that_is_not_a_device(tiny, no_work, capsys):
    line = _fail(["extract", "--model", tiny, "--device-map", "banana"], capsys)
    assert "--device-map" in line and "auto" in line


def test_api_device_errors_are_config_errors(tiny):
    with pytest.raises(ConfigError, match="banana"):
        lmgeom.load_model(tiny, device="banana")
    with pytest.raises(ConfigError, match="cuda:99"):
        lmgeom.load_model(tiny, device="cuda:99")


# ------------------------------------------------------------------ GGUF files
def _write_gguf(path) -> bytes:
    import gguf
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_token_list(["a", "b", "c", "dd"] * 50)
    w.add_tensor("token_embd.weight", np.ones((16, 8), np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.ones((8, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


GGUF_CASES = {
    "empty": (lambda whole: b"", "is empty (0 bytes)"),
    "random bytes": (lambda whole: bytes(np.random.default_rng(0).integers(0, 256, 4096,
                                                                            dtype=np.uint8)),
                     "is not a GGUF file"),
    "magic only": (lambda whole: b"GGUF", "truncated or corrupt"),
    "cut in the counts": (lambda whole: whole[:20], "truncated or corrupt"),
    "cut in the metadata": (lambda whole: whole[:200], "truncated or corrupt"),
    "cut in the tensor table": (lambda whole: whole[:len(whole) - 900], "truncated"),
    "cut in the tensor data": (lambda whole: whole[:-100], "its tensors need"),
    "version 99": (lambda whole: whole[:4] + (99).to_bytes(4, "little") + whole[8:],
                   "GGUF version 99"),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_broken_gguf_is_one_line_and_never_converted(case, tmp_path, corpus, no_work, caplog,
                                                      capsys):
    make, needle = GGUF_CASES[case]
    whole = _write_gguf(tmp_path / "whole.gguf")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(make(whole))
    with caplog.at_level(logging.WARNING):
        line = _fail(["extract", "--model", str(bad), "--texts", corpus], capsys)
    assert "broken.gguf" in line and needle in line, line
    assert "re-download" in line or "convert" in line  # the fix
    assert not any("dequantizing" in r.getMessage() for r in caplog.records)  # no 2nd line
    with pytest.raises(ModelError, match=needle.split(" (")[0]):
        lmgeom.load_model(str(bad))


def test_whole_gguf_passes_the_header_check(tmp_path):
    from lmgeom.models.checks import check_gguf_file

    _write_gguf(tmp_path / "ok.gguf")
    check_gguf_file(tmp_path / "ok.gguf")  # no exception


# ------------------------------------------------------------------ model folders
def _folder(tiny, tmp_path, name="m"):
    dst = tmp_path / name
    shutil.copytree(tiny, dst)
    return dst


def _edit_config(folder, **change):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))


FOLDER_CASES = {
    "invalid json": (lambda f: (f / "config.json").write_text('{"model_type": "llama",'),
                     "is not valid JSON (line"),
    "json list": (lambda f: (f / "config.json").write_text("[1, 2]"), "holds a JSON list"),
    "no model_type": (lambda f: (f / "config.json").write_text('{"hidden_size": 8}'),
                      "has no model_type"),
    "unknown architecture": (lambda f: _edit_config(f, model_type="no_such_arch",
                                                    architectures=["NoSuchForCausalLM"]),
                             "model_type 'no_such_arch' is an architecture"),
    "architectures not a list": (lambda f: _edit_config(f, architectures="LlamaForCausalLM"),
                                 "architectures must be a list"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "has no weight files"),
    "encoder-decoder": (lambda f: _edit_config(f, model_type="t5", architectures=None),
                        "no causal-LM readout head"),
    "wrong value type": (lambda f: _edit_config(f, hidden_size="abc"), "hidden_size"),
    "impossible shape": (lambda f: _edit_config(f, num_attention_heads=0), "config"),
}


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_broken_model_folder(case, tiny, tmp_path, corpus, capsys):
    make, needle = FOLDER_CASES[case]
    folder = _folder(tiny, tmp_path)
    make(folder)
    line = _fail(["extract", "--model", str(folder), "--texts", corpus], capsys)
    assert needle in line, line
    with pytest.raises(ModelError):
        lmgeom.load_model(str(folder))


@pytest.mark.parametrize("case", ["invalid json", "unknown architecture", "no weights"])
def test_broken_folder_is_refused_before_transformers_runs(case, tiny, tmp_path, no_work,
                                                           capsys):
    make, needle = FOLDER_CASES[case]
    folder = _folder(tiny, tmp_path)
    make(folder)
    assert needle in _fail(["extract", "--model", str(folder)], capsys)


# ------------------------------------------------------------------ environment variables
ENV_CASES = [
    ("LMGEOM_FRAME_CACHE_MB", "abc"),
    ("LMGEOM_FRAME_CACHE_MB", "-5"),
    ("LMGEOM_FRAME_CACHE_MB", "nan"),
    ("LMGEOM_TEST_HOLD_S", "soon"),
]


@pytest.mark.parametrize("name, value", ENV_CASES)
def test_bad_environment_value(name, value, monkeypatch, no_work, capsys):
    monkeypatch.setenv(name, value)
    line = _fail(["pga", "--texts", "builtin:news"], capsys)
    assert f"{name}={value!r}" in line and "unset it" in line


def test_env_helpers_raise_config_error_naming_the_variable(monkeypatch):
    from lmgeom import _env
    from lmgeom.metrics.geometry import _frame_cache_budget

    monkeypatch.setenv("LMGEOM_FRAME_CACHE_MB", "abc")
    with pytest.raises(ConfigError, match="LMGEOM_FRAME_CACHE_MB"):
        _frame_cache_budget()
    monkeypatch.setenv("LMGEOM_FRAME_CACHE_MB", " 64 ")
    assert _env.frame_cache_mb() == 64.0
    monkeypatch.setenv("LMGEOM_X_TEST", "1.5")
    with pytest.raises(ConfigError, match="LMGEOM_X_TEST='1.5' is not an integer"):
        _env.env_int("LMGEOM_X_TEST", 3)
    monkeypatch.setenv("LMGEOM_X_TEST", "")
    assert _env.env_int("LMGEOM_X_TEST", 3) == 3


# ------------------------------------------------------------------ optional packages
DEP_CASES = [
    ("datasets", ["extract", "--format", "hf"], "pip install 'lmgeom[hf]'"),
    ("datasets", ["texts", "hf:wikitext:wikitext-2-raw-v1"], "pip install 'lmgeom[hf]'"),
    ("datasets", ["analyze", "--texts", "hf:wikitext"], "pip install 'lmgeom[hf]'"),
    ("faiss", ["knnlm"], "pip install 'lmgeom[knn]'"),
    ("peft", ["train"], "pip install 'lmgeom[train]'"),
    ("ray", ["analyze", "--engine", "ray"], "pip install 'lmgeom[ray]'"),
    ("ray", ["extract", "--engine", "ray"], "pip install 'lmgeom[ray]'"),
]


@pytest.mark.parametrize("module, argv, needle", DEP_CASES)
def test_missing_optional_package_is_named_before_any_work(module, argv, needle, monkeypatch,
                                                           no_work, capsys):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    line = _fail(argv, capsys)
    assert f"'{module}'" in line and needle in line, line


def test_train_full_needs_no_peft(monkeypatch, no_work, capsys):
    """--full does not need peft, so its absence must not stop the run early (it goes on to
    the model load, which the fixture turns into the unexpected-error path)."""
    monkeypatch.setitem(sys.modules, "peft", None)
    code = main(["train", "--full", "--texts", "builtin:news", "--steps", "1"])
    err = capsys.readouterr().err
    assert "peft" not in err and code in (1, 2)


# ------------------------------------------------------------------ --revision
@pytest.mark.parametrize("kind", ["bundled", "folder", "gguf"])
def test_revision_on_a_model_that_is_not_on_the_hub(kind, tiny, tmp_path, no_work, capsys):
    spec = {"bundled": "smollm2-135m", "folder": tiny, "gguf": str(tmp_path / "m.gguf")}[kind]
    line = _fail(["extract", "--model", spec, "--revision", "step1000"], capsys)
    assert "--revision applies to hub models only" in line and spec in line
    assert {"bundled": "a bundled model", "folder": "a local folder",
            "gguf": "a .gguf file"}[kind] in line


def test_api_revision_on_a_folder_warns(tiny, caplog):
    with caplog.at_level(logging.WARNING):
        lm = lmgeom.load_model(tiny, revision="step1", device="cpu")
    assert lm is not None
    assert any("revision 'step1' ignored" in r.getMessage() for r in caplog.records)


def test_model_source_kinds(tiny, tmp_path):
    from lmgeom.models.load import model_source

    assert model_source("smollm2-135m") == "bundled"
    assert model_source(tiny) == "folder"
    assert model_source(str(tmp_path / "x.gguf")) == "gguf"
    assert model_source("EleutherAI/pythia-160m") == "hub"
    assert model_source("./no/such/dir") == "missing"
    assert model_source("nonsense") == "unknown"


# ------------------------------------------------------------------ models --json
def test_models_json_names_are_valid_model_values(capsys):
    from lmgeom.models.bundled import BUNDLED, DEFAULT_MODEL

    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(BUNDLED)  # plain names, usable as --model
    assert [r["name"] for r in rows if r["default"]] == [DEFAULT_MODEL]
    assert all(isinstance(r["installed"], bool) for r in rows)
    assert main(["models"]) == 0
    assert f"{DEFAULT_MODEL} (default)" in capsys.readouterr().out  # the table keeps the marker


# ------------------------------------------------------------------ the last line of defence
def _raise(exc):
    def run(args):
        raise exc

    return run


def test_unexpected_exception_is_one_line_exit_1(monkeypatch, capsys):
    import lmgeom.commands.texts as texts_cmd

    monkeypatch.setattr(texts_cmd, "run", _raise(RuntimeError("kaboom\nsecond line")))
    line = _fail(["texts"], capsys, rc=1)
    assert "unexpected RuntimeError: kaboom second line" in line
    assert "rerun with -v to see the traceback" in line


def test_unexpected_exception_with_v_logs_the_traceback(monkeypatch, capsys, caplog):
    import lmgeom.commands.texts as texts_cmd

    monkeypatch.setattr(texts_cmd, "run", _raise(KeyError("column")))
    with caplog.at_level(logging.INFO):
        code = main(["-v", "texts"])
    err = capsys.readouterr().err
    assert code == 1 and "unexpected KeyError" in err
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)


def test_multi_line_user_error_is_printed_on_one_line(monkeypatch, capsys):
    import lmgeom.commands.texts as texts_cmd

    monkeypatch.setattr(texts_cmd, "run", _raise(ConfigError("first part\n\nsecond part")))
    assert "first part second part" in _fail(["texts"], capsys)


def test_non_disk_oserror_is_unexpected_not_a_traceback(monkeypatch, capsys):
    import lmgeom.commands.texts as texts_cmd

    monkeypatch.setattr(texts_cmd, "run", _raise(ConnectionResetError(104, "reset by peer")))
    assert "unexpected ConnectionResetError" in _fail(["texts"], capsys, rc=1)


def test_disk_full_stays_exit_2(monkeypatch, capsys):
    import errno

    import lmgeom.commands.texts as texts_cmd

    monkeypatch.setattr(texts_cmd, "run",
                        _raise(OSError(errno.ENOSPC, "No space left on device", "/x/y")))
    line = _fail(["texts"], capsys)
    assert "cannot write /x/y" in line


def test_out_of_memory_names_the_fix(monkeypatch, capsys):
    import lmgeom.commands.texts as texts_cmd

    class OutOfMemoryError(RuntimeError):
        pass

    monkeypatch.setattr(texts_cmd, "run", _raise(OutOfMemoryError("CUDA out of memory")))
    assert "--batch-size" in _fail(["texts"], capsys)


def test_keyboard_interrupt_stays_130(monkeypatch, capsys):
    import lmgeom.commands.texts as texts_cmd

    monkeypatch.setattr(texts_cmd, "run", _raise(KeyboardInterrupt()))
    assert main(["texts"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_help_still_exits_0(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["extract", "--help"])
    assert exc.value.code == 0
