"""The CLI: help for every command, one-line errors for user mistakes, no tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lmgeom.cli import COMMANDS, build_parser, main


def test_every_command_has_help(capsys):
    parser = build_parser()
    names = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {"analyze", "pga", "extract", "models", "texts"} <= names
    for name in names:
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "usage: lmgeom" in out and len(out) > 200
    assert set(COMMANDS) >= names


def test_models_lists_bundled(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "gemma3-270m" in out and "Apache-2.0" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["extract", "--model", "no-such-model"], "unknown model 'no-such-model'; bundled models: smollm2-135m"),
        (["extract", "--model", "./missing/folder"], "does not exist"),
        (["extract", "--texts", "/nonexistent/file.txt"], "no such file: /nonexistent/file.txt"),
    ],
)
def test_user_mistakes_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_not_a_model_folder(tmp_path, capsys):
    assert main(["extract", "--model", str(tmp_path)]) == 2
    assert "is not a model" in capsys.readouterr().err


def test_no_traceback_in_a_real_process(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lmgeom.cli", "pga", "--model", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "unknown model" in r.stderr


def test_closed_pipe_is_quiet():
    """``lmgeom texts builtin:news ... | head -1``: the reader closes the pipe while the
    command still writes (~300 kB, beyond the pipe buffer); no traceback, exit 141."""
    p = subprocess.Popen([sys.executable, "-m", "lmgeom", "texts", "builtin:news", "--show",
                          "100000", "--width", "1000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # what head does after its line
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert p.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_converge_cli_on_two_tiny_architectures(tiny_dir, tmp_path, capsys):
    """``lmgeom converge`` (an experiment since the redesign) writes the run folder: matched
    layer rows with full / readout / null, the heatmap and the report."""
    import pandas as pd

    a, b = str(tiny_dir("llama")), str(tiny_dir("gpt2"))
    out = tmp_path / "conv"
    assert main(["converge", "--model", a, "--model", b, "--texts", "builtin:news", "--n", "24",
                 "--k", "4", "--n-null", "8", "--quiet", "--out", str(out)]) == 0
    df = pd.read_parquet(out / "converge.parquet")
    assert {"conv_full", "conv_readout", "conv_null_mean", "conv_z"} <= set(df.metric)
    assert (df.loc[df.metric == "conv_readout", "value"].abs() <= 1).all()
    assert list(out.glob("plots/converge-0-heatmap.png")) and (out / "report.html").is_file()
    assert "Cross-model convergence" in capsys.readouterr().out
    assert main(["converge", "--model", a, "--texts", "builtin:news", "--out",
                 str(tmp_path / "x")]) == 2
