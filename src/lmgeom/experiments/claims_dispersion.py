"""The dispersion paper's claims D1-D8 for ``lmgeom claims``: measurements and verdicts.

:func:`measure_dispersion_claims` is what :mod:`lmgeom.experiments.claims` calls. It reuses the
experiments that measure each quantity and hands the arrays to the verdict rules of
:mod:`lmgeom.metrics.claims_dispersion`:

* **D1 / D2** — dispersion vs perplexity across segments: fixed-length chunks of ``corpus``
  (:func:`lmgeom.texts.chunks.make_chunks`) through one forward pass per batch
  (:func:`lmgeom.lm.perplexity.forward_chunks`, as ``lmgeom dispersion`` does) giving per chunk
  its perplexity and, at every layer, both dispersions — the token states inside the chunk
  (``token``) and the chunk's mean state as a segment vector (``segment``). Correlations at
  chunk level and over perplexity groups, with seeded bootstrap intervals over segments (groups).
  D1 is tested at ``final`` (the state the readout reads), D2 over the layers 1..L and ``final``.
* **D5** — :func:`lmgeom.experiments.hardness.rank_hardness` on ``hardness_texts``.
* **D6** — :mod:`lmgeom.experiments.select` (dispersion gap of ``W_U`` vs held-out bits per
  byte) on code and on math; see :mod:`lmgeom.experiments.claims_dispersion_models`.
* **D7** — :func:`lmgeom.experiments.knnlm.run_knnlm` with the last block's ``attn_out`` and
  ``ffn_out`` as candidate keys; see :mod:`lmgeom.experiments.claims_dispersion_models`.
* **D4** — :mod:`lmgeom.experiments.clusters` on the first and last checkpoint of each width of
  a trained suite (``--suite``); not testable without checkpoints.
* **D3 / D8** — :mod:`lmgeom.experiments.finetune` on the smallest model, LoRA and full, arms
  ``none`` and ``push-away``; see :mod:`lmgeom.experiments.claims_dispersion_train`.

Everything measured is cached in ``work_dir`` under a key made of the model's content identity,
the texts' hash and every setting (the forward passes also use the forward cache), so an
interrupted run resumes and a changed input recomputes. Seconds spent per claim and model go
into each verdict's ``details["seconds"]``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_path, stable_hash
from ..errors import ConfigError
from ..metrics import claims_dispersion as rules
from ..metrics.claims import ClaimVerdict, ModelInfo

log = logging.getLogger(__name__)

CLAIMS = tuple(f"D{i}" for i in range(1, 9))
#: bump when a change here changes the cached numbers
VERSION = "2"
VARIANTS = ("token", "segment")


@dataclass(frozen=True)
class DispersionClaimsSettings:
    """Every setting of the D-claims (defaults sized from ``n`` by :meth:`for_n`).

    Attributes:
        n: the run's ``--n``: segments for D1/D2 (the others scale with it, :meth:`for_n`).
        seed: seed of every sample and bootstrap.
        corpus: texts of D1/D2 (Wikipedia, as in the paper).
        corpus_limit: load a seeded sample of this many texts of ``corpus`` and ``knn_texts``
            (None: all; the segments are a seeded sample of their chunks either way). 32 of the
            107 Wikipedia articles hold far more tokens than the defaults use and spare
            tokenizing the whole corpus four times.
        chunk_len: tokens per segment (D1/D2).
        group_size, max_groups: the perplexity groups (D1/D2, grouped level).
        n_boot: bootstrap replicates of the intervals; ``n_boot_depth`` those of D2.
        hardness_texts, hardness_n, hardness_max_length: D5's texts, how many, their
            truncation (tokens).
        batch_size: rows per forward pass.
        select_eval, select_eval_chars: D6's held-out texts per domain and their length.
        knn_*: D7's corpus, chunk length, datastore / held-out / dispersion tokens and k.
        cluster_texts, cluster_max: D4's corpus and most clusters.
        finetune_*: D3/D8's target corpus, steps, batch, λ of the push-away arm, held-out
            chunks, chunk length, texts loaded and methods (``lora``, ``full``).
    """

    n: int = 256
    seed: int = 0
    corpus: str = "builtin:wiki"
    corpus_limit: int | None = 32
    chunk_len: int = 32
    group_size: int = 8
    max_groups: int = 100
    n_boot: int = 1000
    n_boot_depth: int = 500
    hardness_texts: str = "builtin:domains"
    hardness_n: int = 128
    hardness_max_length: int = 32
    batch_size: int = 8
    # D6
    select_eval: int = 8
    select_eval_chars: int = 1000
    # D7
    knn_texts: str = "builtin:wiki"
    knn_chunk_len: int = 64
    knn_train_tokens: int = 4096
    knn_eval_tokens: int = 1024
    knn_select_tokens: int = 1024
    knn_k: int = 128
    # D4
    cluster_texts: str = "builtin:code"
    cluster_max: int = 200
    # D3 / D8
    finetune_texts: str = "builtin:code"
    finetune_steps: int = 20
    finetune_batch: int = 4
    finetune_lam: float = 0.1
    finetune_eval_chunks: int = 32
    finetune_seq_len: int = 64
    finetune_n_texts: int = 60
    finetune_methods: tuple[str, ...] = ("lora", "full")

    @classmethod
    def for_n(cls, n: int, seed: int = 0, **override: Any) -> DispersionClaimsSettings:
        """Defaults scaled to ``n`` (``n <= 0``: the default 256): ``n`` segments (D1/D2),
        ``n / 2`` texts (D5), ``16 n`` datastore tokens (D7), ``n / 12`` fine-tuning steps (at
        most 20) and ``n / 8`` held-out chunks (D3/D8)."""
        n = int(n) if n and n > 0 else 256
        scaled = {"n": n, "seed": int(seed), "hardness_n": max(8, n // 2),
                  "select_eval": max(4, min(16, n // 32)),
                  "knn_train_tokens": max(1024, 16 * n), "cluster_max": max(16, min(500, n)),
                  "finetune_eval_chunks": max(8, min(64, n // 8)),
                  "finetune_steps": max(2, min(20, n // 12)),
                  "group_size": 8 if n >= 48 else max(2, n // 6)}
        return cls(**{**scaled, **override})


def selected(only: Sequence[str] | None) -> tuple[str, ...]:
    """The claim ids to measure (``only`` may name variants, ``D1.token``, or lower case)."""
    if not only:
        return CLAIMS
    want = []
    for x in only:
        base = str(x).strip().upper().split(".")[0]
        if base not in CLAIMS:
            raise ConfigError(f"{x!r} is not a dispersion claim id; use D1..D8")
        want.append(base)
    return tuple(c for c in CLAIMS if c in want)


# ---------------------------------------------------------------------- caching
def content_key(model, *parts: Any) -> str:
    """A key from the model's content identity (weights, tokenizer, dtype) and ``parts``."""
    from ..activations.forward import dtype_name, model_identity

    return stable_hash([VERSION, model_identity(model), dtype_name(model), *parts])[:16]


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(s))[-60:]


