"""The rule that compares a documentation page's recorded console output with a fresh run
(the root ``conftest.py``): it must catch a changed number, a missing or extra line and a
changed word, and let through only what its docstring allows (one unit in the last printed
digit or 0.1 %, whitespace, seconds, cache counts, ``...`` for any run of lines)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("sybil")
_spec = importlib.util.spec_from_file_location(
    "docs_blocks", Path(__file__).resolve().parents[2] / "conftest.py")
blocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(blocks)

WROTE = "wrote acts.safetensors (1 batches computed, 0 from cache, 1 s)"
RECORDED = ["layer  mean_norm  std_norm", "    0        2.6    0.2581", "...",
            "wrote acts.safetensors  (1 batches computed, 0 from cache, 12.4 s)"]


def test_a_fresh_run_that_prints_the_same_matches():
    printed = ["layer mean_norm std_norm", "0 2.6 0.2582", "   10   134.3   21.2",
               "   20   222.8   18.48",
               "wrote acts.safetensors (0 batches computed, 1 from cache, 0.9 s)"]
    assert blocks.matches_recorded(RECORDED, printed)
    # ... may stand for no line at all
    assert blocks.matches_recorded(RECORDED, [*printed[:2], printed[-1]])


@pytest.mark.parametrize("printed", [
    ["layer mean_norm std_norm", "0 2.8 0.2581", WROTE],
    ["layer mean_norm std_norm", "0 2.6 0.2600", WROTE],
    ["layer mean_norm", "0 2.6 0.2581", WROTE],
    ["layer mean_norm std_norm", "0 2.6 0.2581"],
    ["layer mean_norm std_norm", "0 2.6 0.2581", WROTE.replace("safetensors", "parquet")],
    ["layer mean_norm std_norm", "0 2.6 0.2581", WROTE, "extra"],
    ["layer mean_norm std_norm", "0 2.6 0.2581 0.9", WROTE],
], ids=["number", "last-digits", "column", "missing-line", "word", "extra-line", "extra-number"])
def test_a_difference_the_page_does_not_allow_fails(printed):
    assert not blocks.matches_recorded(RECORDED, printed)


def test_commands_continue_over_backslashes_and_keep_their_output():
    steps = blocks.console_steps("$ lmgeom extract \\\n    --n 4\nout 1\n\n$ lmgeom texts\nname")
    assert steps == [("lmgeom extract  --n 4", ["out 1", ""]), ("lmgeom texts", ["name"])]
    with pytest.raises(ValueError, match=r"starts with '\$ command'"):
        blocks.console_steps("output before any command")
