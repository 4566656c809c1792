"""``lmgeom probe``: per-layer linear-probe accuracy beside the PGA z, one picture."""

from __future__ import annotations

import argparse
import time

from .options import (
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
from .analyze import add_pga_args, sweep_config_from_args

NAME = "probe"
HELP = "per-layer linear probes (logistic regression, stratified CV) with the PGA z beside them"
DESCRIPTION = (
    "For a labeled text set (builtin:domains, a file with a label column, or an hf: dataset): per "
    "layer, standardised features, multinomial logistic regression, stratified k-fold CV with a "
    "fixed seed; accuracy mean ± std and the majority baseline, plotted on the same layer axis as "
    "the Subspace PGA z (CCR-1 by default), so probe accuracy vs z is one picture."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p)
    add_extract_args(p)
    add_pga_args(p, ccr="1")
    g = p.add_argument_group("probe")
    g.add_argument("--folds", type=int, default=5, help="stratified CV folds")
    g.add_argument("--C", type=float, default=1.0, help="inverse L2 regularisation strength")
    add_run_args(p, out=None)


def run(args) -> int:
    from dataclasses import replace

    import pandas as pd

    from .._io import write_json
    from ..activations import extract
    from ..experiments.layer_sweep import config_dict, run_layer_sweep
    from ..experiments.probes import probe_rows
    from ..report.html import write_report
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now

    t0 = time.perf_counter()
    progress = progress_from_args(args)
    config = replace(sweep_config_from_args(args, logit_lens=False), spectral=False)
    settings = {"model": args.model, "revision": args.revision, "texts": args.texts, "n": args.n,
                "dtype": args.dtype, "folds": args.folds, "C": args.C, "sweep": config_dict(config),
                "label_column": args.label_column}
    out = prepare_out_dir(args.out or default_out("probe", args.model),
                          run_signature(settings), overwrite=args.overwrite)
    manifest = base_manifest("probe", settings, run_signature(settings))
    texts = load_texts_from_args(args)
    model = load_model_from_args(args)
    acts = extract(model, texts, layers=config.layers, pooling=config.pooling,
                   max_length=config.max_length, batch_size=config.batch_size,
                   cache=not args.no_cache, seed=config.seed, progress=progress)
    t = time.perf_counter()
    prows = probe_rows(model, acts, folds=args.folds, seed=args.seed, C=args.C,
                       revision=args.revision or "", progress=progress)
    t_probe = time.perf_counter() - t
    pga, tm = run_layer_sweep(model, acts, config, work_dir=out / ".work", revision=args.revision or "",
                              progress=progress)
    pga = pga[pga.metric.isin(["pga_z", "null_z_low", "null_z_high", "p_value", "pc1_share", "pc1_baseline"])]
    df = pd.concat([table.frame(prows), pga], ignore_index=True)
    table.write_table(df, out, "probes")
    manifest.update({"models": [{**model.describe(), "activations_key": acts.key}],
                     "texts": texts.source, "n_texts": len(texts), "texts_hash": texts.hash,
                     "labels": texts.label_counts(), "seeds": {"cv_folds": args.seed, "pga": config.seed},
                     "timings": {"probe_s": t_probe, "pga_s": tm["metrics_s"],
                                 "total_s": time.perf_counter() - t0},
                     "finished": now()})
    report = write_report(out, df, manifest, title=f"lmgeom probe — {args.model}")
    write_json(out / "manifest.json", manifest)
    wide = df.pivot_table(index=["layer_index", "layer"], columns="metric", values="value", sort=True,
                          aggfunc="first")
    zcol = "pga_z"
    rows = [{"layer": layer, "accuracy": r["probe_acc"], "± std": r["probe_acc_std"],
             "baseline": r["probe_baseline"], f"PGA z (ccr={config.ccr[0]})": r.get(zcol, float("nan"))}
            for (idx, layer), r in wide.iterrows()]
    print(f"Linear probes — {model.name} on {texts.source} ({len(texts)} texts, {args.folds}-fold, seed {args.seed})")
    print_table(rows, floatfmt="{:.3f}")
    print(f"\nwrote {out}/probes.parquet, probes.csv, manifest.json and {report}")
    return 0
