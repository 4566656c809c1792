"""Subspace PGA (Predictive-Geometric Alignment); the PC1-migration diagnostic is in
:mod:`lmgeom.metrics.pc1`.

Definition (METHODS.md): after centring / CCR-m, ``d_full(i,j) = 1 - cos(x_i, x_j)`` and
``d_proj(i,j) = 1 - cos(V_k^T x_i, V_k^T x_j)``; ``rho_readout = Spearman(d_full, d_proj)``;
null ``rho_b = Spearman(d_full, d_Q)`` for frames Q uniform on the Grassmannian;
``z = (rho_readout - mean rho_b) / std rho_b`` (ddof = 1).

How it is fast (and still exact): the full-space distances are ranked once; every frame's
cosines come from one Gram matrix of the row-normalised projection (no ``pdist``), ranked
against the reference by the compiled kernel of ``lmgeom.metrics._rank_kernel`` (int32
keys, a radix sort, runs of equal keys finished with the exact float64 distances, the
numerator summed exactly in integers); frames run on two worker threads
(``lmgeom.metrics._null_runner``; on a torch device, ``torch.sort``). Memory: per worker
one Gram matrix (up to 256 MB; larger exact layouts use blocked pair-distance vectors) and
the kernel's buffers, about ``30 P`` bytes for P pairs (N = 10 000 exact: P = 5e7, ~3 GB with
2 workers; ``pairs=200_000``: ~10 MB whatever N). At most 2**31 - 1 pairs (exact mode up to
N = 65 536 rows); above that, sample pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from lmgeom.metrics._common import (
    as_matrix,
    blas_threads,
    check_int,
    check_seed,
    config_error,
    data_error,
    pow2_normalise,
)
from lmgeom.metrics._cpu_worker import NullSpec
from lmgeom.metrics._null_runner import Runner
from lmgeom.metrics._pairs import (
    build_layout,
    make_plan,
    unique_rows,
    unit_rows,
    zero_rows_error,
)
from lmgeom.metrics.geometry import (
    RANK_RTOL,
    ZERO_RTOL,
    CCRLevels,
    cached_frames,
    ccr_levels,
    check_basis,
)
from lmgeom.metrics.sample_size import (
    MIN_PAIRS,
    MIN_PAIRS_HARD,
    FlaggedResult,
    numerical_rank,
    pga_flags,
    warn_low_sample,
)

__all__ = [
    "PGAResult",
    "frozen_array",
    "subspace_pga",
    "subspace_pga_levels",
]


@dataclass(frozen=True)
class Prepared:
    """A layer's states after validation, centring / CCR and duplicate detection."""

    Xu: np.ndarray  # (n_unique, d) unique preprocessed rows
    inv: np.ndarray | None  # (n,) row -> unique row, None if all distinct
    n: int
    d: int
    scale_raw: float  # largest input row norm
    scale: float  # largest preprocessed row norm
    fro2_raw: float = math.inf  # squared Frobenius norm of the (power-of-two scaled) input
    n_distinct: int = 0  # distinct input rows (0: not counted)

    @property
    def n_unique(self) -> int:
        return int(self.Xu.shape[0])


def prepare(X: Any, m: int, *, name: str = "X", label: str | None = None) -> Prepared:
    """Validate, centre, remove m PCs, check for zero rows, group identical rows."""
    return prepare_levels(X, (m,), name=name, label=label)[0][m]


