"""Device check (issue 27): the PGA null loop with the CPU kernel and with torch on ``cuda``
(N = 2000 and 8000, d = 2048, k = 100, 100 null frames, CCR 0, 1, 5, 10 in one
``subspace_pga_levels`` call, exact mode, seed 0), and ``lmgeom.extract`` (all layers, last-token
pooling, no cache) of a randomly initialised Llama-architecture model of about 1B parameters
(Llama-3.2-1B shapes with a 32,000-token vocabulary, built from a config, bfloat16) against a
bare ``model.model`` forward on the same padded batches (512 texts x 256 tokens, 32 per batch).
``ratio`` = seconds / seconds of the row it is compared with (``vs``); ``max |dz|`` compares the
cuda z values with the CPU kernel's on the same states (float64 on both; ~1e-9 expected).

Scales: ``full`` is the above (on a GPU machine it fits in 8 minutes); ``cpu`` (the default
where ``torch.cuda.is_available()`` is False) runs the same loops small enough for a 2-core
machine in a few minutes: N = 500 and 1000, d = 576, and a ~36M-parameter Llama (8 blocks,
width 512) on CPU over 64 texts x 128 tokens, in float32: bfloat16 matmuls on a CPU without
native bf16 run ~30x slower (measured: 48 tokens/s on 2 cores) and would time the fallback, not
lmgeom. Every ``cuda`` row that cannot run is
reported ``skipped`` with the reason, never left out. Rows past ``--budget-s`` are skipped too.

    python benchmarks/bench_device.py [--scale auto|full|cpu] [--only pga,extract]
                                      [--budget-s 420] [--json rows.json]
    python benchmarks/run.py --only device     # the same rows as a section of RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from typing_extensions import Self

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LEVELS = (0, 1, 5, 10)
K, N_NULL, SEED = 100, 100, 0


@dataclass(frozen=True)
class Scale:
    """Problem sizes of one scale."""

    name: str
    pga_n: tuple[int, ...]
    pga_d: int
    llama: dict          # LlamaConfig keyword arguments
    n_texts: int
    max_length: int
    batch_size: int
    extract_device: str  # where the extraction rows run ("cuda" needs a GPU)
    dtype: str           # of the model's weights


FULL = Scale(
    name="full", pga_n=(2000, 8000), pga_d=2048,
    llama={"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 2048,
               "tie_word_embeddings": True},
    n_texts=512, max_length=256, batch_size=32, extract_device="cuda", dtype="bfloat16",
)
CPU = Scale(
    name="cpu", pga_n=(500, 1000), pga_d=576,
    llama={"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8,
               "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 512,
               "tie_word_embeddings": True},
    n_texts=64, max_length=128, batch_size=16, extract_device="cpu", dtype="float32",
)


def cuda_unavailable() -> str | None:
    """None when torch can use a CUDA device, else the reason, in words."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return None


class _Clock:
    """Wall and process-CPU seconds of a block; synchronises CUDA at both ends when asked."""

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def __enter__(self) -> Self:
        self._sync()
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c


class _Budget:
    """Skips the rows that would start after ``seconds`` of this run."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.t0 = seconds, time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def over(self) -> str | None:
        used = time.perf_counter() - self.t0
        return f"over the time budget ({used:.0f} s used of --budget-s {self.seconds:.0f})" \
            if used > self.seconds else None


def _skipped(base: dict, reason: str) -> dict:
    return {**base, "seconds": float("nan"), "ratio": float("nan"), "status": "skipped",
            "notes": reason}


# --------------------------------------------------------------------------------- PGA null loop
def pga_data(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) anisotropic clustered states with a common offset, and a (d, K) readout basis."""
    from lmgeom.metrics import readout_basis

    rng = np.random.default_rng(seed)
    spectrum = np.geomspace(6.0, 0.05, d)
    centres = rng.standard_normal((12, d)) * spectrum
    X = centres[rng.integers(0, 12, n)] + rng.standard_normal((n, d)) * spectrum
    X += 20.0 * rng.standard_normal(d)
    W = rng.standard_normal((4 * d, d)) * np.geomspace(0.2, 3.0, d)[rng.permutation(d)]
    return X, readout_basis(W, K)


