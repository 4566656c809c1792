"""``lmgeom sweep``: the analyze layer sweep over models × checkpoints, with step plots."""

from __future__ import annotations

import argparse
import sys

from .options import (
    add_engine_args,
    add_extract_args,
    add_model_args_option,
    add_run_args,
    add_texts_args,
    int_range,
    nonneg_int,
)

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--suite", metavar="DIR", default=None,
                   help="suite folder from `lmgeom suite train`: every width x checkpoint")
    g.add_argument("--widths", default=None, help="with --suite: only these widths (comma list)")
    g.add_argument("--steps", default=None, help="with --suite: only these steps (comma list)")
    g.add_argument("--model", action="append", default=None, metavar="SPEC",
                   help="model to sweep (hub id, folder, bundled name); repeat for several")
    g.add_argument("--revision", action="append", default=None, metavar="REV",
                   help="hub revision of every --model (e.g. Pythia's step1000); repeat for several")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the forward pass")
    g.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    g.add_argument("--device-map", default=None,
                   help="transformers device_map, e.g. auto: spread a big model over GPUs/CPU")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow code shipped with a hub model to run")
    add_model_args_option(g)
    add_texts_args(p, n=256)
    add_extract_args(p)
    g = p.add_argument_group("PGA")
    g.add_argument("--k", default="auto",
                   help="readout subspace dimension: an integer, or 'auto' = min(100, d // 4) per model")
    g.add_argument("--n-null", type=int_range(2), default=100, help="random subspaces in the null")
    g.add_argument("--ccr", default="1,5,10", help="CCR levels (comma list); the regime uses CCR-1")
    g.add_argument("--pairs", default="auto",
                   help="'exact', an integer (a seeded sample of pairs) or 'auto'")
    g.add_argument("--readout", default="raw", choices=["raw", "effective"],
                   help="readout basis from W_U (raw) or W_U·diag(final-norm gain)")
    g.add_argument("--metrics-device", default=None, help="device for the PGA computation")
    p.add_argument("--no-logit-lens", action="store_true", help="skip the logit lens")
    p.add_argument("--no-report", action="store_true",
                   help="write the table and manifest only (no plots, no report.html)")
    add_engine_args(p)
    p.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch/BLAS threads per job (1 is fastest on a shared machine; 0 = leave as is)")
    add_run_args(p, out=None)


def run(args) -> int:
    from pathlib import Path

    from ..errors import ConfigError
    from ..experiments.sweep import JobOptions, SweepConfig, select_jobs
    from .analyze import layer_config_from_args
    from .options import engine_from_args, int_list, run_and_report, text_options_from_args

    jobs, name = select_jobs(suite=args.suite, widths=int_list(args.widths, "--widths"),
                             steps=int_list(args.steps, "--steps"), models=args.model,
                             revisions=args.revision)
    if args.k != "auto" and not (str(args.k).isdigit() and int(args.k) >= 1):
        raise ConfigError(f"--k must be a positive integer or 'auto', got {args.k!r}")
    config = SweepConfig(
        jobs=tuple(jobs), texts=text_options_from_args(args),
        layers=layer_config_from_args(args, logit_lens=not args.no_logit_lens, k=100),
        options=JobOptions(dtype=args.dtype, device=args.device, cache=not args.no_cache,
                           threads=args.threads or None, k=args.k,
                           trust_remote_code=args.trust_remote_code, device_map=args.device_map),
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