def prepare_levels(X: Any, levels: Any, *, name: str = "X",
                   label: str | None = None) -> tuple[dict[int, Prepared], CCRLevels]:
    """:func:`prepare` for several CCR levels from one eigendecomposition (:func:`ccr_levels`)."""
    A = pow2_normalise(as_matrix(X, name=name, label=label, min_rows=4))
    n, d = A.shape
    raw_norms = np.sqrt(np.einsum("ij,ij->i", A, A))
    scale_raw = float(raw_norms.max())
    if scale_raw == 0:
        raise data_error(f"{name} is all zeros", label)
    lv = ccr_levels(A, levels, label=label)
    fro2 = float(np.dot(raw_norms, raw_norms))
    n_distinct = n if lv.rep is None else int(np.unique(lv.rep).size)
    out = {}
    for m, Xp in lv.residuals.items():
        norms = np.sqrt(np.einsum("ij,ij->i", Xp, Xp))
        bad = np.flatnonzero(~(norms > ZERO_RTOL * scale_raw))
        if bad.size:
            raise zero_rows_error(bad, n, f"in {name} after centring/CCR-{m}", label)
        Xu, inv = unique_rows(Xp)
        out[m] = Prepared(Xu=Xu, inv=inv, n=n, d=d, scale_raw=scale_raw,
                          scale=float(norms.max()), fro2_raw=fro2, n_distinct=n_distinct)
    return out, lv


def readout_projection(prep: Prepared, V: np.ndarray, plan: Any, layout: Any, *,
                       what: str, label: str | None) -> tuple[np.ndarray, Any]:
    """Unit rows of the readout projection, with rows that coincide there merged.

    Distinct states can project onto exactly the same point of the readout subspace (when
    they differ only outside it); those pairs then have distance exactly 0 and tie exactly,
    as in the definition. (Random null frames separate distinct rows almost surely, so they
    skip this check.)

    Returns:
        ``(Yu, layout)``: (n_unique', k) unit rows and the pair layout to use with them.
    """
    Y = prep.Xu @ V
    Yu, inv_y = unique_rows(np.ascontiguousarray(Y))
    if inv_y is not None:
        inv = inv_y if prep.inv is None else inv_y[prep.inv]
        layout = build_layout(plan, inv, Yu.shape[0], V.shape[1])
        Yu = Yu.copy()
    return unit_rows(Yu, scale=prep.scale, what=what, label=label), layout


PRECISIONS = ("auto", "float64", "float32")


def frame_dtype(precision: str, plan: Any, runner: Any) -> type:
    """float32 for the per-frame projections on CPU with precision="float32", and in sampled
    mode with precision="auto"; float64 otherwise (always on torch devices)."""
    if runner.torch_device is not None:
        return np.float64
    if precision == "float32" or (precision == "auto" and not plan.exact):
        return np.float32
    return np.float64


def check_precision(precision: Any, label: str | None) -> str:
    if precision not in PRECISIONS:
        raise config_error(
            f"precision must be one of {PRECISIONS}; got {precision!r}", label
        )
    return str(precision)


def check_common(n_null: Any, ccr: Any, pairs: Any, seed: Any, label: str | None) -> tuple:
    n_null = check_int(n_null, name="n_null", minimum=2, label=label)
    ccr = check_int(ccr, name="ccr", minimum=0, label=label)
    if pairs is not None:
        pairs = check_int(pairs, name="pairs", minimum=1, label=label)
    return n_null, ccr, pairs, check_seed(seed, label=label)


def null_summary(rho: float, null: np.ndarray, label: str | None) -> dict:
    """z, null mean / std (ddof=1), empirical p-value and the null's 2.5/97.5 % band in z units."""
    mean = float(null.mean())
    std = float(null.std(ddof=1))
    if not std > 0:
        raise data_error(
            "the null distribution is degenerate (all null correlations equal); z is undefined",
            label,
        )
    lo, hi = np.percentile(null, [2.5, 97.5])
    return {
        "z": (rho - mean) / std,
        "null_mean": mean,
        "null_std": std,
        "p_value": (1.0 + float(np.count_nonzero(null >= rho))) / (1.0 + null.size),
        "null_z_low": (float(lo) - mean) / std,
        "null_z_high": (float(hi) - mean) / std,
    }


