"""``lmgeom analyze``: the main job — one layer sweep of a model with an HTML report."""

from __future__ import annotations

import argparse
import time

from ._common import (
    add_extract_args,
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    load_model_from_args,
    load_texts_from_args,
    print_table,
    progress_from_args,
)

NAME = "analyze"
HELP = "layer sweep (PGA z for several CCR levels, PC1 share, spectra, logit lens) + HTML report"
DESCRIPTION = (
    "The main job. Extracts pooled states of every layer, then per layer computes the Subspace "
    "PGA z (readout subspace vs random subspaces, for each CCR level) with its null and p-value, "
    "the PC1 readout share, spectral metrics and the logit lens. Writes layers.parquet/.csv "
    "(tidy: one row per layer x metric x setting), manifest.json, PNG+SVG plots and a "
    "self-contained report.html into --out. Every option has a default: `lmgeom analyze` alone "
    "runs offline on smollm2-135m and builtin:domains."
)


def add_pga_args(p: argparse.ArgumentParser, *, ccr: str = "0,1,5,10") -> None:
    g = p.add_argument_group("PGA")
    g.add_argument("--k", type=int, default=100, help="readout subspace dimension")
    g.add_argument("--n-null", type=int, default=100, help="random subspaces in the null")
    g.add_argument("--ccr", default=ccr, help="CCR levels: principal components removed (comma list)")
    g.add_argument("--pairs", default="auto",
                   help="'exact' (all pairs), an integer (one seeded sample of that many pairs), or "
                        "'auto' (exact up to 1000 texts, else 250000 sampled pairs)")
    g.add_argument("--readout", default="raw", choices=["raw", "effective"],
                   help="readout basis from W_U (raw) or W_U·diag(final-norm gain) (effective)")
    g.add_argument("--metrics-device", default=None, help="device for the PGA computation (e.g. cuda)")


def sweep_config_from_args(args, *, logit_lens: bool = True):
    from ..errors import ConfigError
    from ..experiments.layer_sweep import SweepConfig

    try:
        ccr = tuple(int(x) for x in str(args.ccr).split(",") if x.strip())
    except ValueError as exc:
        raise ConfigError(f"--ccr must be a comma-separated list of integers, got {args.ccr!r}") from exc
    pairs = args.pairs
    if pairs not in ("auto", "exact"):
        try:
            pairs = int(pairs)
        except ValueError as exc:
            raise ConfigError(f"--pairs must be 'auto', 'exact' or an integer, got {args.pairs!r}") from exc
    return SweepConfig(k=args.k, n_null=args.n_null, ccr=ccr, pairs=pairs, readout=args.readout,
                       pooling=args.pooling, layers=args.layers, max_length=args.max_length,
                       batch_size=args.batch_size, seed=args.seed, logit_lens=logit_lens,
                       device=args.metrics_device)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p)
    add_extract_args(p)
    add_pga_args(p)
    p.add_argument("--no-logit-lens", action="store_true", help="skip the logit lens")
    p.add_argument("--no-probes", action="store_true",
                   help="skip the per-layer linear probes (run by default when the texts have labels)")
    p.add_argument("--folds", type=int, default=5, help="CV folds of the linear probes")
    add_run_args(p, out=None)


def run(args) -> int:
    from .._io import write_json
    from ..activations import extract
    from ..experiments import table
    from ..experiments.layer_sweep import config_dict, run_layer_sweep
    from ..experiments.manifest import base_manifest, now
    from ..models.bundled import DEFAULT_MODEL
    from ..runs import prepare_out_dir, run_signature

    t_start = time.perf_counter()
    progress = progress_from_args(args)
    models = args.model or [DEFAULT_MODEL]
    config = sweep_config_from_args(args, logit_lens=not args.no_logit_lens)
    out = args.out or default_out("analyze", models)
    settings = {"probes": not args.no_probes, "folds": args.folds, "models": models, "revision": args.revision, "texts": args.texts, "n": args.n,
                "dtype": args.dtype, "sweep": config_dict(config), "text_column": args.text_column,
                "label_column": args.label_column, "split": args.split}
    signature = run_signature(settings)
    out_dir = prepare_out_dir(out, signature, overwrite=args.overwrite)
    manifest = base_manifest("analyze", settings, signature)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    texts = load_texts_from_args(args)
    timings["texts_s"] = time.perf_counter() - t
    frames, model_info = [], []
    for spec in models:
        t = time.perf_counter()
        model = load_model_from_args(args, spec)
        timings[f"load_s[{spec}]"] = time.perf_counter() - t
        t = time.perf_counter()
        acts = extract(model, texts, layers=config.layers, pooling=config.pooling,
                       max_length=config.max_length, batch_size=config.batch_size,
                       cache=not args.no_cache, seed=config.seed, progress=progress)
        timings[f"extract_s[{spec}]"] = time.perf_counter() - t
        df, tm = run_layer_sweep(model, acts, config, work_dir=out_dir / ".work",
                                 revision=args.revision or "", progress=progress)
        timings[f"metrics_s[{spec}]"] = tm["metrics_s"]
        timings[f"logit_lens_s[{spec}]"] = tm["logit_lens_s"]
        frames.append(df)
        if texts.labels is not None and not args.no_probes:
            from ..experiments.probes import probe_rows

            t = time.perf_counter()
            frames.append(table.frame(probe_rows(model, acts, folds=args.folds, seed=config.seed,
                                                 revision=args.revision or "", progress=progress)))
            timings[f"probes_s[{spec}]"] = time.perf_counter() - t
        model_info.append({**model.describe(), "activations_key": acts.key,
                           "n_truncated": acts.n_truncated,
                           "batches_cached": acts.timings["batches_cached"]})
        del model
    import pandas as pd

    df = pd.concat(frames, ignore_index=True)
    table.write_table(df, out_dir, "layers")
    t = time.perf_counter()
    manifest.update({
        "models": model_info, "texts": texts.source, "n_texts": len(texts),
        "texts_hash": texts.hash, "n_dropped_texts": texts.n_dropped,
        "seeds": {"texts": args.seed, "pga_null_and_pairs": config.seed},
        "timings": timings, "finished": now(),
    })
    from ..report.html import write_report

    report = write_report(out_dir, df, manifest, title=f"lmgeom analyze — {', '.join(models)}")
    timings["report_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_start
    write_json(out_dir / "manifest.json", manifest)

    _print_summary(df, config)
    print(f"\nwrote {out_dir}/layers.parquet, layers.csv, manifest.json, plots and the report:")
    print(f"  {report.resolve()}")
    print(f"total {timings['total_s']:.1f} s")
    return 0


def _print_summary(df, config) -> None:
    for model, g in df.groupby("model", sort=False):
        z = g[g.metric == "pga_z"].pivot_table(index=["layer_index", "layer"], columns="setting",
                                               values="value", sort=True)
        cols = [f"ccr={m}" for m in config.ccr if f"ccr={m}" in z.columns]
        rows = []
        for (idx, layer), r in z.iterrows():
            rows.append({"layer": layer, **{f"z {c}": float(r[c]) for c in cols}})
        print(f"\nSubspace PGA z per layer — {model} (k={config.k}, n_null={config.n_null})")
        print_table(rows, floatfmt="{:.2f}")
