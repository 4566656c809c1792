"""End to end: ``lmgeom analyze`` (smollm2-135m, builtin:domains, every layer, CCR 0,1,5,10,
k = 100, n_null = 100, probes, logit lens, report) run as a user runs it, in a subprocess, twice:
**cold** (an empty ``LMGEOM_CACHE``: the bundled model is converted, the corpora fetched, every
activation computed) and **warm** (same cache, new output folder: activations are read back).
The time is split by stage from the run's own ``manifest.json`` timings. ``analyze`` has no
perplexity stage (that is ``lmgeom disperse``); "model work" = load + extract.
Profiles: ``quick`` = the defaults with ``--n 128``; ``full`` = the defaults (``--n 512``).
``share`` = stage seconds / total seconds of that run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("texts", "load", "extract", "metrics", "logit_lens", "probes", "report")


def _analyze(cache: Path, out: Path, n: int) -> tuple[dict, float]:
    env = {**os.environ, "LMGEOM_CACHE": str(cache), "LMGEOM_QUIET": "1"}
    cmd = [str(Path(sys.executable).with_name("lmgeom")), "analyze", "--model", "smollm2-135m",
           "--n", str(n), "--out", str(out), "--quiet"]
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return json.loads((out / "manifest.json").read_text())["timings"], wall


def _stages(tm: dict) -> dict:
    def get(name: str) -> float:
        for k, v in tm.items():
            if k == f"{name}_s" or k.startswith(f"{name}_s["):
                return float(v)
        return 0.0

    return {s: get(s) for s in STAGES}


def run(profile: str = "quick") -> list[dict]:
    n = 512 if profile == "full" else 128
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lmgeom-bench-analyze-") as tmp:
        cache, runs = Path(tmp) / "cache", Path(tmp) / "runs"
        res = {}
        for which in ("cold", "warm"):
            tm, wall = _analyze(cache, runs / which, n)
            res[which] = (_stages(tm), float(tm.get("total_s", wall)), wall)
    for which, (st, total, wall) in res.items():
        for s in STAGES:
            rows.append(dict(bench="analyze", run=which, n_texts=n, stage=s, seconds=st[s],
                             share=st[s] / total))
        model = st["load"] + st["extract"]
        rows.append(dict(bench="analyze", run=which, n_texts=n, stage="total (manifest)",
                         seconds=total, share=1.0,
                         notes=f"process wall {wall:.1f} s; model work (load+extract) "
                               f"{model / total:.0%}, metrics+probes+logit lens "
                               f"{(st['metrics'] + st['probes'] + st['logit_lens']) / total:.0%}"))
    cold, warm = res["cold"][1], res["warm"][1]
    rows.append(dict(bench="analyze", run="warm / cold", n_texts=n, stage="total",
                     seconds=float("nan"), share=warm / cold,
                     notes=f"extract cold {res['cold'][0]['extract']:.1f} s -> warm "
                           f"{res['warm'][0]['extract']:.1f} s"))
    return rows


if __name__ == "__main__":
    for r in run(sys.argv[1] if len(sys.argv) > 1 else "quick"):
        print(r)