def _pga(X: np.ndarray, V: np.ndarray, device: str | None, n_null: int = N_NULL) -> dict:
    from lmgeom.metrics import subspace_pga_levels

    # CPU: one frame worker per core (the default is 2); ignored on torch devices
    workers = os.cpu_count() if device is None else None
    return subspace_pga_levels(X, V, ccr=LEVELS, n_null=n_null, seed=SEED, device=device,
                               workers=workers, warn=False)


class PGABench:
    """The PGA rows: ``row(n, device)`` times one ``subspace_pga_levels`` call (all four levels,
    100 frames) after a warm-up per device (the compiled kernel; the CUDA context)."""

    def __init__(self, scale: Scale, budget: _Budget, no_cuda: str | None) -> None:
        self.scale, self.budget, self.no_cuda = scale, budget, no_cuda
        self.z: dict[tuple[int, str], dict[int, float]] = {}
        self.seconds: dict[tuple[int, str], float] = {}
        self._warm: set[str] = set()

    def _base(self, n: int, device: str) -> dict:
        return {"bench": "device", "name": f"PGA null loop, N={n}", "dtype": "float64", "N": n,
                    "d": self.scale.pga_d, "k": K, "n_null": N_NULL, "ccr": "0,1,5,10",
                    "pairs": n * (n - 1) // 2, "device": "cuda (torch)" if device == "cuda" else
                    f"cpu (kernel, {os.cpu_count()} workers)",
                    "vs": "" if device == "cpu" else "cpu (kernel)"}

    def _estimate(self, n: int, device: str) -> float | None:
        """Seconds for N = n from a smaller N already timed on ``device`` (pairs grow as N^2)."""
        done = [(m, t) for (m, d), t in self.seconds.items() if d == device and m < n]
        if not done:
            return None
        m, t = max(done)
        return t * (n / m) ** 2 * 1.15

    def row(self, n: int, device: str) -> dict:
        base = self._base(n, device)
        reason = (self.no_cuda if device == "cuda" else None) or self.budget.over()
        est = self._estimate(n, device)
        if not reason and est is not None and est > self.budget.left():
            reason = (f"estimated {est:.0f} s (from the smaller N) exceeds the {self.budget.left():.0f} s "
                      "left of --budget-s")
        if reason:
            return _skipped(base, reason)
        if device not in self._warm:
            Xw, Vw = pga_data(200, self.scale.pga_d, seed=1)
            _pga(Xw, Vw, None if device == "cpu" else device, n_null=20)
            self._warm.add(device)
        X, V = pga_data(n, self.scale.pga_d)
        with _Clock(cuda=device == "cuda") as c:
            res = _pga(X, V, None if device == "cpu" else device)
        z = {m: float(r.z) for m, r in res.items()}
        self.z[(n, device)], self.seconds[(n, device)] = z, c.wall
        notes = (f"{1000 * c.wall / N_NULL:.0f} ms per frame (4 levels); process cpu "
                 f"{c.cpu:.1f} s; z " + ", ".join(f"{v:.2f}" for v in z.values()))
        return {**base, "seconds": c.wall, "ratio": 1.0 if device == "cpu" else float("nan"),
                "status": "ok", "notes": notes}

    def compare(self, rows: list[dict]) -> None:
        """Fill the cuda rows' ratio (cuda / cpu seconds) and max |dz| against the CPU kernel."""
        for r in rows:
            n = r.get("N")
            if r.get("status") != "ok" or not str(r.get("device", "")).startswith("cuda"):
                continue
            if (n, "cpu") in self.seconds:
                r["ratio"] = self.seconds[(n, "cuda")] / self.seconds[(n, "cpu")]
                dz = max(abs(self.z[(n, "cuda")][m] - self.z[(n, "cpu")][m]) for m in LEVELS)
                r["notes"] = f"max |dz| vs cpu {dz:.1e}; " + r["notes"]
            else:
                r["notes"] = "no cpu row to compare; " + r["notes"]


