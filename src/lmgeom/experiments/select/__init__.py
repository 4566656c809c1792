"""Model / checkpoint selection by the dispersion gap (``lmgeom select``).

:mod:`.inputs` (the leaf: the domain and general token sets, the candidates) ←
:mod:`.experiment` (:class:`SelectConfig`, measuring and ranking the candidates).
"""


from .experiment import (
    DEFAULT_EVAL_TEXTS,
    DEFAULT_GENERAL_TEXTS,
    VARIANTS,
    CandidateResult,
    Corpora,
    SelectConfig,
    SelectExperiment,
    SelectResult,
    SelectRun,
    config_dict,
    load_corpora,
    measure_candidate,
    run_select,
    scored_bytes,
    select_rows,
)
from .inputs import (
    DOMAINS,
    FORMS,
    Candidate,
    TokenSet,
    domain_token_ids,
    domain_words,
    filter_candidates,
    general_token_ids,
    model_candidates,
    suite_candidates,
)

__all__ = [
    "Candidate",
    "CandidateResult",
    "Corpora",
    "DEFAULT_EVAL_TEXTS",
    "DEFAULT_GENERAL_TEXTS",
    "DOMAINS",
    "FORMS",
    "SelectConfig",
    "SelectExperiment",
    "SelectResult",
    "SelectRun",
    "TokenSet",
    "VARIANTS",
    "config_dict",
    "domain_token_ids",
    "domain_words",
    "filter_candidates",
    "general_token_ids",
    "load_corpora",
    "measure_candidate",
    "model_candidates",
    "run_select",
    "scored_bytes",
    "select_rows",
    "suite_candidates",
]
