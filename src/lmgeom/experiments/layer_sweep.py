"""The layer sweep behind ``lmgeom analyze``: PGA (several CCR levels), PC1 migration, spectral
metrics and the logit lens, per layer, into one tidy table.

Per-layer results are written to ``<out>/.work/`` as they finish, so a run killed during the
metrics stage resumes with the layers already done (the results are deterministic given the
seed, so reuse changes nothing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import metrics as M
from .._io import stable_hash, write_json
from .._testing import pause
from ..activations.forward import model_identity, progress_bar
from ..errors import ConfigError, LmgeomError
from ..lm import logit_lens
from ..metrics import readout_basis
from ..metrics.sample_size import (
    MIN_PAIRS,
    MIN_PAIRS_HARD,
    describe_flag,
    join_flags,
    split_flags,
    warn_low_sample,
)
from ..results import table

log = logging.getLogger(__name__)

#: exact pairs up to this many texts; above it a seeded sample of AUTO_PAIRS pairs
AUTO_EXACT_MAX_N = 1000
AUTO_PAIRS = 250_000
#: the papers' readout dimension: the default k wherever the texts leave room for it
PAPER_K = 100


def max_k(n: int, ccr: Sequence[int]) -> int:
    """The largest readout dimension whose z is meaningful on ``n`` texts with CCR levels
    ``ccr``: after centring and CCR-m the states have rank at most ``n - 1 - m``, and z needs
    k below that rank (:mod:`lmgeom.metrics.sample_size`, flag ``k_rank``), so
    ``n - max(ccr) - 2``. ``n`` counts rows (:func:`sweep_rows`)."""
    return int(n) - max(ccr) - 2


#: rows of one layer under ``pooling="tokens"`` (extract's ``n_tokens``): a sample of token
#: positions, not one row per text
TOKEN_ROWS = 2048


def sweep_rows(n_texts: int, pooling: str) -> int:
    """How many rows (states) a layer holds for ``n_texts`` texts, as far as is known before
    the forward pass: one per text (``last`` / ``mean``), or up to :data:`TOKEN_ROWS` sampled
    token positions (``tokens``; the exact count, never more, is known after extraction). The k
    fit counts rows, not texts: 16 texts pooled by tokens give ~2,000 rows."""
    return TOKEN_ROWS if pooling == "tokens" else int(n_texts)


def fit_k(k: int | str | None, *, n: int, ccr: Sequence[int], d: int | None = None
          ) -> tuple[int, str | None]:
    """The readout dimension a run uses, decided from n, the CCR levels and (when known) the
    width d before any forward pass. Returns ``(k, note)``; ``note`` says why k differs from
    what was asked (``None`` when it does not).

    * ``None`` (the default): :data:`PAPER_K`, or :func:`max_k` when fewer texts leave no
      room for it (the note says so; the manifest and the verdicts record it);
    * ``"auto"``: ``min(100, d // 4)`` (``sweep``'s width-scaled k), capped the same way;
    * an integer: used as given, or refused at once (:class:`ConfigError` naming the largest
      k that fits and the n the k would need) when it does not fit: an explicit choice is
      never changed behind the user's back.
    """
    m = max(ccr)
    top = max_k(n, ccr)
    if top < 1:
        raise ConfigError(f"{n} texts are too few for CCR levels up to {m}: after centring "
                          f"and CCR-{m} the states have rank at most {max(n - 1 - m, 0)}, which "
                          f"leaves no readout dimension with a meaningful z; give --n {m + 4} or more "
                          "(the papers use 256-512)")
    if k is None or k == "auto":
        want = PAPER_K
        if k == "auto":
            if d is None:
                raise ConfigError("k='auto' needs the model's width d")
            want = max(1, min(PAPER_K, int(d) // 4))
        got = min(want, top, (int(d) - 1) if d is not None else want)
        if got == want:
            return got, None
        if got < top:  # the width, not the texts, is the limit
            return got, f"k = {got}, the width d = {d} minus one"
        return got, (f"k = {got} instead of {want}: {n} texts with CCR up to {m} leave rank "
                     f"{n - 1 - m} after CCR-{m}, and z needs k below it (k = n - max(CCR) - 2;"
                     f" give --n {want + m + 2} or more for k = {want})")
    try:
        k = int(k)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"k must be a positive integer or 'auto', got {k!r}") from exc
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if d is not None and k >= d:
        raise ConfigError(f"k = {k} must be smaller than the width d = {d}; use --k {d - 1} or "
                          "less, or leave --k out")
    if k > top:
        raise ConfigError(f"--k {k} does not fit {n} texts with CCR levels up to {m}: after "
                          f"centring and CCR-{m} the states have rank at most {n - 1 - m}, and "
                          f"z is only meaningful for k below it; use --k {top} or less, give "
                          f"--n {k + m + 2} or more, or leave --k out (lmgeom then takes "
                          f"k = min({PAPER_K}, n - max(CCR) - 2))")
    return k, None


@dataclass(frozen=True)
class LayerSweepConfig:
    """Settings of the per-layer metrics of one model (PGA per CCR level, PC1 share, spectra,
    logit lens): the layer sweep of ``analyze``, run per job by ``sweep`` (every setting is
    recorded in the manifest). ``k = None`` (the default) is :data:`PAPER_K` where the texts
    leave room for it (:func:`fit_k`, :meth:`fitted`)."""

    k: int | None = None
    n_null: int = 100
    ccr: tuple[int, ...] = (0, 1, 5, 10)
    pairs: int | str | None = "auto"
    readout: str = "raw"
    pooling: str = "last"
    layers: str = "all"
    max_length: int = 128
    batch_size: int = 32
    seed: int = 0
    logit_lens: bool = True
    spectral: bool = True
    device: str | None = None

    def __post_init__(self):
        if self.readout not in ("raw", "effective"):
            raise ConfigError(f"readout must be 'raw' or 'effective', got {self.readout!r}")
        if not self.ccr:
            raise ConfigError("give at least one CCR level")
        if any(m < 0 for m in self.ccr):
            raise ConfigError("CCR levels must be >= 0")
        p = self.pairs
        if isinstance(p, int) and not isinstance(p, bool) and p < MIN_PAIRS_HARD:
            # refused before any forward pass (the metric would refuse it per layer)
            raise ConfigError(f"pairs={p}: a Spearman correlation of fewer than {MIN_PAIRS_HARD} "
                              f"sampled distances is noise; use --pairs {MIN_PAIRS} or more, or "
                              "--pairs exact (every pair)")

    def fitted(self, n: int, d: int | None = None) -> tuple[LayerSweepConfig, str | None]:
        """This config with ``k`` decided for ``n`` texts (and width ``d``): :func:`fit_k`."""
        k, note = fit_k(self.k, n=n, ccr=self.ccr, d=d)
        return replace(self, k=k), note

    def rung(self, n: int, d: int | None = None) -> tuple[LayerSweepConfig, str | None]:
        """This fitted config for a smaller subset of ``n`` of its texts (an n-ladder's rung):
        the same k where the n leaves room for it, else the largest k that fits
        (:func:`max_k`), with a note saying so."""
        if self.k is None:
            return self.fitted(n, d)
        fit_k(None, n=n, ccr=self.ccr, d=d)  # raises when n leaves no room at all
        top = max_k(n, self.ccr) if d is None else min(max_k(n, self.ccr), int(d) - 1)
        if self.k <= top:
            return self, None
        return replace(self, k=top), (f"k = {top} instead of {self.k}: {n} texts leave room "
                                      f"for at most k = {top} after CCR-{max(self.ccr)}")

    def resolved_pairs(self, n: int) -> int | None:
        if self.pairs in ("auto", None, "exact", "all"):
            if self.pairs == "auto" and n > AUTO_EXACT_MAX_N:
                return AUTO_PAIRS
            return None
        p = int(self.pairs)
        if p < 1:
            raise ConfigError(f"pairs must be >= 1 (or 'exact'), got {p}")
        return p if p < n * (n - 1) // 2 else None


def model_basis(model, config: LayerSweepConfig) -> np.ndarray:
    """The ``(d, k)`` readout basis of ``model`` (raw ``W_U`` or ``W_U · diag(γ)``)."""
    W = model.W_U.detach().float().cpu().numpy()
    if config.k is None:
        raise ConfigError("the readout dimension k is not decided yet: call "
                          "LayerSweepConfig.fitted(n, d) first")
    if config.k >= W.shape[1]:
        raise ConfigError(f"k = {config.k} must be smaller than the width d = {W.shape[1]} of {model.name}")
    gain = None
    if config.readout == "effective":
        g = model.final_norm_gain
        if g is None:
            raise ConfigError(f"{model.name}'s final norm has no gain: use readout=raw")
        gain = g.float().cpu().numpy()
    return readout_basis(W, config.k, gain=gain)


def layer_metrics(X: np.ndarray, basis: np.ndarray, config: LayerSweepConfig, label: str,
                  *, warn: bool = True) -> list[dict[str, Any]]:
    """Metric rows (without model/layer columns) for one layer's ``(N, d)`` states.

    A value computed from too little data (:mod:`lmgeom.metrics.sample_size`) carries its flag
    codes in the row's ``flag`` and, with ``warn``, a :class:`~lmgeom.errors.LowSampleWarning`
    per message (prefixed ``layer <label>``).
    """
    rows, notes = layer_rows(X, basis, config, label)
    if warn:
        for msg in notes:
            warn_low_sample(f"layer {label}: {msg}", stacklevel=2)
    return rows


def layer_rows(X: np.ndarray, basis: np.ndarray, config: LayerSweepConfig,
               label: str) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`layer_metrics` without the warnings: ``(rows, low-sample messages)``."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    n = X.shape[0]
    pairs = config.resolved_pairs(n)
    try:
        # every CCR level of the layer at once: one eigendecomposition, one batched projection
        # per null frame (same frames and results as one subspace_pga call per level)
        levels = M.subspace_pga_levels(X, basis, ccr=config.ccr, n_null=config.n_null,
                                       pairs=pairs, seed=config.seed, device=config.device,
                                       warn=False)
        row_flags: set[str] = set()  # flags about the rows themselves: every metric's
        for m in config.ccr:
            r = levels[m]
            s = f"ccr={m}"
            npairs = float(r.pairs)
            f = {"flag": r.flag} if r.flags else {}
            notes += [w for w in r.warnings if w not in notes]
            row_flags |= set(r.flags) & ROW_FLAGS
            rows += [
                dict(metric="pga_z", setting=s, value=r.z, seed=config.seed, n=npairs, **f),
                dict(metric="rho_readout", setting=s, value=r.rho_readout, n=npairs, **f),
                dict(metric="null_mean", setting=s, value=r.null_mean, seed=config.seed, n=npairs, **f),
                dict(metric="null_std", setting=s, value=r.null_std, seed=config.seed, n=npairs, **f),
                dict(metric="null_z_low", setting=s, value=r.null_z_low, seed=config.seed, n=npairs, **f),
                dict(metric="null_z_high", setting=s, value=r.null_z_high, seed=config.seed, n=npairs, **f),
                dict(metric="p_value", setting=s, value=r.p_value, seed=config.seed, n=npairs, **f),
            ]
        f = {"flag": join_flags(row_flags)} if row_flags else {}
        pc = M.pc1_readout_share(X, basis)
        rows += [
            dict(metric="pc1_share", value=pc.share, n=n, **f),
            dict(metric="pc1_baseline", value=pc.baseline, n=n, **f),
            dict(metric="pc1_evr", value=pc.evr, n=n, **f),
        ]
        if config.spectral:
            for name, val in M.spectral_summary(X).items():
                rows.append(dict(metric=name, value=float(val), n=n, **f))
    except LmgeomError as exc:
        raise type(exc)(f"layer {label}: {exc}") from exc
    return rows, notes


#: flags that concern a layer's rows (few texts / distinct states) rather than PGA's settings:
#: they also mark the layer's PC1 and spectral rows
ROW_FLAGS = frozenset({"low_n", "few_distinct"})


class LowSampleNotes:
    """Low-sample messages of a sweep over layers, emitted at the end as one
    :class:`~lmgeom.errors.LowSampleWarning` per distinct message with the layers it concerns
    (instead of one per layer and CCR level)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.layers: dict[str, list[str]] = {}

    def add(self, layer: str, messages: list[str]) -> None:
        for msg in messages:
            got = self.layers.setdefault(msg, [])
            if layer not in got:
                got.append(layer)

    def add_cached(self, layer: str, rows: list[dict[str, Any]]) -> None:
        """A layer reused from the per-layer cache: its messages from the rows' flag codes."""
        codes = {c for r in rows for c in split_flags(r.get("flag"))}
        self.add(layer, [f"{describe_flag(c)} (flag {c})" for c in sorted(codes)])

    def emit(self, stacklevel: int = 2) -> list[str]:
        out = []
        for msg, layers in self.layers.items():
            where = "layer" if len(layers) == 1 else "layers"
            out.append(f"{self.what}, {where} {layer_span(layers)}: {msg} (marked in the "
                       "'flag' column)")
        for line in out:
            warn_low_sample(line, stacklevel=stacklevel + 1)
        return out


def layer_span(labels: list[str]) -> str:
    """``["0", "1", "2", "3", "5", "final"]`` -> ``"0-3, 5, final"``."""
    parts: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run.clear()

    for lab in labels:
        if lab.isdigit() and (not run or int(lab) == run[-1] + 1):
            run.append(int(lab))
            continue
        flush()
        if lab.isdigit():
            run.append(int(lab))
        else:
            parts.append(lab)
    flush()
    return ", ".join(parts)


def run_layer_sweep(
    model,
    acts,
    config: LayerSweepConfig,
    *,
    work_dir: str | Path | None = None,
    revision: str = "",
    progress: bool | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Every per-layer metric of the sweep for activations ``acts`` of ``model``.

    Returns:
        (tidy DataFrame, timings dict)
    """
    t0 = time.perf_counter()
    basis = model_basis(model, config)
    L = model.n_blocks
    work = Path(work_dir) if work_dir else None
    all_rows: list[dict[str, Any]] = []
    notes = LowSampleNotes(f"{model.name}@{revision}" if revision else model.name)
    bar = progress_bar(len(acts.layers), f"metrics {model.name}", progress)
    computed = 0
    for i, label in enumerate(acts.layers):
        cached = (work / f"metrics-{_safe(model.name)}-{_safe(revision)}-{label}-"
                         f"{_content_key(model, acts.states[i], config)}.json") if work else None
        if cached is not None and cached.is_file():
            try:
                rows = json.loads(cached.read_text())
            except ValueError:
                rows = None
        else:
            rows = None
        if rows is None:
            rows, msgs = layer_rows(acts.states[i], basis, config, label)
            computed += 1
            notes.add(label, msgs)
            if cached is not None:
                write_json(cached, rows)
            pause("metrics")
        else:
            notes.add_cached(label, rows)
        idx = model.point_index(label)
        for r in rows:
            all_rows.append(table.row(model=model.name, revision=revision, layer=label,
                                      layer_index=idx, depth=idx / (L + 1), **r))
        bar.update(1)
    bar.close()
    notes.emit()
    t_pga = time.perf_counter() - t0
    t1 = time.perf_counter()
    if config.logit_lens and "final" in acts.layers:
        for res in logit_lens(model, acts):
            idx = model.point_index(res.layer)
            common = dict(model=model.name, revision=revision, layer=res.layer, layer_index=idx,
                          depth=idx / (L + 1), n=res.n)
            all_rows.append(table.row(metric="logit_lens_top1", value=res.top1_agreement, **common))
            half = 1.96 * res.kl_std / np.sqrt(max(res.n, 1))
            all_rows.append(table.row(metric="logit_lens_kl", value=res.kl, ci_low=res.kl - half,
                                      ci_high=res.kl + half, **common))
    return table.frame(all_rows), {"metrics_s": t_pga, "logit_lens_s": time.perf_counter() - t1,
                                   "layers_computed": computed,
                                   "layers_cached": len(acts.layers) - computed}


def _content_key(model, states, config: LayerSweepConfig) -> str:
    """What a layer's cached metrics depend on, by content: the states themselves, the
    readout's weights (the model identity: weights hash, resolved revision, tokenizer) and every
    setting. A changed corpus, weights replaced in place or a moved hub revision give a new key,
    so ``.work/`` never answers with another input's numbers."""
    h = hashlib.sha256(np.ascontiguousarray(states).tobytes())
    h.update(stable_hash([model_identity(model), config_dict(config)]).encode())
    return h.hexdigest()[:16]


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)[-60:] or "_"


def config_dict(config: LayerSweepConfig) -> dict[str, Any]:
    d = asdict(config)
    d["ccr"] = list(config.ccr)
    return d


def parse_ccr(text: str) -> tuple[int, ...]:
    """``"0,1,5,10"`` → ``(0, 1, 5, 10)`` (the ``--ccr`` option)."""
    try:
        return tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError as exc:
        raise ConfigError(f"--ccr must be a comma-separated list of integers, got {text!r}") from exc


def parse_pairs(text: str | int | None) -> int | str | None:
    """``auto`` / ``exact`` / an integer (the ``--pairs`` option)."""
    if text in ("auto", "exact", None):
        return text
    try:
        return int(text)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--pairs must be 'auto', 'exact' or an integer, got {text!r}") from exc


def pga_rows(model, acts, config: LayerSweepConfig, *, revision: str = ""):
    """The PGA part of the layer sweep only (no spectra, no logit lens), for ``lmgeom pga``.

    Returns:
        (summary rows: one dict per layer × CCR level with z, rho_readout, null mean / std,
        p-value and pairs; the tidy table of every metric row)
    """
    basis = model_basis(model, config)
    config = replace(config, spectral=False)
    summary, tidy = [], []
    notes = LowSampleNotes(f"{model.name}@{revision}" if revision else model.name)
    for i, label in enumerate(acts.layers):
        rows, msgs = layer_rows(acts.states[i], basis, config, label)
        notes.add(label, msgs)
        got = {(r["metric"], r.get("setting", "")): r for r in rows}
        for m in config.ccr:
            s = f"ccr={m}"
            summary.append({"layer": label, "ccr": m, "z": got[("pga_z", s)]["value"],
                            "rho_readout": got[("rho_readout", s)]["value"],
                            "null_mean": got[("null_mean", s)]["value"],
                            "null_std": got[("null_std", s)]["value"],
                            "p_value": got[("p_value", s)]["value"],
                            "pairs": int(got[("pga_z", s)]["n"]),
                            "flag": got[("pga_z", s)].get("flag", "")})
        idx = model.point_index(label)
        for r in got.values():
            tidy.append(table.row(model=model.name, revision=revision, layer=label,
                                  layer_index=idx, depth=idx / (model.n_blocks + 1), **r))
    notes.emit()
    if not any(r["flag"] for r in summary):  # the flag column only where something is flagged
        for r in summary:
            del r["flag"]
    return summary, table.frame(tidy)


__all__ = ["LayerSweepConfig", "LowSampleNotes", "config_dict", "layer_metrics", "layer_rows",
           "layer_span", "model_basis", "parse_ccr", "parse_pairs", "pga_rows", "run_layer_sweep"]
