"""``lmgeom sweep``: the analyze layer sweep over models × checkpoints, with step plots."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..experiments.options import ModelOptions
from .analyze import add_pga_args, layer_config_from_args
from .options import (
    CandidateArgs,
    ModelArgs,
    add_engine_args,
    add_extract_args,
    add_options,
    add_run_args,
    add_texts_args,
    arg,
    engine_from_args,
    options_from_args,
    run_and_report,
    text_options_from_args,
)
from .types import int_list, nonneg_int

NAME = "sweep"
HELP = "layer sweep over models x checkpoints (a width suite or hub revisions): PGA z vs width and step"
DESCRIPTION = (
    "Runs the layer sweep of `lmgeom analyze` (PGA z per CCR level, PC1 share, spectra, logit "
    "lens) on every model x checkpoint, all on one shared text set: a suite folder from "
    "`lmgeom suite train` (--suite DIR: every width x saved step), a hub model's revisions "
    "(--model EleutherAI/pythia-160m --revision step1000 --revision step2000), or several "
    "model folders (--model A --model B). Writes sweep.parquet/.csv (tidy; model = width label "
    "such as w128, revision = checkpoint such as step512), the regime of every checkpoint "
    "(direct / detour), manifest.json, plots (z per layer per checkpoint, tracked-layer z, "
    "validation loss and spectra vs step) and report.html. Finished jobs are reused on a rerun; "
    "a failing job is recorded and the others go on, and the command then exits 1 naming it."
)


@dataclass(frozen=True)
class SweepArgs:
    """What ``sweep`` adds.

    Attributes:
        no_logit_lens: skip the logit lens.
        no_report: write the table and manifest only (no plots, no report.html).
        threads: torch/BLAS threads per job (1 is fastest on a shared machine; 0 = leave as
            is).
    """

    no_logit_lens: bool = False
    no_report: bool = False
    threads: int = field(default=1, metadata=arg(type=nonneg_int))


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = add_options(p, CandidateArgs, title="models")
    add_options(g, ModelOptions, repeat=("revision",), tweak={"revision": {"metavar": "REV"}})
    add_options(g, ModelArgs, only=("model_args",))
    add_texts_args(p, n=256)
    add_extract_args(p)
    add_pga_args(p, ccr="1,5,10", defaults={"k": "auto"}, tweak={"k": {
        "type": None, "help": "readout subspace dimension: an integer, or 'auto' = min(100, "
                              "d // 4) per model"}})
    add_options(p, SweepArgs, exclude=("threads",))
    add_engine_args(p)
    add_options(p, SweepArgs, only=("threads",))
    add_run_args(p, out=None)


def run(args) -> int:
    from ..experiments.sweep import JobOptions, SweepConfig, select_jobs

    jobs, name = select_jobs(suite=args.suite, widths=int_list(args.widths, "--widths"),
                             steps=int_list(args.steps, "--steps"), models=args.model,
                             revisions=args.revision)
    if args.k != "auto" and not (str(args.k).isdigit() and int(args.k) >= 1):
        raise ConfigError(f"--k must be a positive integer or 'auto', got {args.k!r}")
    config = SweepConfig(
        jobs=tuple(jobs), texts=text_options_from_args(args),
        layers=layer_config_from_args(args, logit_lens=not args.no_logit_lens, k=100),
        options=options_from_args(args, JobOptions, cache=not args.no_cache,
                                  threads=args.threads or None),
        engine=engine_from_args(args),
        suite=str(Path(args.suite).resolve()) if args.suite else None, name=name)
    args.out = args.out or f"runs/sweep-{name}"
    run = run_and_report(config, args, report=not args.no_report)
    failed = run.result.entries.get("failed_jobs", [])
    if not failed:
        return 0
    # a sweep with a failed job is not a success: exit 1, naming them (the finished jobs'
    # rows are written and reused by a rerun, which retries only the failed ones)
    names = ", ".join(f"{f['name']} ({str(f.get('error') or '').split(':')[0]})" for f in failed)
    print(f"lmgeom sweep: {len(failed)} of {len(jobs)} jobs failed: {names}; the other jobs' "
          f"rows are in {run.path}/sweep.parquet, the errors in manifest.json (failed_jobs); "
          "fix the cause and rerun the same command to run only the failed jobs",
          file=sys.stderr)
    return 1