def frozen_array(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class PGAResult(FlaggedResult):
    """Result of :func:`subspace_pga`.

    Attributes:
        z: PGA = (rho_readout - null_mean) / null_std.
        rho_readout: Spearman(d_full, d_readout).
        null_mean, null_std: mean and std (ddof = 1) of the null correlations.
        null: (n_null,) null correlations, in draw order (read-only).
        p_value: (1 + #{rho_b >= rho_readout}) / (1 + n_null).
        null_z_low, null_z_high: the null's 2.5 / 97.5 percentiles in z units (a null band).
        k, n_null, ccr, seed: settings used.
        pairs: number of pairs used; exact: True when every pair i < j was used.
        n, d: shape of X; n_unique: number of distinct rows after preprocessing.
        precision: dtype of the readout / null-frame projections ("float64" or "float32").
        flags: low-sample flag codes (:mod:`lmgeom.metrics.sample_size`), ``()`` for an
            ordinary result: ``low_n``, ``few_distinct``, ``low_null``, ``low_pairs``,
            ``k_rank``.
        warnings: one message per flag: what is too small and what to do (also emitted as a
            :class:`~lmgeom.errors.LowSampleWarning` unless ``warn=False``).
    """

    z: float
    rho_readout: float
    null_mean: float
    null_std: float
    null: np.ndarray
    p_value: float
    null_z_low: float
    null_z_high: float
    k: int
    n_null: int
    ccr: int
    pairs: int
    exact: bool
    seed: int
    n: int
    d: int
    n_unique: int
    precision: str
    flags: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def subspace_pga(
    X: Any,
    basis: Any,
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
) -> PGAResult:
    """Subspace PGA of one layer's states against a readout basis (METHODS.md).

    Args:
        X: (N, d) states (numpy or torch), N >= 4.
        basis: (d, k) orthonormal readout basis, 0 < k < d (:func:`readout_basis`).
        n_null: number of random frames (>= 2). Frame b is the b-th draw of
            :func:`~lmgeom.metrics.null_frames` for ``seed``.
        ccr: CCR-m, principal components removed after centring (0 = centring only).
        pairs: None -> every pair i < j (exact); an int -> one seeded sample of that many
            distinct pairs (:func:`~lmgeom.metrics.sample_pairs`), the same for the readout
            and every null; an int >= N(N-1)/2 means every pair.
        seed: seeds the null frames (``default_rng(seed)``) and the pair sample.
        device: None or "cpu" -> numpy on CPU; "cuda" (or any torch device) -> torch in
            float64 on that device (z agrees with the CPU to ~1e-9).
        precision: "auto" (default): every pair's distance and all rank / correlation
            arithmetic in float64; in sampled mode on CPU the readout and null-frame
            projections and dot products are float32 (~2x faster; cosine error ~1e-7, which
            moves z by ~1e-5, far below the pair-sampling error). "float64": float64
            everywhere. Exact mode and torch devices always use float64. The result's
            ``precision`` says which was used.
        workers: CPU worker threads for the null frames (default: 2 when there are >= 2
            cores and >= 20 000 pairs, else 1; ignored on torch devices). Results do not
            depend on it.
        label: prefix for error and warning messages (e.g. "layer 12").
        warn: emit a :class:`~lmgeom.errors.LowSampleWarning` per low-sample flag (the flags
            and messages are in the result either way).

    Returns:
        :class:`PGAResult`. A z computed from too little data (fewer than 10 rows or distinct
        states, fewer than 20 null draws, fewer than 1000 sampled pairs, or k at or above the
        rank of the preprocessed states) is returned with ``flags`` set and a warning
        (:mod:`lmgeom.metrics.sample_size` gives the minimums and why).

    Raises:
        ConfigError: k >= d, k <= 0, n_null < 2, pairs < 1, fewer than 10 sampled pairs,
            ccr < 0 or >= the rank of X, non-orthonormal basis, unusable device.
        DataError: N < 4, NaN/Inf, rows of zero norm after preprocessing, all distances equal.
    """
    n_null, ccr, pairs, seed = check_common(n_null, ccr, pairs, seed, label)
    precision = check_precision(precision, label)
    # single-threaded BLAS throughout: parallelism comes from the frame workers
    with blas_threads():
        res = _subspace_pga(X, basis, n_null, ccr, pairs, seed, device, workers, precision,
                            label)
    if warn:
        warn_messages(res.warnings)
    return res


def subspace_pga_levels(
    X: Any,
    basis: Any,
    *,
    ccr: Any = (0, 1, 5, 10),
    n_null: int = 100,
    pairs: int | None = None,
    seed: int = 0,
    device: Any = None,
    workers: int | None = None,
    precision: str = "auto",
    label: str | None = None,
    warn: bool = True,
) -> dict[int, PGAResult]:
    """Subspace PGA of one layer at several CCR levels at once.

    ``subspace_pga_levels(X, V, ccr=(0, 1, 5, 10), ...)[m]`` is what
    ``subspace_pga(X, V, ccr=m, ...)`` returns (same frames, same pair sample, same seed
    semantics), computed with shared work: one eigendecomposition for all levels, and one
    projection of the states onto each null frame for all levels. CCR-m states differ from the
    most-reduced level's by a rank correction, so with ``t = max(ccr)``
    ``X_m Q = X_t Q + (Xc P[m:t]^T)(P[m:t] Q)``; the frame's projection ``X_t Q`` is computed
    once (for a batch of frames in one GEMM) and the correction in float64.

    Agreement with :func:`subspace_pga` per level: in float64 (``precision="float64"``, and
    exact mode with ``"auto"``) z agrees to ~1e-12 (the shared eigendecomposition and the
    projection differ from the per-level ones by rounding only). With float32 projections
    (sampled mode with ``"auto"``, or ``precision="float32"``) each frame's cosines carry
    ~1e-7 rounding either way, so z agrees to ~1e-4 (measured |dz| <= 2e-5 on the benchmark
    data, far below the pair-sampling error).

    Args:
        ccr: the CCR levels (non-empty iterable of ints >= 0; duplicates are merged).
        X, basis, n_null, pairs, seed, device, workers, precision, label, warn: as in
            :func:`subspace_pga` (a message shared by several levels is emitted once).

    Returns:
        ``{m: PGAResult}`` for each level, in increasing m.
    """
    levels = _check_levels(ccr, label)
    n_null, _, pairs, seed = check_common(n_null, 0, pairs, seed, label)
    precision = check_precision(precision, label)
    with blas_threads():
        res = _pga_levels(X, basis, levels, n_null, pairs, seed, device, workers, precision,
                          label)
    if warn:
        warn_messages([w for r in res.values() for w in r.warnings])
    return res


def warn_messages(messages: Any) -> None:
    """One :class:`~lmgeom.errors.LowSampleWarning` per distinct message, in order (pointing
    at the caller of subspace_pga / subspace_pga_levels)."""
    for msg in dict.fromkeys(messages):
        warn_low_sample(msg, stacklevel=3)


def _check_levels(ccr: Any, label: str | None) -> tuple[int, ...]:
    if isinstance(ccr, (int, np.integer)) and not isinstance(ccr, bool):
        ccr = (ccr,)
    try:
        raw = list(ccr)
    except TypeError:
        raise config_error(f"ccr must be an iterable of ints >= 0; got {ccr!r}", label) from None
    if not raw:
        raise config_error("ccr: give at least one CCR level, e.g. ccr=(0, 1, 5, 10)", label)
    return tuple(sorted({check_int(m, name="ccr", minimum=0, label=label) for m in raw}))


def _subspace_pga(X: Any, basis: Any, n_null: int, ccr: int, pairs: int | None, seed: int,
                  device: Any, workers: int | None, precision: str,
                  label: str | None) -> PGAResult:
    return _pga_levels(X, basis, (ccr,), n_null, pairs, seed, device, workers, precision,
                       label)[ccr]


#: Null frames projected per GEMM (and per worker job): at most this many, and at most
#: _BATCH_ELEMS elements of projected rows per batch.
_BATCH_FRAMES = 10
_BATCH_ELEMS = 1 << 21


@dataclass
class _Level:
    """One CCR level's state for the null loop."""

    m: int
    prep: Prepared
    ref: Any
    rho: float


def _pga_levels(X: Any, basis: Any, levels: tuple[int, ...], n_null: int, pairs: int | None,
                seed: int, device: Any, workers: int | None, precision: str,
                label: str | None) -> dict[int, PGAResult]:
    preps, lv = prepare_levels(X, levels, label=label)
    any_prep = preps[levels[0]]
    n, d = any_prep.n, any_prep.d
    V = check_basis(basis, d, label=label)
    k = V.shape[1]
    plan = make_plan(n, pairs, seed, label)
    if not plan.exact and plan.n_pairs < MIN_PAIRS_HARD:
        raise config_error(
            f"pairs={plan.n_pairs}: a Spearman correlation of fewer than {MIN_PAIRS_HARD} "
            f"sampled distances is noise; use pairs >= {MIN_PAIRS} or pairs=None (every one of "
            f"the {n * (n - 1) // 2} pairs)",
            label,
        )
    flags = pga_flags(n=n, n_distinct=any_prep.n_distinct, n_null=n_null,
                      n_pairs=int(plan.n_pairs), exact=plan.exact, k=k,
                      ranks=level_ranks(preps, lv, levels, k), label=label)
    runner = Runner(plan.n_pairs, device=device, workers=workers, label=label)
    fdt = frame_dtype(precision, plan, runner)
    w = runner.main
    # levels whose duplicate structure is the same share the projections (the normal case:
    # CCR does not make distinct rows coincide); each group's top level anchors the others
    groups: dict[bytes, list[int]] = {}
    for m in levels:
        inv = preps[m].inv
        groups.setdefault(b"" if inv is None else inv.tobytes(), []).append(m)
    results: dict[int, PGAResult] = {}
    for ms in groups.values():
        prep_top = preps[ms[-1]]
        layout = build_layout(plan, prep_top.inv, prep_top.n_unique, k)
        states = []
        for m in ms:
            prep = preps[m]
            d_full = w.distances(layout, w.project(prep.Xu, None, scale=prep.scale_raw,
                                                   what="in the full space"))
            ref = w.reference(d_full, "in the full space")
            y_read, lay_read = readout_projection(prep, V, plan, layout,
                                                  what="in the readout subspace", label=label)
            y_read = y_read.astype(fdt, copy=False)
            rho = w.spearman(ref, w.distances(lay_read, w.asarray(y_read)),
                             "in the readout subspace")
            states.append(_Level(m, prep, ref, float(rho)))
        null = _null_loop(runner, states, lv, layout, fdt, n_null, seed, d, k)
        for j, st in enumerate(states):
            s = null_summary(st.rho, null[:, j], label)
            prep = st.prep
            fl = flags[None] + flags.get(st.m, [])
            results[st.m] = PGAResult(
                rho_readout=st.rho, null=frozen_array(null[:, j]), k=int(k), n_null=n_null,
                ccr=st.m, pairs=int(plan.n_pairs), exact=plan.exact, seed=seed, n=prep.n,
                d=prep.d, n_unique=prep.n_unique, precision=np.dtype(fdt).name,
                flags=tuple(c for c, _ in fl), warnings=tuple(w for _, w in fl), **s,
            )
    return {m: results[m] for m in levels}


#: Extra rows in the cheap rank certificate of :func:`level_ranks`.
_RANK_SLACK = 16


def level_ranks(preps: dict[int, Prepared], lv: CCRLevels, levels: tuple[int, ...],
                 k: int) -> dict[int, int] | None:
    """Rank r_m of the states after centring / CCR-m per level, or None when every r_m > k.

    Ranks count singular values above ``RANK_RTOL`` x the largest of the centred X (the CCR
    check's convention). Cheap in the ordinary case: the top level's first ``k + 1 + 16``
    distinct rows are a submatrix of its states, so their (k+1)-th singular value is a lower
    bound of the states', and ``||X||_F`` an upper bound of the largest: when the one exceeds
    ``RANK_RTOL`` x the other, every level has rank > k (a ~1 ms eigendecomposition of a small
    Gram matrix). Otherwise the rank is computed from the top level's full Gram matrix.
    """
    t = levels[-1]
    top = preps[t]
    q = k + 1
    if top.n_unique >= q:
        S = top.Xu[:min(top.n_unique, q + _RANK_SLACK)]
        lam = scipy.linalg.eigvalsh(S @ S.T)
        if lam[-q] > (RANK_RTOL ** 2) * top.fro2_raw:
            return None
    R = lv.residuals[t]
    if t == 0:
        r_t = numerical_rank(R, RANK_RTOL)
    else:
        # relative to the centred X's largest singular value (lambda_0 = ||Xc p_1||^2)
        c0 = lv.coefficients[:, 0]
        lam0 = float(np.ldexp(np.dot(c0, c0), 2 * lv.exponent))
        C = R @ R.T if R.shape[0] <= R.shape[1] else R.T @ R
        lam = scipy.linalg.eigvalsh(C)
        r_t = int(np.count_nonzero(lam > (RANK_RTOL ** 2) * lam0))
    return {m: r_t + (t - m) for m in levels}


def _null_loop(runner: Any, states: list[_Level], lv: CCRLevels, layout: Any, fdt: type,
               n_null: int, seed: int, d: int, k: int) -> np.ndarray:
    """(n_null, len(states)) null correlations: frames in batches, one projection per frame
    for all levels (the top level's), lower levels by their float64 rank correction."""
    top = states[-1]
    mt = top.m
    n_u = top.prep.n_unique
    firsts = _first_rows(top.prep)
    T = np.ascontiguousarray(lv.coefficients[firsts][:, :mt]) if mt else None
    Ptop = lv.directions[:mt] if mt else None
    # coefficients/directions are of the power-of-two normalised input, like prep.Xu
    Xtop = top.prep.Xu if fdt is np.float64 else top.prep.Xu.astype(fdt)
    B = max(1, min(_BATCH_FRAMES, _BATCH_ELEMS // max(1, n_u * k)))
    w0 = runner.main
    spec = NullSpec(be=w0.backend(Xtop, T, Ptop), k=k, ms=[st.m for st in states], mt=mt,
                    fdt=fdt, layout=layout, scales=[st.prep.scale for st in states])
    refs = w0.null_refs([st.ref for st in states], layout)

    def job(worker: Any, chunk: list[np.ndarray]) -> list[list[float]]:
        Yc, PQ = worker.project_batch(spec.be, chunk)
        return worker.null_rhos(spec, refs, Yc, PQ, len(chunk))

    frames = cached_frames(d, k, n_null, seed)

    def chunks():
        buf: list[np.ndarray] = []
        for f in frames:
            buf.append(f)
            if len(buf) == B:
                yield buf
                buf = []
        if buf:
            yield buf

    rows = [r for part in runner.map(job, chunks()) for r in part]
    return np.asarray(rows, dtype=np.float64).reshape(n_null, len(states))


def _first_rows(prep: Prepared) -> np.ndarray:
    """Index of each unique row's first occurrence in the input."""
    if prep.inv is None:
        return np.arange(prep.n)
    first = np.full(prep.n_unique, -1, dtype=np.int64)
    rows = np.arange(prep.n)[::-1]
    first[prep.inv[::-1]] = rows
    return first
