"""The CLI: help for every command, one-line errors for user mistakes, no tracebacks.

End-to-end half (the unit half is tests/unit/test_cli.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from lmgeom.cli import main


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["models", "--json"]])
def test_help_and_models_do_not_import_torch(argv):
    code = ("import sys, contextlib, io\n"
            "from lmgeom.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"lmgeom {' '.join(argv)} imported torch"


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

