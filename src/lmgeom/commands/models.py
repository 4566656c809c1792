"""``lmgeom models``: the bundled models, whether each is installed, size and licence."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from ..models.bundled import BUNDLED, DEFAULT_MODEL, package_dir
from .options import add_options, print_table

NAME = "models"
HELP = "list the bundled models (installed?, size, licence)"


@dataclass(frozen=True)
class ModelsArgs:
    """How ``models`` prints.

    Attributes:
        json: print JSON instead of a table.
    """

    json: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, ModelsArgs)


def run(args) -> int:
    rows = []
    for bm in BUNDLED.values():
        size = ""
        if bm.installed():
            total = 0
            for pkg in (bm.package, *bm.parts):
                total += sum(f.stat().st_size for f in package_dir(pkg).rglob("*.gguf*"))
            size = f"{total / 1e6:.0f} MB"
        rows.append({
            "name": bm.name,  # a valid --model value
            "default": bm.name == DEFAULT_MODEL,
            "installed": bm.installed(),
            "install": None if bm.installed() else bm.install_hint(),
            "arch": bm.arch,
            "shape": bm.shape,
            "gguf size": size,
            "licence": bm.licence,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [{"name": r["name"] + (" (default)" if r["default"] else ""),
              "installed": "yes" if r["installed"] else f"no: {r['install']}",
              **{k: r[k] for k in ("arch", "shape", "gguf size", "licence")}} for r in rows]
    print_table(table)
    print("\nAny Hugging Face hub id, local model folder or .gguf file works too (--model SPEC).")
    return 0
