"""The CLI: help for every command, one-line errors for user mistakes, no tracebacks."""

from __future__ import annotations

import pytest

from lmgeom.cli import COMMANDS, build_parser, main


def test_every_command_has_help(capsys):
    parser = build_parser()
    names = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert names == set(COMMANDS)  # every listed command has its module (cli._load fails loudly)
    for name in names:
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "usage: lmgeom" in out and len(out) > 150
        assert "(default: None)" not in out and "(default: False)" not in out


def test_a_missing_command_module_fails_loudly(monkeypatch):
    """A command listed in COMMANDS whose module is gone is a broken install, never a command
    that silently disappears from --help."""
    from lmgeom import cli

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "no_such_command"))
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()


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


def test_option_group_mechanism():
    """A dataclass is an option group: flag from the name, help from the docstring's
    Attributes entry, type / choices from the metadata; options_from_args builds it back."""
    import argparse
    from dataclasses import dataclass, field

    from lmgeom.commands.options import add_options, arg, field_docs, options_from_args
    from lmgeom.commands.types import positive_int

    @dataclass(frozen=True)
    class Group:
        """A group.

        Attributes:
            n_items: how many items, a long
                explanation.
            mode: the mode.
            fast: go fast.
            renamed: under another flag.
        """

        n_items: int = field(default=3, metadata=arg(type=positive_int))
        mode: str = field(default="a", metadata=arg(choices=("a", "b")))
        fast: bool = False
        renamed: str | None = field(default=None, metadata=arg(flag="--other"))

    assert field_docs(Group)["n_items"] == "how many items, a long explanation"
    p = argparse.ArgumentParser()
    add_options(p, Group, title="group", defaults={"mode": "b"})
    args = p.parse_args(["--n-items", "5", "--fast", "--other", "x"])
    assert options_from_args(args, Group) == Group(n_items=5, mode="b", fast=True, renamed="x")
    assert options_from_args(args, Group, fast=False).fast is False
    with pytest.raises(SystemExit):
        p.parse_args(["--n-items", "0"])
    with pytest.raises(TypeError, match="no such fields"):
        add_options(argparse.ArgumentParser(), Group, defaults={"nope": 1})


@pytest.mark.parametrize("group, config", [
    ("lmgeom.commands.clusters:ClustersArgs", "lmgeom.experiments.clusters:ClusterConfig"),
    ("lmgeom.commands.dispersion:DispersionArgs", "lmgeom.experiments.dispersion:DispersionConfig"),
    ("lmgeom.commands.hardness:HardnessArgs", "lmgeom.experiments.hardness:HardnessConfig"),
    ("lmgeom.commands.knnlm:KnnArgs", "lmgeom.experiments.knnlm:KnnConfig"),
    ("lmgeom.commands.knnlm:KnnTextsArgs", "lmgeom.experiments.knnlm:KnnConfig"),
    ("lmgeom.commands.select:GapArgs", "lmgeom.experiments.select:SelectConfig"),
    ("lmgeom.commands.select:QualityArgs", "lmgeom.experiments.select:SelectConfig"),
    ("lmgeom.commands.converge:ConvergeArgs", "lmgeom.experiments.convergence:ConvergeConfig"),
    ("lmgeom.commands.options:ExtractArgs", "lmgeom.experiments.layer_sweep:LayerSweepConfig"),
    ("lmgeom.commands.analyze:PGAArgs", "lmgeom.experiments.layer_sweep:LayerSweepConfig"),
])
def test_cli_defaults_are_the_library_defaults(group, config):
    """A command's option group (read without importing the experiment, so --help is fast)
    states the same default as the library config its options become."""
    import dataclasses
    import importlib

    def load(ref):
        mod, name = ref.split(":")
        return getattr(importlib.import_module(mod), name)

    cli_defaults = {f.name: f.default for f in dataclasses.fields(load(group))}
    lib = load(config)()
    shared = [n for n in cli_defaults if hasattr(lib, n) and n not in ("ccr", "pairs")]
    assert shared
    bad = {n: (cli_defaults[n], getattr(lib, n)) for n in shared
           if cli_defaults[n] != getattr(lib, n)}
    assert not bad, f"{group} and {config} disagree: {bad}"



def test_help_texts_match_the_registries():
    """``--help`` names every bundled model and every regulariser ``--compare`` takes (issue 49:
    it named two models and "all three arms"); no help points at a README section that does not
    exist."""
    from lmgeom.cli import build_parser
    from lmgeom.commands.train import COMPARABLE, DESCRIPTION, HELP
    from lmgeom.experiments.finetune import ALL_ARMS
    from lmgeom.models.bundled import BUNDLED

    top = build_parser().format_help()
    assert all(name in " ".join(top.split()) for name in BUNDLED)
    assert tuple(ALL_ARMS) == COMPARABLE
    assert "three arms" not in HELP and all(arm in DESCRIPTION for arm in COMPARABLE)
    import lmgeom.commands.options as options

    assert "README: Running on a cluster" not in open(options.__file__).read()
