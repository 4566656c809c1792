"""Extraction overhead: lmgeom.extract vs a bare base-model forward (the floor) vs the usual
user code (full model with output_hidden_states + pooling in Python), same batches, same dtype,
in one run. Plus peak RSS of the extraction (measured in a fresh subprocess) and scaling in
the number of texts and the sequence length.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np


def _texts(n: int):
    import lmgeom

    ts = lmgeom.load_texts("builtin:wiki")
    texts = [t for t in ts.texts if len(t.split()) > 150]
    reps = (n + len(texts) - 1) // len(texts)
    return (texts * reps)[:n]


def _batches(model, texts, max_length, batch_size):
    from lmgeom.activations.core import _pad_batch, encode_texts

    enc = encode_texts(model, texts, max_length)
    return [_pad_batch(model, enc, idx) for idx in enc.batches(batch_size)]


def _bare(model, batches):
    import torch

    with torch.no_grad():
        for ids, mask in batches:
            model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)


def _naive(model, batches):
    """What users typically write: all hidden states + logits, then pooling in Python."""
    import torch

    out = []
    with torch.no_grad():
        for ids, mask in batches:
            res = model.hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            lengths = mask.sum(1)
            for h in res.hidden_states:
                out.append(torch.stack([h[j, lengths[j] - 1] for j in range(h.shape[0])]).float().numpy())
    return out


def _time(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _peak_rss(n: int, dtype: str) -> dict:
    code = f"""
import resource, json, lmgeom, os
import numpy as np
from benchmarks.bench_extract import _texts
texts = _texts({n})
m = lmgeom.load_model("smollm2-135m", dtype="{dtype}")
import gc; gc.collect()
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
before = rss()
weights = sum(p.numel() * p.element_size() for p in m.hf_model.parameters()) / 2**20
lmgeom.extract(m, texts, pooling="last", cache=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(dict(rss_after_load_mb=before, peak_mb=peak, weights_mb=weights)))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_root())
    if r.returncode != 0:
        return {"error": r.stderr[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _root() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parent.parent)


def run(profile: str = "quick") -> list[dict]:
    import torch

    import lmgeom

    full = profile == "full"
    n = 256 if full else 64
    rows: list[dict] = []
    dtypes = ["float32", "bfloat16"]
    for dtype in dtypes:
        model = lmgeom.load_model("smollm2-135m", dtype=dtype)
        texts = _texts(n)
        batches = _batches(model, texts, 128, 32)
        _bare(model, batches[:1])  # warm-up
        t_bare = _time(lambda: _bare(model, batches), 2 if full else 1)
        t_last = _time(lambda: lmgeom.extract(model, texts, pooling="last", cache=False), 2 if full else 1)
        t_mean = _time(lambda: lmgeom.extract(model, texts, pooling="mean", cache=False), 1)
        t_naive = _time(lambda: _naive(model, batches), 1)
        base = dict(bench="extract", model="smollm2-135m", dtype=dtype, n_texts=n, max_length=128)
        rows += [
            {**base, "name": "bare model.model forward (floor)", "seconds": t_bare, "ratio": 1.0},
            {**base, "name": "lmgeom.extract all layers, last", "seconds": t_last, "ratio": t_last / t_bare},
            {**base, "name": "lmgeom.extract all layers, mean", "seconds": t_mean, "ratio": t_mean / t_bare},
            {**base, "name": "naive output_hidden_states + python pooling", "seconds": t_naive,
             "ratio": t_naive / t_bare, "notes": f"lmgeom(last) is {t_naive / t_last:.2f}x faster"},
        ]
        if dtype == "float32":
            # scaling: texts and sequence length
            for nn in ((32, 64, 128) if not full else (64, 128, 256)):
                t = _time(lambda: lmgeom.extract(model, _texts(nn), pooling="last", cache=False))
                rows.append({**base, "n_texts": nn, "name": f"scaling: N={nn}, T=128", "seconds": t})
            for T in ((32, 64, 128) if not full else (64, 128, 256, 512)):
                t = _time(lambda: lmgeom.extract(model, texts[:32], pooling="last", max_length=T, cache=False))
                rows.append({**base, "n_texts": 32, "max_length": T, "name": f"scaling: N=32, T={T}", "seconds": t})
        del model
        torch.set_num_threads(torch.get_num_threads())
    mem = _peak_rss(n, "float32")
    rows.append(dict(bench="extract", name="peak RSS of extract (fp32, subprocess)", n_texts=n,
                     notes=json.dumps(mem),
                     seconds=float("nan"),
                     ratio=(mem.get("peak_mb", np.nan) - mem.get("weights_mb", np.nan)) / 1024))
    return rows


if __name__ == "__main__":
    prof = sys.argv[1] if len(sys.argv) > 1 else "quick"
    for r in run(prof):
        print(r)
