"""Extraction overhead: lmgeom.extract vs a bare base-model forward (the floor) vs the usual
user code (full model with output_hidden_states + pooling in Python), same batches, same dtype,
in one run. Plus peak RSS of the extraction (measured in a fresh subprocess) and scaling in
the number of texts and the sequence length.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks._util import loglog_slope


def _texts(n: int):
    import lmgeom

    ts = lmgeom.load_texts("builtin:wiki")
    texts = [t for t in ts.texts if len(t.split()) > 150]
    reps = (n + len(texts) - 1) // len(texts)
    return (texts * reps)[:n]


def _batches(model, texts, max_length, batch_size):
    from lmgeom.activations.core import encode_texts
    from lmgeom.activations.forward import pad_batch

    enc = encode_texts(model, texts, max_length)
    return [(b.input_ids, b.attention_mask)
            for b in (pad_batch(model, enc, idx) for idx in enc.batches(batch_size))]


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


def _naive_rows(name: str, dtype: str, n: int, batch_size: int) -> list[dict]:
    """The same three-way comparison on a model whose readout is a large share of the forward
    (Gemma-3-270M: a 262,144-token vocabulary), where the naive path's all-position logits cost
    most; smaller batches so those logits fit in memory."""
    import lmgeom

    model = lmgeom.load_model(name, dtype=dtype)
    texts = _texts(n)
    batches = _batches(model, texts, 128, batch_size)
    _bare(model, batches[:1])
    t_bare = _time(lambda: _bare(model, batches))
    t_last = _time(lambda: lmgeom.extract(model, texts, pooling="last", batch_size=batch_size,
                                          cache=False))
    t_naive = _time(lambda: _naive(model, batches))
    base = dict(bench="extract", model=name, dtype=dtype, n_texts=n, max_length=128)
    return [
        {**base, "name": "bare model.model forward (floor)", "seconds": t_bare, "ratio": 1.0},
        {**base, "name": "lmgeom.extract all layers, last", "seconds": t_last, "ratio": t_last / t_bare},
        {**base, "name": "naive output_hidden_states + python pooling", "seconds": t_naive,
         "ratio": t_naive / t_bare, "notes": f"lmgeom(last) is {t_naive / t_last:.2f}x faster"},
    ]


def _time(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


_MEM_CHILD = r"""
import json, resource, sys, tempfile
import torch, lmgeom
from benchmarks.bench_extract import _texts, _batches, _bare
method, n, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
texts = _texts(n)
m = lmgeom.load_model("smollm2-135m", dtype=dtype)
batches = _batches(m, texts, 128, 32) if method == "bare" else None
import gc; gc.collect()
from benchmarks._util import PeakRSS
weights = sum(p.numel() * p.element_size() for p in m.hf_model.parameters())
tmp = tempfile.mkdtemp(prefix="lmgeom-bench-tok-")
held = 0
with PeakRSS() as mem:
    if method == "bare":
        _bare(m, batches)
    elif method == "extract":
        lmgeom.extract(m, texts, pooling="last", cache=False, progress=False)
    else:  # every token of every text at every layer, streamed to disk shard by shard
        ta = lmgeom.extract_tokens(m, texts, layers="all", max_length=128, batch_size=32,
                                   cache_root=tmp, progress=False)
        held = int(ta.n_tokens.sum()) * len(ta.layers) * m.hf_model.config.hidden_size * 4
print(json.dumps(dict(base_rss=mem.base, peak=mem.peak, weights=weights, held=held,
                      maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
"""


def _peak_rss(method: str, n: int, dtype: str) -> dict:
    env = {**os.environ, "LMGEOM_QUIET": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, "-c", _MEM_CHILD, method, str(n), dtype],
                       capture_output=True, text=True, cwd=_root(), env=env)
    if r.returncode != 0:
        raise RuntimeError(f"memory child {method} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def memory_rows(n: int, dtype: str = "float32") -> list[dict]:
    """Peak RSS while each call runs (VmRSS sampled every 2 ms in a thread), each method in a
    fresh subprocess; delta = peak - RSS just before the call (model loaded, texts in memory)."""
    rows = []
    res = {k: _peak_rss(k, n, dtype) for k in ("bare", "extract", "tokens")}
    names = {"bare": "memory: bare model.model forward (floor)",
             "extract": "memory: lmgeom.extract all layers, last",
             "tokens": "memory: lmgeom.extract_tokens all layers, every token (streamed)"}
    for k, r in res.items():
        delta = (r["peak"] - r["base_rss"]) / 2**20
        note = (f"peak {r['peak'] / 2**20:.0f} MB = weights {r['weights'] / 2**20:.0f} MB + "
                f"{(r['peak'] - r['weights']) / 2**30:.2f} GB (target <= weights + 1.5 GB)")
        if k == "tokens":
            note += f"; holding every (T, d) state in memory would need {r['held'] / 2**20:.0f} MB"
        rows.append(dict(bench="extract", dtype=dtype, n_texts=n, max_length=128, name=names[k],
                         seconds=float("nan"), peak_delta_mb=delta,
                         ratio=delta / max((res["bare"]["peak"] - res["bare"]["base_rss"]) / 2**20, 1),
                         notes=note))
    return rows


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
            ns, tn = (32, 64, 128) if not full else (64, 128, 256), []
            for nn in ns:
                t = _time(lambda: lmgeom.extract(model, _texts(nn), pooling="last", cache=False))
                tn.append(t)
                rows.append({**base, "n_texts": nn, "name": f"scaling: N={nn}, T=128", "seconds": t,
                             "notes": f"{1000 * t / nn:.0f} ms per text"})
            rows.append({**base, "n_texts": "", "name": "scaling exponent in N (log-log fit)",
                         "seconds": float("nan"), "ratio": loglog_slope(ns, tn),
                         "notes": "1.0 = linear in the number of texts"})
            Ts, tt = (32, 64, 128) if not full else (64, 128, 256, 512), []
            for T in Ts:
                t = _time(lambda: lmgeom.extract(model, texts[:32], pooling="last", max_length=T, cache=False))
                tt.append(t)
                rows.append({**base, "n_texts": 32, "max_length": T, "name": f"scaling: N=32, T={T}", "seconds": t,
                             "notes": f"{1e6 * t / (32 * T):.0f} us per token"})
            rows.append({**base, "n_texts": 32, "max_length": "", "name": "scaling exponent in T (log-log fit)",
                         "seconds": float("nan"), "ratio": loglog_slope(Ts, tt),
                         "notes": "1.0 = linear in sequence length (attention's T^2 term is small at these T)"})
        del model
        torch.set_num_threads(torch.get_num_threads())
    rows += _naive_rows("gemma3-270m", "float32", 32, 8)
    rows += memory_rows(256, "float32")  # the target's size in both profiles
    return rows


if __name__ == "__main__":
    prof = sys.argv[1] if len(sys.argv) > 1 else "quick"
    for r in run(prof):
        print(r)
