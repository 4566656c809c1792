"""``GeometryMonitor``: the geometry of a model while it trains, from any training loop.

Every ``every`` optimiser steps, :meth:`GeometryMonitor.step` runs one forward of a fixed probe
set (the model in eval mode, no gradients), pools each text's state at the chosen layers (last
real token), and computes per layer: Subspace PGA z (CCR-1, a seeded sample of pairs and fewer
null frames than an offline sweep), the dispersion across the probe texts, the PC1 readout
share and RankMe. The model's train / eval mode and every random generator are restored
afterwards (:mod:`lmgeom.monitor.state`), so training is bit-identical with and without it.

Rows are lmgeom's tidy table (:mod:`lmgeom.results.table`) with ``revision = "step<N>"``, so
``lmgeom sweep``'s trajectory figures (:func:`lmgeom.report.figures_sweep.plot_profiles`, and
``plot_trajectory`` after the sweep's ``trajectory_rows``) read :meth:`GeometryMonitor.rows`
unchanged.

Choosing ``every`` (the rule, from ``benchmarks/bench_monitor.py``, RESULTS.md "monitor"): the
overhead is ``t_call / (every · t_step)``, with ``t_call`` the monitor's time per call
(``GeometryMonitor.timings``: forward + metrics) and ``t_step`` one optimiser step. Take
``every >= 20 · t_call / t_step`` for at most 5 %. Measured on 2 shared CPU cores: a width-suite
model at the default shape (d = 64, 6 layers, 16 × 128 tokens a step) takes 2.0 s a step and
5.4 s a call, 2.6 % at ``every`` = 100 (5.3 % at 50, 0.5 % at 500); hence the default,
:data:`DEFAULT_EVERY` = 100. With a bigger probe set, more layers or a smaller training batch,
time one call (``monitor.measure(0)``, then ``GeometryMonitor.timings``) and apply the rule.

Use in a plain loop::

    monitor = GeometryMonitor(model, tokenizer=tok, every=100)
    for step in range(1, steps + 1):
        ...; optimizer.step()
        monitor.step(step)
    monitor.to_parquet("run/geometry.parquet")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_path
from ..activations.core import encode_texts
from ..activations.forward import length_batches, run_batches
from ..errors import ConfigError, LmgeomError
from ..results import table
from ..texts import TextSet, load_texts
from .state import preserved

log = logging.getLogger(__name__)

#: default steps between measurements (module docstring: the rule and the measurement)
DEFAULT_EVERY = 100
#: default probe set: this many texts of ``builtin:domains`` (a seeded, label-balanced sample)
DEFAULT_PROBE = "builtin:domains"
DEFAULT_N_TEXTS = 256
#: metrics logged to the Trainer (``geometry/<metric>/<layer>``); the table holds more
LOGGED = ("pga_z", "dispersion", "pc1_share", "rankme")


def _unwrap(model: Any) -> Any:
    """The ``transformers`` model inside a PeftModel / DDP wrapper."""
    m = model
    for _ in range(4):
        if callable(getattr(m, "get_base_model", None)):
            m = m.get_base_model()
        elif hasattr(m, "module") and hasattr(m.module, "modules"):
            m = m.module
        else:
            break
    return m


def adapter_for(model: Any, tokenizer: Any = None, name: str | None = None):
    """A :class:`~lmgeom.models.LanguageModel` view of ``model`` (no copy; the model's modes are
    left as they were): a LanguageModel as it is, or a ``transformers`` causal LM / PeftModel /
    DDP wrapper with ``tokenizer``."""
    from ..models import LanguageModel

    if isinstance(model, LanguageModel):
        if tokenizer is not None:
            raise ConfigError("a LanguageModel brings its own tokenizer; do not pass tokenizer=")
        return model
    hf = _unwrap(model)
    if not hasattr(hf, "modules") or not hasattr(hf, "config"):
        raise ConfigError(f"GeometryMonitor needs a transformers causal LM or an lmgeom "
                          f"LanguageModel, got {type(model).__name__}")
    if tokenizer is None:
        raise ConfigError("GeometryMonitor(model, tokenizer=...): a transformers model needs its "
                          "tokenizer to encode the probe texts")
    modes = [(m, m.training) for m in hf.modules()]
    try:  # wrap() switches to eval mode; the monitor must not
        return LanguageModel.wrap(hf, tokenizer, name=name or type(hf).__name__, identity={})
    finally:
        for m, training in modes:
            m.training = training


def default_layers(adapter) -> tuple[str, ...]:
    """Every layer (``0..L`` and ``final``) up to 12 blocks; deeper models: 8 evenly spaced block
    outputs (the last block included) and ``final``."""
    L = adapter.n_blocks
    if L <= 12:
        return adapter.layer_labels
    picks = sorted({round(x) for x in np.linspace(L / 8, L, 8)})
    return tuple(str(i) for i in picks) + ("final",)


def probe_texts_from(probe_texts: Any, n_texts: int, seed: int) -> list[str]:
    """The probe texts: ``None`` → ``n_texts`` of ``builtin:domains``; a ``load_texts`` spec
    string; a TextSet; or a sequence of strings."""
    if probe_texts is None:
        probe_texts = DEFAULT_PROBE
    if isinstance(probe_texts, str):
        probe_texts = load_texts(probe_texts, limit=n_texts, seed=seed)
    if isinstance(probe_texts, TextSet):
        probe_texts = list(probe_texts.texts)
    texts = [str(t) for t in probe_texts]
    if len(texts) < 4:
        raise ConfigError(f"the probe set needs at least 4 texts (Subspace PGA's minimum; 256 by "
                          f"default), got {len(texts)}")
    return texts


class GeometryMonitor:
    """Geometry of a model's layers on a fixed probe set, every ``every`` steps.

    Args:
        model: the model being trained: a ``transformers`` causal LM (or a PeftModel / DDP
            wrapper around one) or an lmgeom :class:`~lmgeom.models.LanguageModel`.
        probe_texts: ``None`` (default: 256 texts of ``builtin:domains``), a ``load_texts``
            spec, a TextSet or a list of strings (e.g. your evaluation texts).
        tokenizer: the model's tokenizer (not needed for a LanguageModel).
        layers: a layer spec (``"all"``, ``"4,8,final"``, ...; see
            :meth:`~lmgeom.models.LanguageModel.resolve_points`); ``None``:
            :func:`default_layers`.
        every: measure when ``step % every == 0`` (step 0 included).
        k: readout dimension, or ``"auto"``: ``min(100, d // 4)`` (as ``lmgeom sweep``).
        n_pairs: sampled pairs for PGA (``None``: every pair).
        n_null: null frames for PGA (20: the low-sample minimum; an offline sweep uses 100).
        ccr: CCR level of the PGA z.
        seed: seeds the probe sample, the pairs and the null frames (recorded in each row).
        n_texts: probe texts drawn when ``probe_texts`` is a spec or ``None``.
        max_length: tokens per probe text (longer texts are truncated).
        batch_size: probe texts per forward batch.
        name: the ``model`` column of the rows (default: the model's class name).

    Attributes:
        timings: one dict per measurement: ``step``, ``forward_s``, ``metrics_s``.
    """

    def __init__(self, model: Any, probe_texts: Any = None, *, tokenizer: Any = None,
                 layers: Any = None, every: int = DEFAULT_EVERY, k: int | str = "auto",
                 n_pairs: int | None = 4096, n_null: int = 20, ccr: int = 1, seed: int = 0,
                 n_texts: int = DEFAULT_N_TEXTS, max_length: int = 64, batch_size: int = 32,
                 name: str | None = None) -> None:
        if int(every) < 1:
            raise ConfigError(f"every must be >= 1 step, got {every}")
        self.every = int(every)
        self.adapter = adapter_for(model, tokenizer, name)
        self.name = name or self.adapter.name
        d = self.adapter.width
        self.k = min(100, d // 4) if k == "auto" else int(k)
        if not 0 < self.k < d:
            raise ConfigError(f"k = {k} must be in 1..{d - 1} for a model of width {d} "
                              "(or 'auto': min(100, d // 4))")
        self.layers = (default_layers(self.adapter) if layers is None
                       else self.adapter.resolve_points(layers))
        self.n_pairs, self.n_null, self.ccr, self.seed = n_pairs, int(n_null), int(ccr), int(seed)
        texts = probe_texts_from(probe_texts, n_texts, self.seed)
        self.encoded = encode_texts(self.adapter, texts, max_length)
        self.batches = length_batches(self.encoded.lengths, batch_size)
        self.n_texts = len(texts)
        self._rows: list[dict[str, Any]] = []
        self.timings: list[dict[str, float]] = []
        self.last_step: int | None = None

    # ------------------------------------------------------------------ measuring
    def step(self, step: int, *, force: bool = False) -> list[dict[str, Any]] | None:
        """Measure when ``step % every == 0`` (or ``force``); returns the new rows, else None.
        Call it after the optimiser step, with the number of steps done."""
        if not force and int(step) % self.every != 0:
            return None
        if self.last_step == int(step):  # already measured (e.g. the last step, forced)
            return None
        return self.measure(int(step))

    def states(self) -> dict[str, np.ndarray]:
        """One forward of the probe set: ``layer -> (N, d)`` float32 last-token states, in probe
        order. Runs in eval mode without gradients; restores modes and generators."""
        def last_token(label, h, batch):
            import torch

            rows = torch.arange(h.shape[0], device=h.device)
            return h[rows, batch.last].float().cpu().numpy()

        d = self.adapter.width
        out = {p: np.empty((self.n_texts, d), dtype=np.float32) for p in self.layers}
        with preserved(self.adapter.hf_model):
            for bo in run_batches(self.adapter, self.encoded, self.layers, last_token,
                                  batches=self.batches, progress=False, desc="monitor"):
                for p in self.layers:
                    out[p][bo.index] = bo.tensors[p]
        return out

    def measure(self, step: int) -> list[dict[str, Any]]:
        """Measure now and record the rows under ``revision = "step<step>"``."""
        t0 = time.perf_counter()
        states = self.states()
        t1 = time.perf_counter()
        with preserved(self.adapter.hf_model):  # the metrics draw no global randomness; belt and braces
            rows = self._metric_rows(step, states)
        t2 = time.perf_counter()
        self._rows += rows
        self.timings.append({"step": step, "forward_s": t1 - t0, "metrics_s": t2 - t1})
        self.last_step = step
        return rows

    def _metric_rows(self, step: int, states: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        from ..metrics import readout_basis

        W = self.adapter.W_U.detach().float().cpu().numpy()
        basis = readout_basis(W, self.k)
        L = self.adapter.n_blocks
        rev = f"step{step}"
        rows = [table.row(model=self.name, revision=rev, metric="readout_k", value=float(self.k))]
        for label in self.layers:
            idx = self.adapter.point_index(label)
            at = {"model": self.name, "revision": rev, "layer": label, "layer_index": idx,
                      "depth": idx / (L + 1)}
            try:
                rows += [table.row(**at, **r) for r in self.layer_rows(states[label], basis)]
            except LmgeomError as exc:  # a degenerate layer must not stop the training run
                log.warning("geometry monitor, step %d, layer %s: %s", step, label, exc)
        return rows

    def layer_rows(self, X: np.ndarray, basis: np.ndarray) -> list[dict[str, Any]]:
        """Metric rows (without model / layer columns) of one layer's ``(N, d)`` states."""
        from .. import metrics as M

        n = float(X.shape[0])
        r = M.subspace_pga(X, basis, n_null=self.n_null, ccr=self.ccr, pairs=self.n_pairs,
                           seed=self.seed, warn=False)
        s, npairs = f"ccr={self.ccr}", float(r.pairs)
        f = {"flag": r.flag} if r.flags else {}
        pc = M.pc1_readout_share(X, basis)
        return [
            dict(metric="pga_z", setting=s, value=r.z, seed=self.seed, n=npairs, **f),
            dict(metric="rho_readout", setting=s, value=r.rho_readout, seed=self.seed, n=npairs, **f),
            dict(metric="null_mean", setting=s, value=r.null_mean, seed=self.seed, n=npairs, **f),
            dict(metric="null_std", setting=s, value=r.null_std, seed=self.seed, n=npairs, **f),
            dict(metric="p_value", setting=s, value=r.p_value, seed=self.seed, n=npairs, **f),
            {"metric": "dispersion", "setting": "pooled=last", "value": float(M.dispersion(X)), "n": n},
            {"metric": "pc1_share", "value": pc.share, "n": n},
            {"metric": "pc1_baseline", "value": pc.baseline, "n": n},
            {"metric": "pc1_evr", "value": pc.evr, "n": n},
            {"metric": "rankme", "value": float(M.rankme(X)), "n": n},
        ]

    # ------------------------------------------------------------------ results
    @staticmethod
    def log_values(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
        """``geometry/<metric>/<layer>`` → value for the logged metrics (:data:`LOGGED`)."""
        return {f"geometry/{r['metric']}/{r['layer']}": float(r["value"])
                for r in rows if r["metric"] in LOGGED and r["layer"]}

    def rows(self):
        """Every row so far as lmgeom's tidy table (a pandas DataFrame)."""
        return table.frame(self._rows)

    def to_parquet(self, path: str | Path) -> Path:
        """Write :meth:`rows` to ``path`` atomically (replacing only a file lmgeom wrote)."""
        path = Path(path)
        with atomic_path(path) as tmp:
            self.rows().to_parquet(tmp, index=False)
        return path

    def settings(self) -> dict[str, Any]:
        """What the numbers depend on (for a manifest)."""
        return {"every": self.every, "layers": list(self.layers), "k": self.k,
                "n_pairs": self.n_pairs, "n_null": self.n_null, "ccr": self.ccr,
                "seed": self.seed, "n_texts": self.n_texts,
                "max_length": self.encoded.max_length, "pooling": "last"}


__all__ = ["DEFAULT_EVERY", "DEFAULT_N_TEXTS", "DEFAULT_PROBE", "LOGGED", "GeometryMonitor",
           "adapter_for", "default_layers", "probe_texts_from"]