def cached_arrays(work: Path, stem: str, key: str,
                  compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``compute()`` once per key: its arrays are kept as ``work/<stem>-<key>.npz`` (written
    atomically by lmgeom) and read back on a rerun."""
    path = Path(work) / f"{_safe(stem)}-{key}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError):
            log.warning("%s is unreadable: recomputing", path)
    arrays = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})
    return arrays


class Clock:
    """Wall and CPU seconds per (claim, model), reported in each verdict's details (CPU time
    counts every thread; on a shared machine it is the steadier figure)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def time(self, claim: str, model: str) -> Iterator[None]:
        t, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            k = f"{claim}[{model}]"
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            self.seconds[k] = self.seconds.get(k, 0.0) + wall
            self.cpu[k] = self.cpu.get(k, 0.0) + cpu
            log.info("%s on %s: %.1f s wall, %.1f s CPU", claim, model, wall, cpu)

    def of(self, claim: str) -> dict[str, Any]:
        return {k: {"wall_s": round(v, 2), "cpu_s": round(self.cpu[k], 2)}
                for k, v in self.seconds.items() if k.startswith(claim + "[")}


# ---------------------------------------------------------------------- D1 / D2 measurement
def mean_state(h, mask):
    """Reducer: per row, the mean of its masked token states ``(B, d)`` (the segment vector)."""
    m = mask.float()
    return (h.float() * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1.0)


def segment_points(model) -> tuple[str, ...]:
    """The points of D1/D2: blocks 1..L and ``final`` (not the embedding output)."""
    return tuple(p for p in model.resolve_points("all") if p != "0")


