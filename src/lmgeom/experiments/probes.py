"""Per-layer linear probes (METHODS.md "Linear probes") as tidy rows.

Per layer: standardised features, multinomial logistic regression, stratified k-fold CV with a
fixed seed. Rows: ``probe_acc`` (mean over folds, with a t-interval over folds as CI),
``probe_acc_std`` and ``probe_baseline`` (majority class share) — the report plots them on
the same layer axis as ``pga_z``.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import LmgeomError, TextsError
from ..results import table


def probe_rows(model, acts, *, folds: int = 5, seed: int = 0, C: float = 1.0, revision: str = "",
               progress: bool | None = None) -> list[dict]:
    from scipy import stats

    from ..activations.core import progress_bar
    from ..metrics import probe_accuracy

    if acts.labels is None:
        raise TextsError("linear probes need labeled texts (a label column, or builtin:domains)")
    y = np.asarray(acts.labels)
    L = model.n_blocks
    rows = []
    bar = progress_bar(len(acts.layers), f"probes {model.name}", progress)
    for i, label in enumerate(acts.layers):
        try:
            r = probe_accuracy(acts.states[i], y, folds=folds, seed=seed, C=C)
        except LmgeomError as exc:
            raise type(exc)(f"layer {label}: {exc}") from exc
        idx = model.point_index(label)
        accs = np.asarray(r.fold_accuracies, dtype=float)
        half = stats.t.ppf(0.975, len(accs) - 1) * accs.std(ddof=1) / math.sqrt(len(accs)) if len(accs) > 1 else math.nan
        common = dict(model=model.name, revision=revision, layer=label, layer_index=idx,
                      depth=idx / (L + 1), setting=f"folds={folds}", seed=seed, n=len(y))
        rows += [
            table.row(metric="probe_acc", value=float(accs.mean()), ci_low=float(accs.mean() - half),
                      ci_high=float(accs.mean() + half), **common),
            table.row(metric="probe_acc_std", value=float(accs.std(ddof=1)) if len(accs) > 1 else math.nan, **common),
            table.row(metric="probe_baseline", value=float(r.majority_baseline), **common),
        ]
        bar.update(1)
    bar.close()
    return rows
