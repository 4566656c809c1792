"""``lmgeom sweep``: the analyze layer sweep over models × checkpoints, with step plots."""

from __future__ import annotations

import argparse
import time

from ._common import (
    add_engine_args,
    add_extract_args,
    add_run_args,
    add_texts_args,
    load_texts_from_args,
    print_table,
    progress_from_args,
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
    "a failing job is recorded and the others go on."
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
    add_texts_args(p, n=256)
    add_extract_args(p)
    g = p.add_argument_group("PGA")
    g.add_argument("--k", default="auto",
                   help="readout subspace dimension: an integer, or 'auto' = min(100, d // 4) per model")
    g.add_argument("--n-null", type=int, default=100, help="random subspaces in the null")
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
    p.add_argument("--threads", type=int, default=1,
                   help="torch/BLAS threads per job (1 is fastest on a shared machine; 0 = leave as is)")
    add_run_args(p, out=None)


def _ints(s: str | None, what: str) -> list[int] | None:
    from ..errors import ConfigError

    if not s:
        return None
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--{what} must be a comma-separated list of integers, got {s!r}") from exc


def _config(args):
    from ..errors import ConfigError
    from ..experiments.layer_sweep import LayerSweepConfig

    ccr = tuple(_ints(args.ccr, "ccr") or ())
    pairs = args.pairs
    if pairs not in ("auto", "exact"):
        try:
            pairs = int(pairs)
        except ValueError as exc:
            raise ConfigError(f"--pairs must be 'auto', 'exact' or an integer, got {args.pairs!r}") from exc
    if args.k != "auto":
        try:
            if int(args.k) < 1:
                raise ValueError
        except ValueError as exc:
            raise ConfigError(f"--k must be a positive integer or 'auto', got {args.k!r}") from exc
    return LayerSweepConfig(k=100, n_null=args.n_null, ccr=ccr, pairs=pairs, readout=args.readout,
                       pooling=args.pooling, layers=args.layers, max_length=args.max_length,
                       batch_size=args.batch_size, seed=args.seed,
                       logit_lens=not args.no_logit_lens, device=args.metrics_device)


def run(args) -> int:
    from pathlib import Path

    from .._io import write_json
    from ..errors import ConfigError
    from ..experiments.layer_sweep import config_dict
    from ..experiments.sweep import (
        JobOptions,
        jobs_from_models,
        jobs_from_suite,
        run_sweep,
        write_sweep_report,
    )
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now
    from ._common import engine_from_args

    t_start = time.perf_counter()
    progress = progress_from_args(args)
    if bool(args.suite) == bool(args.model):
        raise ConfigError("give either --suite DIR or one or more --model (not both)")
    suite_manifest = None
    if args.suite:
        if args.revision:
            raise ConfigError("--revision is for hub models; a suite's checkpoints are its steps "
                              "(select them with --steps)")
        from ..training.suite import read_suite

        suite_manifest = read_suite(args.suite)
        jobs = jobs_from_suite(args.suite, widths=_ints(args.widths, "widths"),
                               steps=_ints(args.steps, "steps"))
        name = Path(args.suite).resolve().name
    else:
        if args.widths or args.steps:
            raise ConfigError("--widths / --steps select checkpoints of a --suite")
        jobs = jobs_from_models(args.model, args.revision)
        name = "_".join(m.replace("/", "_") for m in args.model)[:80]
    config = _config(args)
    options = JobOptions(dtype=args.dtype, device=args.device, cache=not args.no_cache,
                         threads=args.threads or None, k=args.k,
                         trust_remote_code=args.trust_remote_code, device_map=args.device_map)
    engine = engine_from_args(args)
    out = args.out or f"runs/sweep-{name}"
    settings = {
        "suite": str(Path(args.suite).resolve()) if args.suite else None,
        "jobs": [[j.model, j.revision, j.spec] for j in jobs],
        "texts": args.texts, "n": args.n, "text_column": args.text_column,
        "label_column": args.label_column, "split": args.split, "dtype": args.dtype,
        "k": args.k, "sweep": config_dict(config),
    }
    signature = run_signature(settings)
    out_dir = prepare_out_dir(out, signature, overwrite=args.overwrite)
    manifest = base_manifest("sweep", settings, signature)
    manifest["engine"] = engine.describe()
    t = time.perf_counter()
    texts = load_texts_from_args(args)
    timings = {"texts_s": time.perf_counter() - t}
    t = time.perf_counter()
    result = run_sweep(jobs, texts, config, out_dir=out_dir, options=options, progress=progress,
                       engine=engine)
    timings["jobs_s"] = time.perf_counter() - t
    df = result.frame
    table.write_table(df, out_dir, "sweep")
    entries = result.entries
    manifest.update({
        "models": sorted({j.model for j in jobs}, key=lambda m: (len(m), m)),
        "texts": texts.source, "n_texts": len(texts), "texts_hash": texts.hash,
        "n_dropped_texts": texts.n_dropped,
        "k_rule": "min(100, d // 4)" if args.k == "auto" else f"k = {args.k}",
        "seeds": {"texts": args.seed, "pga_null_and_pairs": config.seed},
        **entries,
    })
    if suite_manifest is not None:
        manifest["suite_manifest"] = {k: suite_manifest.get(k) for k in (
            "format", "tokens_per_width", "steps_total", "seed", "checkpoint_steps",
            "identical_weights")}
        manifest["suite_manifest"]["data_hash"] = suite_manifest.get("data", {}).get("data_hash")
    t = time.perf_counter()
    manifest["finished"] = now()
    report = None
    if not args.no_report:
        report = write_sweep_report(out_dir, df, manifest, entries, n_jobs=len(jobs),
                                    ccrs=config.ccr, title=f"lmgeom sweep — {name}")
    timings["report_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_start
    manifest["timings"] = timings
    write_json(out_dir / "manifest.json", manifest)

    _print_summary(df, entries, config)
    n_fail = len(entries["failed_jobs"])
    what = "plots and the report:\n  " + str(report.resolve()) if report else "(no report)"
    print(f"\n{len(jobs) - n_fail} of {len(jobs)} jobs ok; wrote {out_dir}/sweep.parquet, "
          f"sweep.csv, manifest.json, {what}")
    print(f"total {timings['total_s']:.1f} s")
    return 0 if n_fail < len(jobs) else 1


def _print_summary(df, entries, config) -> None:
    from ..experiments.sweep import last_revisions

    per_layer = df.loc[df["layer_index"] >= 0]
    if per_layer.empty:
        return
    last = last_revisions(per_layer)
    ccrs = [f"ccr={m}" for m in config.ccr if m in (1, 5)]
    for model, rev in last.items():
        g = per_layer.loc[(per_layer["model"] == model) & (per_layer["revision"] == rev)
                          & (per_layer["metric"] == "pga_z")]
        z = g.pivot_table(index=["layer_index", "layer"], columns="setting", values="value", sort=True)
        rows = [{"layer": layer, **{f"z {c}": float(r[c]) for c in ccrs if c in z.columns}}
                for (_, layer), r in z.iterrows()]
        key = f"{model}@{rev}" if rev else model
        vl = df.loc[(df["model"] == model) & (df["revision"] == rev) & (df["metric"] == "val_loss"), "value"]
        tail = f", val loss {float(vl.iloc[0]):.3f}" if len(vl) else ""
        print(f"\n{key}: {entries['regimes'].get(key, 'no regime')}{tail}")
        print_table(rows, floatfmt="{:.2f}")
    for group in entries["identical_weights"]:
        print("WARNING: identical weights: " + ", ".join(group))
    for f in entries["failed_jobs"]:
        print(f"FAILED {f['name']}: {f['error']}")