# ----------------------------------------------------------------------------------- extraction
WORDS = ["the", "model", "reads", "a", "context", "and", "writes", "the", "next", "token", "while", "layers", "mix", "attention", "and", "feed", "forward", "maps", "over", "residual", "streams", "of", "states", "geometry", "readout", "basis", "null", "frame", "distance", "rank", "spectrum", "dispersion", "cluster", "layer", "token", "sample", "batch", "width", "depth"]


def synthetic_texts(n: int, words: int, seed: int = 0) -> list[str]:
    """``n`` deterministic texts of ``words`` words each (every one fills ``max_length``)."""
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words)) for _ in range(n)]


def random_llama(scale: Scale, device: str):
    """A randomly initialised Llama-architecture :class:`~lmgeom.models.LanguageModel` in
    ``scale.dtype`` on ``device``, with a small byte-level BPE tokenizer trained here (nothing is
    downloaded). Returns ``(model, n_params, build_seconds)``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from lmgeom.models import LanguageModel

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(synthetic_texts(200, 64, seed=1), trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<unk>", "<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                        pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    cfg = LlamaConfig(**scale.llama, pad_token_id=1, bos_token_id=2, eos_token_id=3)
    t = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        hf = LlamaForCausalLM(cfg).to(getattr(torch, scale.dtype))
    n_params = sum(p.numel() for p in hf.parameters())
    model = LanguageModel.wrap(hf, tokenizer, name=f"random-llama-{n_params / 1e9:.2f}B",
                               identity={"source": "random init (bench_device)",
                                         "config": cfg.to_dict(), "seed": 0})
    return model, n_params, time.perf_counter() - t


def _bare(model, batches) -> None:
    import torch

    with torch.no_grad():
        for b in batches:
            model.base_model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                             position_ids=b.position_ids, use_cache=False)


def extract_rows(scale: Scale, budget: _Budget, no_cuda: str | None) -> list[dict]:
    import torch

    import lmgeom
    from lmgeom.activations.core import encode_texts
    from lmgeom.activations.forward import pad_batch

    dev = scale.extract_device
    base = {"bench": "device", "device": dev, "dtype": scale.dtype, "n_texts": scale.n_texts,
                "max_length": scale.max_length, "batch_size": scale.batch_size}
    names = ("bare model.model forward (floor)", "lmgeom.extract all layers, last")
    reason = (no_cuda if dev == "cuda" else None) or budget.over()
    if reason:
        return [_skipped({**base, "name": f"{nm}, ~1B Llama", "vs": ""}, reason) for nm in names]
    model, n_params, build_s = random_llama(scale, dev)
    label = f"{n_params / 1e9:.2f}B" if n_params >= 1e8 else f"{n_params / 1e6:.0f}M"
    texts = synthetic_texts(scale.n_texts, 2 * scale.max_length)
    enc = encode_texts(model, texts, scale.max_length)
    batches = [pad_batch(model, enc, idx) for idx in enc.batches(scale.batch_size)]
    cuda = dev == "cuda"
    _bare(model, batches[:1])  # warm-up
    lmgeom.extract(model, texts[: scale.batch_size], pooling="last", max_length=scale.max_length,
                   batch_size=scale.batch_size, cache=False, progress=False)
    with _Clock(cuda) as bare:
        _bare(model, batches)
    with _Clock(cuda) as ext:
        acts = lmgeom.extract(model, texts, pooling="last", max_length=scale.max_length,
                              batch_size=scale.batch_size, cache=False, progress=False)
    tokens = int(sum(int(b.attention_mask.sum()) for b in batches))
    peak = (f"; peak cuda memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
            if cuda else "")
    shape = "x".join(str(s) for s in acts.states.shape)
    rows = [
        {**base, "name": f"{names[0]}, {label} Llama", "vs": "", "seconds": bare.wall,
         "ratio": 1.0, "status": "ok",
         "notes": f"{n_params:,} params, built in {build_s:.1f} s; {tokens:,} tokens, "
                  f"{tokens / bare.wall:,.0f} tokens/s{peak}"},
        {**base, "name": f"{names[1]}, {label} Llama", "vs": "bare", "seconds": ext.wall,
         "ratio": ext.wall / bare.wall, "status": "ok",
         "notes": f"states {shape} float32; {tokens / ext.wall:,.0f} tokens/s"},
    ]
    del model, acts
    if cuda:
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------- entry
def pick_scale(name: str, no_cuda: str | None) -> Scale:
    if name == "auto":
        return FULL if no_cuda is None else CPU
    return {"full": FULL, "cpu": CPU}[name]


def collect(scale_name: str = "auto", only: tuple[str, ...] = ("pga", "extract"),
            budget_s: float = 420.0, show=None) -> list[dict]:
    """Every row of the device check (skipped rows included, with their reason). The device
    rows run first and the slow CPU-kernel row at the largest N last, so a tight budget
    skips that one rather than the GPU's."""
    os.environ.setdefault("LMGEOM_QUIET", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    no_cuda = cuda_unavailable()
    scale = pick_scale(scale_name, no_cuda)
    budget = _Budget(budget_s)
    pga = PGABench(scale, budget, no_cuda)
    steps = []
    if "pga" in only:
        small, large = scale.pga_n[:-1], scale.pga_n[-1:]
        steps += [lambda n=n, d=d: [pga.row(n, d)] for n in small for d in ("cpu", "cuda")]
        steps += [lambda n=n: [pga.row(n, "cuda")] for n in large]
    if "extract" in only:
        steps.append(lambda: extract_rows(scale, budget, no_cuda))
    if "pga" in only:
        steps += [lambda n=n: [pga.row(n, "cpu")] for n in large]
    rows: list[dict] = []
    for step in steps:
        new = step()
        for r in new:
            r["scale"] = scale.name
        if show:
            show(new)
        rows += new
    pga.compare(rows)
    order = {("pga", n, d): i for i, (n, d) in enumerate(
        (n, d) for n in scale.pga_n for d in ("cpu", "cuda"))}
    return sorted(rows, key=lambda r: order.get(
        ("pga", r.get("N"), "cuda" if str(r.get("device")).startswith("cuda") else "cpu"), 99))


def run(profile: str = "quick") -> list[dict]:
    """``benchmarks/run.py --only device``: the ``auto`` scale (``full`` only with a GPU)."""
    return collect("full" if profile == "full" else "auto")


COLS = ["scale", "name", "device", "dtype", "status", "seconds", "ratio", "vs", "notes"]


def _print(rows: list[dict], header: bool = True) -> None:
    cols = COLS
    if header:
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append("" if isinstance(v, float) and math.isnan(v) else
                         f"{v:.3g}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="auto", choices=["auto", "full", "cpu"],
                    help="full: the issue's sizes (N=2000/8000, ~1B Llama on cuda); cpu: small "
                         "sizes for a CPU-only machine; auto (default): full with a GPU, else cpu")
    ap.add_argument("--only", default="pga,extract", help="comma list of: pga, extract")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip (with the reason) rows that would start after this many seconds")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    bad = set(only) - {"pga", "extract"}
    if bad:
        ap.error(f"--only: unknown {sorted(bad)}; choose from pga, extract")
    import torch

    no_cuda = cuda_unavailable()
    gpu = "none" if no_cuda else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads; GPU: {gpu}", flush=True)
    t = time.perf_counter()
    print("rows as they finish:", flush=True)
    rows = collect(args.scale, only, args.budget_s, show=lambda new: _print(new, header=False))
    print("\nall rows (cuda ratio = cuda seconds / cpu seconds, same N):")
    _print(rows)
    print(f"device check took {time.perf_counter() - t:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
