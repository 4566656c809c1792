"""``lmgeom claims``: user mistakes end in one line (exit 2) before any model loads; the
claim-id parser and the default model list."""

from __future__ import annotations

import pytest

from lmgeom.cli import main
from lmgeom.errors import ConfigError
from lmgeom.experiments.claims import ClaimsConfig, installed_bundled, parse_only, tuning_of
from lmgeom.models.bundled import BUNDLED


@pytest.mark.parametrize("argv, needle", [
    (["--only", "P9"], "--only: P9 is not a claim id"),
    (["--only", "X1,P2"], "X1 is not a claim id"),
    (["--suite", "/nonexistent/suite"], "--suite /nonexistent/suite: no such folder"),
    (["--n", "0"], "--n must be >= 1"),
])
def test_user_mistakes_are_one_line(argv, needle, capsys, tmp_path):
    code = main(["claims", "--model", "smollm2-135m", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "o").exists()


def test_parse_only():
    assert parse_only("p1, D3,P1") == ("P1", "D3")
    assert parse_only(None) is None and parse_only("") is None
    with pytest.raises(ConfigError):
        parse_only("P0")


def test_default_models_are_the_installed_bundled_ones():
    cfg = ClaimsConfig()
    assert cfg.models == installed_bundled()
    assert set(cfg.models) <= set(BUNDLED)
    assert cfg.settings()["models"] == list(cfg.models)


def test_tuning_from_the_registry():
    assert tuning_of("smollm2-135m") == "instruct"  # SmolLM2-135M-Instruct
    assert tuning_of("gemma3-270m") == "base"
    assert tuning_of("/models/my-model") == "unknown"