def measure_segments(model, s: DispersionClaimsSettings, work: Path,
                     progress: bool | None) -> dict[str, np.ndarray]:
    """Per chunk of ``s.corpus``: perplexity, and per point both dispersions (cached).

    Returns arrays ``points (L,)``, ``depth (L,)``, ``perplexity (N,)``, ``token (L, N)``,
    ``segment (L, N)`` (per-chunk mean distance to the other segments), ``members (G, g)``,
    ``group_token (L, G)``, ``group_segment (L, G)``, ``group_perplexity (G,)``.
    """
    from ..lm.perplexity import forward_chunks
    from ..texts import load_texts
    from ..texts.chunks import make_chunks
    from .knnlm import unit_sum

    ts = load_texts(s.corpus, limit=s.corpus_limit, seed=s.seed)
    points = segment_points(model)
    key = content_key(model, ts.hash, points, s.chunk_len, s.n, s.seed, s.group_size,
                      s.max_groups)

    def compute() -> dict[str, np.ndarray]:
        ch = make_chunks(model, ts, s.chunk_len, max_chunks=s.n, seed=s.seed, bos="auto")
        # unit_sum (vectorised; the per-row token_dispersion loop costs as much as the
        # forward at 30 points) gives each segment's token dispersion
        res = forward_chunks(model, ch.tokens, points,
                             {"unit_sum": unit_sum, "claims_mean_state": mean_state},
                             nll=True, score_from=1, reduce_from=1 if ch.bos else 0,
                             batch_size=s.batch_size, progress=progress, cache=True,
                             desc=f"D1/D2 {model.name}")
        ppl = np.asarray(res.perplexity, dtype=np.float64)
        token = np.stack([rules.dispersion_from_unit_sums(res.reduced["unit_sum"][p])
                          for p in points])
        members = rules.group_members(ppl, s.group_size, s.max_groups)
        seg, gseg = [], []
        for p in points:
            V = res.reduced["claims_mean_state"][p].astype(np.float64)
            seg.append(rules.segment_distance_per_chunk(V))
            gseg.append(rules.group_dispersions(V, members) if len(members)
                        else np.zeros(0))
        L1 = model.n_blocks + 1
        return {"points": np.array(points), "perplexity": ppl, "token": token,
                "segment": np.stack(seg), "members": members,
                "depth": np.array([model.point_index(p) / L1 for p in points]),
                "group_token": token[:, members].mean(-1) if len(members)
                else np.zeros((len(points), 0)),
                "group_segment": np.stack(gseg),
                "group_perplexity": ppl[members].mean(-1) if len(members) else np.zeros(0)}

    return cached_arrays(work, f"segments-{model.name}", key, compute)


def segment_parts(m: dict[str, np.ndarray], info: ModelInfo,
                  s: DispersionClaimsSettings) -> dict[str, list[ClaimVerdict]]:
    """Per-model parts of D1.token, D1.segment, D2.token, D2.segment (chunk and group level)."""
    points = [str(p) for p in m["points"]]
    fi = points.index("final") if "final" in points else len(points) - 1
    out: dict[str, list[ClaimVerdict]] = {}
    for v in VARIANTS:
        levels = (("segments", m[v], m["perplexity"]),
                  (f"groups of {s.group_size} segments", m[f"group_{v}"],
                   m["group_perplexity"]))
        d1, d2 = [], []
        for level, X, ppl in levels:
            tag = "chunk" if level == "segments" else "group"
            d1.append(rules.correlation_verdict(
                f"D1.{v}.{tag}", X[fi], ppl, level=f"{level} at {points[fi]}", models=(info,),
                n_boot=s.n_boot, seed=s.seed))
            d2.append(rules.depth_verdict(f"D2.{v}.{tag}", X, ppl, m["depth"], level=level,
                                          models=(info,), n_boot=s.n_boot_depth, seed=s.seed))
        out[f"D1.{v}"], out[f"D2.{v}"] = d1, d2
    return out


def segment_verdicts(parts: dict[str, list[ClaimVerdict]], clock: Clock) -> list[ClaimVerdict]:
    """``D1.token``, ``D1.segment``, headline ``D1`` (and the same for D2)."""
    out = []
    for claim in ("D1", "D2"):
        by = {v: rules.combine(f"{claim}.{v}", parts.get(f"{claim}.{v}", []),
                               over="model x level parts") for v in VARIANTS}
        head, other = by[rules.HEADLINE_VARIANT], by["segment"]
        agree = "agrees" if head.verdict == other.verdict else "DISAGREES"
        note = (f"rests on the {rules.HEADLINE_VARIANT} variant (the papers' released code); the "
                f"segment variant is {other.verdict} ({agree})")
        headline = replace(head, claim=claim, statement=rules.statement(claim),
                           reason=f"{note}; {head.reason}",
                           details={**head.details, "variant": rules.HEADLINE_VARIANT,
                                    "segment_verdict": other.verdict})
        for v in (*by.values(), headline):
            v.details["seconds"] = clock.of("D1/D2")
        out += [by["token"], by["segment"], headline]
    return out


