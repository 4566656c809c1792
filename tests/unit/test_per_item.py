"""Per-item outputs: ``--log-samples`` writes one row per text, and every column agrees with an
explicit computation (the perplexity with ``lmgeom.lm.perplexity``, the readout share with a
plain projection, truncation with the tokenizer)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.per_item import corpus

from lmgeom.cli import main


def test_log_samples_refuses_token_pooling(tiny_dir, tmp_path, capsys):
    texts = corpus(tmp_path, n=8)
    rc = main(["analyze", "--model", str(tiny_dir("llama")), "--texts", str(texts), "--k", "4",
               "--n-null", "5", "--ccr", "1", "--pooling", "tokens", "--log-samples", "--quiet",
               "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "pooling last or mean" in capsys.readouterr().err


@pytest.mark.parametrize("spec, want", [
    ("dtype=bfloat16,revision=step1000,trust_remote_code=false",
     {"dtype": "bfloat16", "revision": "step1000", "trust_remote_code": False}),
    ("torch_dtype=bf16, device=cpu", {"dtype": "bfloat16", "device": "cpu"}),
    ("trust_remote_code=True", {"trust_remote_code": True}),
])
def test_model_args_parse(spec, want):
    from lmgeom.commands.options import parse_model_args

    assert parse_model_args(spec) == want


def test_model_args_merge_and_contradict():
    from lmgeom.cli import build_parser
    from lmgeom.commands.options import apply_model_args
    from lmgeom.errors import ConfigError

    p = build_parser()
    a = p.parse_args(["analyze", "--model-args", "dtype=bfloat16,revision=step64"])
    apply_model_args(a)
    assert (a.dtype, a.revision) == ("bfloat16", "step64")
    a = p.parse_args(["sweep", "--model", "org/m", "--model-args", "revision=step64"])
    apply_model_args(a)
    assert a.revision == ["step64"]
    a = p.parse_args(["pga", "--model-args", "pretrained=gemma3-270m"])
    apply_model_args(a)
    assert a.model == "gemma3-270m"
    for argv in (["pga", "--dtype", "float16", "--model-args", "dtype=bfloat16"],
                 ["pga", "--model-args", "colour=red"],
                 ["pga", "--model-args", "dtype"],
                 ["pga", "--model-args", "trust_remote_code=maybe"],
                 ["sweep", "--model", "o/m", "--revision", "a", "--model-args", "revision=b"]):
        with pytest.raises(ConfigError):
            apply_model_args(p.parse_args(argv))


def test_ppl_cli_per_token_and_log_samples(tiny_dir, tmp_path, capsys):
    texts = corpus(tmp_path, n=10)
    out = tmp_path / "ppl.csv"
    assert main(["ppl", "--model", str(tiny_dir("llama")), "--texts", str(texts), "--max-length",
                 "24", "--per-token", "--log-samples", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    tok, sam = tmp_path / "ppl.tokens.parquet", tmp_path / "ppl.samples.parquet"
    assert str(tok) in printed and str(sam) in printed
    t, s = pd.read_parquet(tok), pd.read_parquet(sam)
    per_text = pd.read_csv(out, dtype={"id": str})
    assert list(s["id"]) == list(per_text["id"]) and len(s) == 10
    np.testing.assert_allclose(s["perplexity"], per_text["perplexity"], rtol=1e-6)
    mean = t.groupby("id")["nll"].mean().loc[s["id"]].to_numpy()
    np.testing.assert_allclose(mean, s["nll"], rtol=1e-9)
    assert s["truncated"].any() and (s["n_tokens"] <= 24).all()

