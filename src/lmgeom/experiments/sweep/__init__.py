"""Scale × training-time sweep (``lmgeom sweep``): many models × checkpoints analysed on one
text set into one tidy table with regimes, trajectories and plots.

:mod:`.jobs` (the leaf: one model × checkpoint, :func:`sweep_job`, its key and the job
lists) ← :mod:`.experiment` (:class:`SweepConfig`, running the jobs on an engine, gathering).
"""


from .experiment import (
    SPECTRAL,
    SweepConfig,
    SweepResult,
    gather,
    identical_weight_groups,
    low_sample_jobs,
    run_jobs,
    run_sweep,
    tracked_layers,
    trajectory_rows,
)
from .jobs import (
    SWEEP_VERSION,
    JobOptions,
    JobResult,
    JobSpec,
    job_key,
    jobs_from_models,
    jobs_from_suite,
    select_jobs,
    sweep_job,
)

__all__ = [
    "JobOptions",
    "JobResult",
    "JobSpec",
    "SPECTRAL",
    "SWEEP_VERSION",
    "SweepConfig",
    "SweepResult",
    "gather",
    "identical_weight_groups",
    "job_key",
    "jobs_from_models",
    "jobs_from_suite",
    "low_sample_jobs",
    "run_jobs",
    "run_sweep",
    "select_jobs",
    "sweep_job",
    "tracked_layers",
    "trajectory_rows",
]