# ---------------------------------------------------------------------- D5
def measure_hardness(model, s: DispersionClaimsSettings, work: Path,
                     progress: bool | None) -> dict[str, np.ndarray]:
    """Per text of ``s.hardness_texts`` (n of them): dispersion at ``final`` and perplexity."""
    from ..texts import load_texts
    from .hardness import HardnessConfig, rank_hardness

    ts = load_texts(s.hardness_texts, limit=s.hardness_n, seed=s.seed)
    cfg = HardnessConfig(layer="final", max_length=s.hardness_max_length,
                         batch_size=s.batch_size, n_boot=s.n_boot, n_perm=s.n_boot, seed=s.seed)
    key = content_key(model, ts.hash, asdict(cfg))

    def compute() -> dict[str, np.ndarray]:
        res = rank_hardness(model, ts, cfg, progress=progress, cache=True)
        pt = res.per_text
        return {"dispersion": pt[f"dispersion@{res.layer}"].to_numpy(np.float64),
                "perplexity": pt["perplexity"].to_numpy(np.float64)}

    return cached_arrays(work, f"hardness-{model.name}", key, compute)


# ---------------------------------------------------------------------- the entry point
def measure_dispersion_claims(
    models: Sequence[str],
    infos: Sequence[ModelInfo],
    *,
    n: int,
    seed: int,
    device: str | None,
    dtype: str | None,
    work_dir: Path,
    progress: bool | None,
    suite: str | None = None,
    only: Sequence[str] | None = None,
    settings: DispersionClaimsSettings | None = None,
    runs_dir: Path | None = None,
) -> list[ClaimVerdict]:
    """Verdicts on D1-D8 (rows ``D1.token``, ``D1.segment``, ``D1`` ... see the module
    docstring) for ``models`` (specs for :func:`lmgeom.load_model`; ``infos`` the matching
    :class:`ModelInfo`). ``only`` restricts the claims; ``work_dir`` holds the resumable
    sub-results; ``runs_dir`` the fine-tuning runs of D3/D8 (run folders of their own, which may
    not lie in lmgeom's cache; default ``work_dir``); ``suite`` is a trained width suite folder
    (D4)."""
    from . import claims_dispersion_models as more
    from . import claims_dispersion_train as train

    if len(models) != len(infos):
        raise ConfigError(f"{len(models)} models but {len(infos)} model infos")
    s = settings or DispersionClaimsSettings.for_n(n, seed)
    want = selected(only)
    work = Path(work_dir)
    clock = Clock()
    d5: list[ClaimVerdict] = []
    d7: list[tuple[ClaimVerdict, ClaimVerdict]] = []
    seg_parts: dict[str, list[ClaimVerdict]] = {}
    d6 = more.GapCollector(s)
    for spec, info in zip(models, infos):
        if not set(want) & {"D1", "D2", "D5", "D6", "D7"}:
            break
        model = _load(spec, dtype, device)
        if {"D1", "D2"} & set(want):
            with clock.time("D1/D2", spec):
                m = measure_segments(model, s, work, progress)
                for k, v in segment_parts(m, info, s).items():
                    seg_parts.setdefault(k, []).extend(v)
        if "D5" in want:
            with clock.time("D5", spec):
                h = measure_hardness(model, s, work, progress)
                d5.append(rules.hardness_verdict(
                    "D5", h["dispersion"], h["perplexity"], models=(info,), n_boot=s.n_boot,
                    n_perm=s.n_boot, seed=s.seed))
        if "D6" in want:
            with clock.time("D6", spec):
                d6.add(model, spec, info, work, progress)
        if "D7" in want:
            with clock.time("D7", spec):
                d7.append(more.knn_parts(model, info, s, work, progress))
        del model
    out: list[ClaimVerdict] = []
    if {"D1", "D2"} & set(want):
        out += [v for v in segment_verdicts(seg_parts, clock) if v.claim[:2] in want]
    if "D3" in want or "D8" in want:
        with clock.time("D3/D8", train.smallest(models, infos)[0]):
            out += train.finetune_verdicts(models, infos, s, Path(runs_dir or work), want,
                                           device=device)
    if "D4" in want:
        with clock.time("D4", "suite"):
            out += more.cluster_verdict(suite, s, work, progress, dtype=dtype, device=device)
    if "D5" in want:
        out.append(rules.combine("D5", d5))
    if "D6" in want:
        out += d6.verdicts()
    if "D7" in want:
        out += more.knn_verdicts(d7)
    for v in out:
        key = "D1/D2" if v.claim[:2] in ("D1", "D2") else "D3/D8" if v.claim[:2] in (
            "D3", "D8") else v.claim[:2]
        v.details.setdefault("seconds", clock.of(key))
    order = {c: i for i, c in enumerate(CLAIMS)}
    return sorted(out, key=lambda v: (order[v.claim[:2]], v.claim != v.claim[:2], v.claim))


def _load(spec: str, dtype: str | None, device: str | None):
    from ..models import load_model

    return load_model(spec, dtype=dtype or "float32", device=device)


__all__ = ["CLAIMS", "DispersionClaimsSettings", "measure_dispersion_claims", "selected"]
