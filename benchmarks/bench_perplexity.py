"""Perplexity memory and speed: ``lmgeom.lm.perplexity`` (post-norm states captured, readout +
logsumexp over chunks of positions) vs the plain ``model(input_ids).logits`` path (all
``B×T×V`` logits, then ``log_softmax``), same batch, same dtype, each in a fresh subprocess.

Memory method: each method runs in its own Python subprocess that first loads the model and
builds the batch, then records its resident set size (``VmRSS`` from ``/proc/self/status``)
and, while the measured call runs, samples ``VmRSS`` every 2 ms in a background thread.
``peak_rss_delta_mb`` = highest sample − RSS just before the call (what the call itself added).
``maxrss_delta_mb`` is the same from ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (a peak
since process start, so it reads 0 when loading the model peaked higher than the call).
``ppl_rel_diff`` compares the two methods' per-text perplexities (max relative difference).
The third row runs only the decoder without any readout: the memory every method pays.

Dispersion speed vs the O(n²) pairwise cosine matrix is measured in ``bench_dispersion.py``.
Profiles: ``quick`` = gemma3-270m fp32, 32 × 128 tokens; ``full`` adds gemma3-270m bf16 and
smollm2-135m fp32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

_CHILD = r"""
import json, os, resource, sys, time
import numpy as np, torch
method, model_name, B, T, dtype, pc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
torch.manual_seed(0)
import lmgeom
from lmgeom.lm import perplexity
model = lmgeom.load_model(model_name, dtype=dtype)
ts = lmgeom.load_texts("builtin:wiki")
tok = model.tokenizer
texts, ids = [], []
for t in ts.texts:
    e = tok(t, add_special_tokens=True)["input_ids"]
    if len(e) >= T:
        texts.append(tok.decode(e[:T], skip_special_tokens=True))
    if len(texts) == B:
        break
enc = [tok(t, add_special_tokens=True)["input_ids"][:T] for t in texts]
L = max(len(e) for e in enc)
pad = tok.pad_token_id or 0
input_ids = torch.full((B, L), pad, dtype=torch.long)
mask = torch.zeros((B, L), dtype=torch.long)
for i, e in enumerate(enc):
    input_ids[i, :len(e)] = torch.tensor(e); mask[i, :len(e)] = 1

def plain():
    with torch.no_grad():
        logits = model.hf_model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1)
        tgt = lp.gather(-1, input_ids[:, 1:, None])[..., 0]
        m = mask[:, 1:].bool()
        nll = -(tgt * m).sum(1)
        return (nll / m.sum(1)).exp().double().numpy()

def chunked():
    r = perplexity(model, texts, max_length=T, batch_size=B,
                   position_chunk=None if pc == "auto" else int(pc), progress=False)
    return r.perplexities

def base_only():
    model.run_base(input_ids, mask)
    return np.full(B, np.nan)

fn = {"plain": plain, "lmgeom": chunked, "base": base_only}[method]
from benchmarks._util import PeakRSS
maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with PeakRSS() as mem:
    t0 = time.perf_counter(); out = fn(); dt = time.perf_counter() - t0
maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": dt, "peak_delta": mem.peak - mem.base, "maxrss_delta": max(0, maxrss1 - maxrss0),
                  "base_rss": mem.base, "ppl": [float(x) for x in out], "n_tokens": int(mask.sum())}))
"""


def _child(method: str, model: str, B: int, T: int, dtype: str, pc: str = "auto") -> dict:
    env = {**os.environ, "LMGEOM_QUIET": "1", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run([sys.executable, "-c", _CHILD, method, model, str(B), str(T), dtype, pc],
                         capture_output=True, text=True, env=env, timeout=1800, check=False,
                         cwd=str(Path(__file__).resolve().parent.parent))
    if res.returncode != 0:
        raise RuntimeError(f"{method} child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def memory_rows(model: str, B: int, T: int, dtype: str = "float32") -> list[dict]:
    plain = _child("plain", model, B, T, dtype)
    mine = _child("lmgeom", model, B, T, dtype)
    floor = _child("base", model, B, T, dtype)
    a, b = np.array(plain["ppl"]), np.array(mine["ppl"])
    rel = float(np.max(np.abs(b / a - 1)))
    rows = []
    for name, r in (("model(...).logits + log_softmax", plain), ("lmgeom.lm.perplexity", mine),
                    ("base model forward only (floor, no readout)", floor)):
        rows.append({"bench": "perplexity memory", "model": model, "dtype": dtype,
                     "batch": f"{B}x{T}", "method": name,
                     "peak_rss_delta_mb": r["peak_delta"] / 2**20,
                     "maxrss_delta_mb": r["maxrss_delta"] / 2**20,
                     "seconds": r["seconds"],
                     "ratio_vs_plain": r["peak_delta"] / max(plain["peak_delta"], 1),
                     "ppl_rel_diff": rel if r is not floor else float("nan")})
    return rows


def run(profile: str = "quick") -> list[dict]:
    rows = memory_rows("gemma3-270m", 32, 128)
    if profile == "full":
        rows += memory_rows("gemma3-270m", 32, 128, dtype="bfloat16")
        rows += memory_rows("smollm2-135m", 32, 128)
    return rows


if __name__ == "__main__":  # pragma: no cover
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="quick", choices=["quick", "full"])
    for r in run(ap.parse_args().profile):
        print(r)
