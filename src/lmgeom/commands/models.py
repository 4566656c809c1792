"""``lmgeom models``: the bundled models — size, family, width, licence, whether installed, and
the install command of those that are not. Reads the registry only (no torch, no model load)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from ..models.bundled import BUNDLED, DEFAULT_MODEL, BundledModel
from .options import add_options, print_table

NAME = "models"
HELP = "list the bundled models (installed?, size, licence)"
INSTALL_ALL = "make models"


@dataclass(frozen=True)
class ModelsArgs:
    """How ``models`` prints.

    Attributes:
        json: print JSON instead of a table.
    """

    json: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, ModelsArgs)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def model_row(bm: BundledModel) -> dict:
    """One model's row of ``lmgeom models --json``."""
    installed = bm.installed()
    return {
        "name": bm.name,  # a valid --model value
        "default": bm.name == DEFAULT_MODEL,
        "installed": installed,
        "install": None if installed else bm.install_hint(),
        "family": bm.family,
        "arch": bm.arch,
        "tuned": bm.tuned,
        "d": bm.d,
        "n_layers": bm.n_layers,
        "vocab": bm.vocab,
        "shape": bm.shape,
        "tied": bm.tied,
        "params": bm.params,
        "download_bytes": bm.gguf_bytes,
        "licence": bm.licence,
        "description": bm.description,
        "packages": [f"{p.replace('_', '-')}=={bm.version}" for p in bm.packages()],
        "sha256": bm.sha256,
        "upstream": bm.upstream,
    }


def run(args) -> int:
    rows = [model_row(bm) for bm in BUNDLED.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [{"name": r["name"] + (" (default)" if r["default"] else ""),
              "installed": "yes" if r["installed"] else "no",
              "family": r["family"], "tuned": r["tuned"],
              "shape": f"{r['n_layers']} x {r['d']}", "vocab": r["vocab"],
              "params": _params(r["params"]), "download": f"{r['download_bytes'] / 1e6:.0f} MB",
              "licence": r["licence"]} for r in rows]
    print_table(table)
    print("\nWhere the weights come from (each GGUF is checked against its pinned sha256 before "
          "its first load;\nthe packages are read as data, their code never runs):")
    for r in rows:
        pk = r["packages"]
        pkgs = pk[0] if len(pk) == 1 else f"{pk[0]} .. {pk[-1]} ({len(pk)} packages)"
        print(f"  {r['name']}: {r['upstream']}; in {pkgs}; sha256 {r['sha256']}")
    missing = [r for r in rows if not r["installed"]]
    if missing:
        print("\nNot installed (or `" + INSTALL_ALL + "` installs all of them):")
        for r in missing:
            print(f"  {r['name']}: {r['install']}")
    print("\nAny Hugging Face hub id, local model folder or .gguf file works too (--model SPEC).")
    return 0
