"""Linear probes (METHODS.md "Linear probes"): how linearly decodable a label is from a layer.

Standardised features (``StandardScaler`` inside a ``Pipeline``, so each fold is scaled with
its own training statistics: no leak across folds), multinomial logistic regression
(scikit-learn's lbfgs ``LogisticRegression``), ``StratifiedKFold(n_splits=folds, shuffle=True,
random_state=seed)``. Fits run with BLAS on one thread (faster here, and the same bits on
any core count).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmgeom.metrics._common import (
    as_matrix,
    blas_threads,
    check_int,
    check_seed,
    config_error,
    data_error,
)

__all__ = ["ProbeResult", "probe_accuracy"]


@dataclass(frozen=True)
class ProbeResult:
    """Cross-validated probe accuracy.

    Attributes:
        fold_accuracies: accuracy on each held-out fold, in fold order.
        mean: mean fold accuracy; std: std over folds (ddof = 1).
        majority_baseline: frequency of the most common class (accuracy of always guessing it).
        n, d, n_classes, folds, seed, C, max_iter: sizes and settings used.
        converged: False if lbfgs hit max_iter in any fold.
    """

    fold_accuracies: tuple[float, ...]
    mean: float
    std: float
    majority_baseline: float
    n: int
    d: int
    n_classes: int
    folds: int
    seed: int
    C: float
    max_iter: int
    converged: bool


def probe_accuracy(
    X: Any,
    y: Any,
    *,
    folds: int = 5,
    seed: int = 0,
    C: float = 1.0,
    max_iter: int = 1000,
    label: str | None = None,
) -> ProbeResult:
    """Stratified k-fold accuracy of a standardised multinomial logistic-regression probe.

    Args:
        X: (N, d) features (one layer's pooled states).
        y: (N,) class labels (any hashable values: ints, strings).
        folds: number of stratified folds (>= 2).
        seed: ``random_state`` of the fold shuffle (the solver is deterministic).
        C: inverse L2 regularisation strength.
        max_iter: lbfgs iteration limit.

    Raises:
        ConfigError: folds < 2, C <= 0, max_iter < 1.
        DataError: length mismatch, non-finite X, a single class, or a class with fewer
            members than ``folds``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    folds = check_int(folds, name="folds", minimum=2, label=label)
    seed = check_seed(seed, label=label)
    max_iter = check_int(max_iter, name="max_iter", minimum=1, label=label)
    if not isinstance(C, (int, float)) or not C > 0:
        raise config_error(f"C must be a positive number; got {C!r}", label)
    A = as_matrix(X, name="X", label=label, min_rows=2)
    labels = np.asarray(y.detach().cpu().numpy() if hasattr(y, "detach") else y)
    if labels.ndim != 1 or labels.shape[0] != A.shape[0]:
        raise data_error(
            f"y must be 1-D with one label per row of X ({A.shape[0]}); got shape {labels.shape}",
            label,
        )
    classes, counts = np.unique(labels, return_counts=True)
    names = [c.item() if hasattr(c, "item") else c for c in classes]
    if classes.size < 2:
        raise data_error(
            f"y has a single class ({names[0]!r}); a probe needs at least 2 classes", label
        )
    small = [(c, int(k)) for c, k in zip(names, counts) if k < folds]
    if small:
        desc = ", ".join(f"{c!r}: {k}" for c, k in small[:5])
        raise data_error(
            f"{len(small)} classes have fewer members than folds={folds} ({desc}); use fewer "
            "folds, more texts, or merge rare classes",
            label,
        )
    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    accs = []
    converged = True
    for train, test in skf.split(A, labels):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=float(C), max_iter=max_iter))
        # one BLAS thread: lbfgs on these small (n x d) problems is ~10x faster single-threaded
        # (threading overhead on every tiny matmul), and the result no longer depends on the
        # machine's core count
        with warnings.catch_warnings(record=True) as caught, blas_threads():
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(A[train], labels[train])
        if any(issubclass(w.category, ConvergenceWarning) for w in caught):
            converged = False
        accs.append(float(np.mean(model.predict(A[test]) == labels[test])))
    acc = np.asarray(accs)
    return ProbeResult(
        fold_accuracies=tuple(accs), mean=float(acc.mean()), std=float(acc.std(ddof=1)),
        majority_baseline=float(counts.max() / counts.sum()), n=int(A.shape[0]),
        d=int(A.shape[1]), n_classes=int(classes.size), folds=folds, seed=seed, C=float(C),
        max_iter=max_iter, converged=converged,
    )
