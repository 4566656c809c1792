"""The layer sweep behind ``lmgeom analyze``: PGA (several CCR levels), PC1 migration, spectral
metrics and the logit lens, per layer, into one tidy table.

Per-layer results are written to ``<out>/.work/`` as they finish, so a run killed during the
metrics stage resumes with the layers already done (the results are deterministic given the
seed, so reuse changes nothing).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import write_json
from .._testing import pause
from ..errors import ConfigError, LmgeomError
from ..results import table

log = logging.getLogger(__name__)

#: exact pairs up to this many texts; above it a seeded sample of AUTO_PAIRS pairs
AUTO_EXACT_MAX_N = 1000
AUTO_PAIRS = 250_000


@dataclass(frozen=True)
class LayerSweepConfig:
    """Settings of the per-layer metrics of one model (PGA per CCR level, PC1 share, spectra,
    logit lens): the layer sweep of ``analyze``, run per job by ``sweep`` (every setting is
    recorded in the manifest)."""

    k: int = 100
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
    from ..metrics import readout_basis

    W = model.W_U.detach().float().cpu().numpy()
    if config.k >= W.shape[1]:
        raise ConfigError(f"k = {config.k} must be smaller than the width d = {W.shape[1]} of {model.name}")
    gain = None
    if config.readout == "effective":
        g = model.final_norm_gain
        if g is None:
            raise ConfigError(f"{model.name}'s final norm has no gain: use readout=raw")
        gain = g.float().cpu().numpy()
    return readout_basis(W, config.k, gain=gain)


def layer_metrics(X: np.ndarray, basis: np.ndarray, config: LayerSweepConfig, label: str) -> list[dict[str, Any]]:
    """Metric rows (without model/layer columns) for one layer's ``(N, d)`` states."""
    from .. import metrics as M

    rows: list[dict[str, Any]] = []
    n = X.shape[0]
    pairs = config.resolved_pairs(n)
    try:
        # every CCR level of the layer at once: one eigendecomposition, one batched projection
        # per null frame (same frames and results as one subspace_pga call per level)
        levels = M.subspace_pga_levels(X, basis, ccr=config.ccr, n_null=config.n_null,
                                       pairs=pairs, seed=config.seed, device=config.device)
        for m in config.ccr:
            r = levels[m]
            s = f"ccr={m}"
            npairs = float(r.pairs)
            rows += [
                dict(metric="pga_z", setting=s, value=r.z, seed=config.seed, n=npairs),
                dict(metric="rho_readout", setting=s, value=r.rho_readout, n=npairs),
                dict(metric="null_mean", setting=s, value=r.null_mean, seed=config.seed, n=npairs),
                dict(metric="null_std", setting=s, value=r.null_std, seed=config.seed, n=npairs),
                dict(metric="null_z_low", setting=s, value=r.null_z_low, seed=config.seed, n=npairs),
                dict(metric="null_z_high", setting=s, value=r.null_z_high, seed=config.seed, n=npairs),
                dict(metric="p_value", setting=s, value=r.p_value, seed=config.seed, n=npairs),
            ]
        pc = M.pc1_readout_share(X, basis)
        rows += [
            dict(metric="pc1_share", value=pc.share, n=n),
            dict(metric="pc1_baseline", value=pc.baseline, n=n),
            dict(metric="pc1_evr", value=pc.evr, n=n),
        ]
        if config.spectral:
            for name, val in M.spectral_summary(X).items():
                rows.append(dict(metric=name, value=float(val), n=n))
    except LmgeomError as exc:
        raise type(exc)(f"layer {label}: {exc}") from exc
    return rows


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
    from ..activations.core import progress_bar

    t0 = time.perf_counter()
    basis = model_basis(model, config)
    L = model.n_blocks
    work = Path(work_dir) if work_dir else None
    all_rows: list[dict[str, Any]] = []
    bar = progress_bar(len(acts.layers), f"metrics {model.name}", progress)
    for i, label in enumerate(acts.layers):
        cached = work / f"metrics-{_safe(model.name)}-{_safe(revision)}-{label}.json" if work else None
        if cached is not None and cached.is_file():
            try:
                rows = json.loads(cached.read_text())
            except ValueError:
                rows = None
        else:
            rows = None
        if rows is None:
            rows = layer_metrics(acts.states[i], basis, config, label)
            if cached is not None:
                write_json(cached, rows)
            pause("metrics")
        idx = model.point_index(label)
        for r in rows:
            all_rows.append(table.row(model=model.name, revision=revision, layer=label,
                                      layer_index=idx, depth=idx / (L + 1), **r))
        bar.update(1)
    bar.close()
    t_pga = time.perf_counter() - t0
    t1 = time.perf_counter()
    if config.logit_lens and "final" in acts.layers:
        from ..lm import logit_lens

        for res in logit_lens(model, acts):
            idx = model.point_index(res.layer)
            common = dict(model=model.name, revision=revision, layer=res.layer, layer_index=idx,
                          depth=idx / (L + 1), n=res.n)
            all_rows.append(table.row(metric="logit_lens_top1", value=res.top1_agreement, **common))
            half = 1.96 * res.kl_std / np.sqrt(max(res.n, 1))
            all_rows.append(table.row(metric="logit_lens_kl", value=res.kl, ci_low=res.kl - half,
                                      ci_high=res.kl + half, **common))
    return table.frame(all_rows), {"metrics_s": t_pga, "logit_lens_s": time.perf_counter() - t1}


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
    from dataclasses import replace

    basis = model_basis(model, config)
    config = replace(config, spectral=False)
    summary, tidy = [], []
    for i, label in enumerate(acts.layers):
        got = {(r["metric"], r.get("setting", "")): r
               for r in layer_metrics(acts.states[i], basis, config, label)}
        for m in config.ccr:
            s = f"ccr={m}"
            summary.append({"layer": label, "ccr": m, "z": got[("pga_z", s)]["value"],
                            "rho_readout": got[("rho_readout", s)]["value"],
                            "null_mean": got[("null_mean", s)]["value"],
                            "null_std": got[("null_std", s)]["value"],
                            "p_value": got[("p_value", s)]["value"],
                            "pairs": int(got[("pga_z", s)]["n"])})
        idx = model.point_index(label)
        for r in got.values():
            tidy.append(table.row(model=model.name, revision=revision, layer=label,
                                  layer_index=idx, depth=idx / (model.n_blocks + 1), **r))
    return summary, table.frame(tidy)


#: the old name (before 0.2) of :class:`LayerSweepConfig`
SweepConfig = LayerSweepConfig


__all__ = ["LayerSweepConfig", "config_dict", "layer_metrics", "model_basis", "parse_ccr",
           "parse_pairs", "pga_rows", "run_layer_sweep"]
