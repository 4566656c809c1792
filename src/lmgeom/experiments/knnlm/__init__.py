"""kNN-LM layer selection by representation dispersion (``lmgeom knnlm``).

:mod:`.dispersion` (the leaf: each candidate point's pooled dispersion) ←
:mod:`.experiment` (:class:`KnnConfig`, the datastores, the interpolation sweep).
"""


from .dispersion import (
    DEFAULT_SELECT_TOKENS,
    PointDispersion,
    measure_point_dispersion,
    pooled_dispersion,
    unit_sum,
)
from .experiment import (
    DEFAULT_CANDIDATES,
    DEFAULT_CHUNK_LEN,
    DEFAULT_EVAL_FRACTION,
    DEFAULT_MAX_EVAL_TOKENS,
    DEFAULT_MAX_TRAIN_TOKENS,
    DEFAULT_POINT,
    DEFAULT_TRAIN_TEXTS,
    KnnConfig,
    KnnlmExperiment,
    KnnlmResult,
    KnnRun,
    config_dict,
    knnlm_rows,
    run_knnlm,
    split_corpus,
)

__all__ = [
    "DEFAULT_CANDIDATES",
    "DEFAULT_CHUNK_LEN",
    "DEFAULT_EVAL_FRACTION",
    "DEFAULT_MAX_EVAL_TOKENS",
    "DEFAULT_MAX_TRAIN_TOKENS",
    "DEFAULT_POINT",
    "DEFAULT_SELECT_TOKENS",
    "DEFAULT_TRAIN_TEXTS",
    "KnnConfig",
    "KnnRun",
    "KnnlmExperiment",
    "KnnlmResult",
    "PointDispersion",
    "config_dict",
    "knnlm_rows",
    "measure_point_dispersion",
    "pooled_dispersion",
    "run_knnlm",
    "split_corpus",
    "unit_sum",
]
