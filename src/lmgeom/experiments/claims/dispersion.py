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
  byte) on code and on math; see :mod:`lmgeom.experiments.claims.dispersion_models`.
* **D7** — :func:`lmgeom.experiments.knnlm.run_knnlm` with the last block's ``attn_out`` and
  ``ffn_out`` as candidate keys; see :mod:`lmgeom.experiments.claims.dispersion_models`.
* **D4** — :mod:`lmgeom.experiments.clusters` on the first and last checkpoint of each width of
  a trained suite (``--suite``); not testable without checkpoints.
* **D3 / D8** — :mod:`lmgeom.experiments.finetune` on the smallest model, LoRA and full, arms
  ``none`` and ``push-away``; see :mod:`lmgeom.experiments.claims.dispersion_train`.

Everything measured is cached in ``work_dir`` under a key made of the model's content identity,
the texts' hash and every setting (the forward passes also use the forward cache), so an
interrupted run resumes and a changed input recomputes. Seconds spent per claim and model go
into each verdict's ``details["seconds"]``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from ...lm.scoring import forward_chunks
from ...metrics import claims_dispersion as rules
from ...metrics.claims import ClaimVerdict, ModelInfo
from ...models import load_model
from ...texts import load_texts
from ...texts.chunks import make_chunks
from ..hardness import HardnessConfig, rank_hardness
from ..knnlm import unit_sum
from . import dispersion_models as more
from . import dispersion_train as train
from .dispersion_base import (
    CLAIMS,
    VARIANTS,
    Clock,
    DispersionClaimsSettings,
    cached_arrays,
    content_key,
    selected,
)

log = logging.getLogger(__name__)


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
    return load_model(spec, dtype=dtype or "float32", device=device)


__all__ = ["measure_dispersion_claims", "measure_hardness", "measure_segments", "segment_parts",
           "segment_verdicts"]
