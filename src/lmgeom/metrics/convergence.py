"""Cross-model convergence: do two models order the same texts' distances alike?

METHODS.md "Cross-model convergence": pairwise cosine-distance vectors of the same N texts in
two models, compared by Spearman (a) in the full spaces, (b) in each model's own readout space
``V_k^A``, ``V_k^B``, (c) in random k-frames (one independent frame per model per draw), with a
z of (b) against (c). Preprocessing (centring / CCR-m), duplicate handling, pair sampling,
distances and ranking are the same code as :func:`~lmgeom.metrics.subspace_pga`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmgeom.metrics._common import blas_threads, config_error, data_error
from lmgeom.metrics._null_runner import Runner
from lmgeom.metrics._pairs import build_layout, make_plan
from lmgeom.metrics.geometry import check_basis, iter_frames
from lmgeom.metrics.pga import (
    check_common,
    check_precision,
    frame_dtype,
    frozen_array,
    level_ranks,
    null_summary,
    prepare_levels,
    readout_projection,
    warn_messages,
)
from lmgeom.metrics.sample_size import (
    MIN_NULL,
    MIN_PAIRS,
    MIN_PAIRS_HARD,
    FlaggedResult,
    join_flags,
    pga_flags,
    split_flags,
)

__all__ = ["AlignmentResult", "cross_model_alignment"]


@dataclass(frozen=True, eq=False)
class AlignmentResult(FlaggedResult):
    """Result of :func:`cross_model_alignment`.

    Attributes:
        rho_full: Spearman(D_A, D_B) with distances in the full spaces.
        rho_readout: the same in each model's own readout space.
        z: (rho_readout - null_mean) / null_std.
        null_mean, null_std: of the random-frame correlations (ddof = 1).
        null: (n_null,) random-frame correlations, in draw order (read-only).
        p_value: (1 + #{rho_b >= rho_readout}) / (1 + n_null).
        null_z_low, null_z_high: the null's 2.5 / 97.5 percentiles in z units.
        k_a, k_b, d_a, d_b, n, n_null, ccr, seed: sizes and settings used.
        pairs: number of pairs used; exact: True when every pair was used.
        precision: dtype of the readout / null-frame projections ("float64" or "float32").
        flags: low-sample flag codes, as in :class:`~lmgeom.metrics.PGAResult` (``()`` for
            an ordinary result); warnings: their messages (``k_rank`` / ``few_distinct`` once
            per model concerned).
    """

    rho_full: float
    rho_readout: float
    z: float
    null_mean: float
    null_std: float
    null: np.ndarray
    p_value: float
    null_z_low: float
    null_z_high: float
    k_a: int
    k_b: int
    d_a: int
    d_b: int
    n: int
    n_null: int
    ccr: int
    pairs: int
    exact: bool
    seed: int
    precision: str
    flags: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def cross_model_alignment(
    X_a: Any,
    X_b: Any,
    basis_a: Any,
    basis_b: Any,
    *,
    n_null: int = 100,
    ccr: int = 1,
    pairs: int | None = None,
    seed: int = 0,
    device: Any = None,
    workers: int | None = None,
    precision: str = "auto",
    label: str | None = None,
    warn: bool = True,
    names: tuple[str, str] = ("model A", "model B"),
) -> AlignmentResult:
    """Spearman agreement of two models' distance structures, full vs readout vs random frames.

    Args:
        X_a: (N, d_a) states of model A; row i must be the same text as row i of ``X_b``.
        X_b: (N, d_b) states of model B.
        basis_a: (d_a, k_a) orthonormal readout basis of model A (:func:`readout_basis`).
        basis_b: (d_b, k_b) orthonormal readout basis of model B.
        n_null: random-frame draws (>= 2). Draw b takes model A's frame then model B's frame
            from ``numpy.random.default_rng(seed)`` (each a :func:`random_frame`).
        ccr: CCR-m applied to each model's states separately.
        pairs: None -> every pair; an int -> one seeded sample of distinct pairs
            (:func:`sample_pairs`), shared by both models and all spaces.
        seed: seeds the frames and the pair sample.
        device, workers, precision, label, warn: as in :func:`subspace_pga` (the same
            low-sample minimums, :mod:`lmgeom.metrics.sample_size`; k_rank per model).
        names: what the warnings call the two models (their names, in ``lmgeom converge``).

    Returns:
        :class:`AlignmentResult`.
    """
    n_null, ccr, pairs, seed = check_common(n_null, ccr, pairs, seed, label)
    precision = check_precision(precision, label)
    with blas_threads():  # single-threaded BLAS: parallelism comes from the frame workers
        res = _alignment(X_a, X_b, basis_a, basis_b, n_null, ccr, pairs, seed, device, workers,
                         precision, label, names)
    if warn:
        warn_messages(res.warnings)
    return res


def _alignment(X_a: Any, X_b: Any, basis_a: Any, basis_b: Any, n_null: int, ccr: int,
               pairs: int | None, seed: int, device: Any, workers: int | None, precision: str,
               label: str | None, names: tuple[str, str] = ("model A", "model B")
               ) -> AlignmentResult:
    preps_a, lv_a = prepare_levels(X_a, (ccr,), name="X_a", label=label)
    preps_b, lv_b = prepare_levels(X_b, (ccr,), name="X_b", label=label)
    pa, pb = preps_a[ccr], preps_b[ccr]
    if pa.n != pb.n:
        raise data_error(
            f"X_a has {pa.n} rows but X_b has {pb.n}; both must hold the same texts in the "
            "same order",
            label,
        )
    Va = check_basis(basis_a, pa.d, name="basis_a", label=label)
    Vb = check_basis(basis_b, pb.d, name="basis_b", label=label)
    ka, kb = Va.shape[1], Vb.shape[1]
    plan = make_plan(pa.n, pairs, seed, label)
    if not plan.exact and plan.n_pairs < MIN_PAIRS_HARD:
        raise config_error(
            f"pairs={plan.n_pairs}: a Spearman correlation of fewer than {MIN_PAIRS_HARD} "
            f"sampled distances is noise; use pairs >= {MIN_PAIRS} or pairs=None (every pair)",
            label,
        )
    # shared by both models: rows, null draws, pairs; per model: distinct states, k vs rank
    fl = pga_flags(n=pa.n, n_distinct=pa.n, n_null=n_null, n_pairs=int(plan.n_pairs),
                   exact=plan.exact, k=0, ranks=None, label=label)[None]
    for name, preps, lv, k in ((names[0], preps_a, lv_a, ka), (names[1], preps_b, lv_b, kb)):
        got = pga_flags(n=pa.n, n_distinct=preps[ccr].n_distinct, n_null=MIN_NULL,
                        n_pairs=int(plan.n_pairs), exact=True, k=k,
                        ranks=level_ranks(preps, lv, (ccr,), k),
                        label=f"{label}: {name}" if label else name)
        fl += [f for f in got[None] + got.get(ccr, []) if f[0] != "low_n"]
    lay_a = build_layout(plan, pa.inv, pa.n_unique, ka)
    lay_b = build_layout(plan, pb.inv, pb.n_unique, kb)
    runner = Runner(plan.n_pairs, device=device, workers=workers, label=label)

    fdt = frame_dtype(precision, plan, runner)
    Xa_f = pa.Xu if fdt is np.float64 else pa.Xu.astype(fdt)
    Xb_f = pb.Xu if fdt is np.float64 else pb.Xu.astype(fdt)

    def corr(worker: Any, Qa: np.ndarray | None, Qb: np.ndarray | None, what: str) -> float:
        ya = worker.project(pa.Xu if Qa is None else Xa_f, Qa,
                            scale=pa.scale_raw if Qa is None else pa.scale,
                            what=f"in model A's {what}")
        ref = worker.reference(worker.distances(lay_a, ya, slot=0), f"in model A's {what}")
        yb = worker.project(pb.Xu if Qb is None else Xb_f, Qb,
                            scale=pb.scale_raw if Qb is None else pb.scale,
                            what=f"in model B's {what}")
        return worker.spearman(ref, worker.distances(lay_b, yb, slot=1), f"in model B's {what}")

    w = runner.main
    rho_full = corr(w, None, None, "full space")
    ya, la = readout_projection(pa, Va, plan, lay_a, what="in model A's readout subspace",
                                label=label)
    yb, lb = readout_projection(pb, Vb, plan, lay_b, what="in model B's readout subspace",
                                label=label)
    ya, yb = ya.astype(fdt, copy=False), yb.astype(fdt, copy=False)
    ref_r = w.reference(w.distances(la, w.asarray(ya), slot=0), "in model A's readout subspace")
    rho_read = w.spearman(ref_r, w.distances(lb, w.asarray(yb), slot=1),
                          "in model B's readout subspace")
    rng = np.random.default_rng(seed)
    frames = iter_frames(rng, [(pa.d, ka), (pb.d, kb)], n_null)
    null = np.asarray(runner.map(lambda wk, fr: corr(wk, fr[0], fr[1], "null frame"), frames))
    s = null_summary(rho_read, null, label)
    return AlignmentResult(
        rho_full=float(rho_full), rho_readout=float(rho_read), null=frozen_array(null),
        k_a=int(ka), k_b=int(kb), d_a=pa.d, d_b=pb.d, n=pa.n, n_null=n_null, ccr=ccr,
        pairs=int(plan.n_pairs), exact=plan.exact, seed=seed, precision=np.dtype(fdt).name,
        flags=tuple(split_flags(join_flags(c for c, _ in fl))),
        warnings=tuple(w for _, w in fl), **s,
    )
