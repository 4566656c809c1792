"""`make bench`: run every benchmark side by side with its naive reference, write RESULTS.md.

    python benchmarks/run.py [--profile quick|full] [--only extract,pga,...]

Each ``benchmarks/bench_*.py`` exposes ``run(profile) -> list[dict]``. Times are only compared
as ratios within one run (these machines are noisy); absolute seconds are printed for context.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import math
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BENCHES = ("pga", "metrics", "dispersion", "extract", "dtype", "perplexity", "analyze")


def _machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{platform.node()} — {cpu or platform.processor()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), Python {platform.python_version()}")


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v).replace("|", "\\|")


def _table(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols and k != "bench":
                cols.append(k)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="quick", choices=["quick", "full"])
    ap.add_argument("--only", default=None, help="comma list of benches")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = ap.parse_args(argv)
    os.environ.setdefault("LMGEOM_QUIET", "1")
    names = args.only.split(",") if args.only else BENCHES
    sections = []
    for name in names:
        try:
            mod = importlib.import_module(f"benchmarks.bench_{name}")
        except ModuleNotFoundError:
            print(f"(no benchmarks/bench_{name}.py, skipped)")
            continue
        t = time.perf_counter()
        print(f"== {name} ({args.profile}) ...", flush=True)
        rows = mod.run(args.profile)
        took = time.perf_counter() - t
        print(_table(rows), flush=True)
        doc = (mod.__doc__ or "").strip()
        sections.append(f"## {name}\n\n{doc}\n\n{_table(rows)}\n\n_(profile `{args.profile}`, "
                        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; bench took "
                        f"{took:.0f} s)_\n")
    head = (f"# Benchmark results\n\nLatest `make bench` (`python benchmarks/run.py --profile "
            f"{args.profile}{' --only ' + args.only if args.only else ''}`), "
            f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; each section names its own "
            f"profile and time.\n\nMachine: {_machine()}\n\n"
            "Ratios compare methods measured in the same run on the same inputs.\n\n")
    out = Path(args.out)
    if args.only and out.exists():
        # keep other sections: replace only the ones rerun
        old = out.read_text().split("\n## ")
        keep = [s for s in old[1:] if s.split("\n", 1)[0].strip() not in names]
        sections = ["## " + s.rstrip() + "\n" for s in keep] + sections
    out.write_text(head + "\n".join(sections))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
