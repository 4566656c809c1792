"""``lmgeom clusters``: within-cluster dispersion of contexts that share their next 10 tokens."""

from __future__ import annotations

import argparse
import time

from ._common import (
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    load_model_from_args,
    load_texts_from_args,
    print_table,
    progress_from_args,
)

NAME = "clusters"
HELP = "cluster dispersion: contexts followed by the same next N tokens, per layer and model"
DESCRIPTION = (
    "Scans the corpus (tokenized by the first model's tokenizer) for repeated --ngram-token "
    "continuations; the different contexts before one continuation form a cluster (rule: at "
    "least --min-context tokens before it, non-overlapping occurrences, distinct context windows "
    "of --window tokens, left-maximal repeats only, >= 2 contexts; see "
    "lmgeom.experiments.clusters). Each context string is fed to every model; the state of its "
    "last token at each layer is its representation. Per layer: the dispersion within each "
    "cluster, averaged weighted by cluster size, with a bootstrap 95 % CI over clusters, and the "
    "dispersion of all contexts pooled; with several models, the paired difference to the first "
    "at 'final'. Boilerplate-rich text such as builtin:code has many clusters. Writes "
    "clusters.parquet/.csv, manifest.json, plots and report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p, default="builtin:code", n=None)
    g = p.add_argument_group("clusters")
    g.add_argument("--ngram", type=int, default=10, help="length of the shared continuation")
    g.add_argument("--window", type=int, default=64, help="context tokens kept before it")
    g.add_argument("--min-context", type=int, default=8, help="context tokens needed before it")
    g.add_argument("--max-clusters", type=int, default=500, help="seeded sample of clusters")
    g.add_argument("--max-members", type=int, default=16, help="seeded sample of contexts per cluster")
    g.add_argument("--layers", default="all", help="all | blocks | final | 0,5,10 | 3-7")
    g.add_argument("--batch-size", type=int, default=16, help="contexts per forward pass")
    g.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    add_run_args(p, out=None)


def run(args) -> int:
    import numpy as np

    from .._io import write_json
    from ..experiments.clusters import (
        ClusterConfig,
        cluster_rows,
        cluster_states,
        config_dict,
        find_clusters,
    )
    from ..models.bundled import DEFAULT_MODEL
    from ..report.html import write_report
    from ..report.plots import plot_metric_by_layer
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now

    t0 = time.perf_counter()
    progress = progress_from_args(args)
    models = args.model or [DEFAULT_MODEL]
    config = ClusterConfig(ngram=args.ngram, window=args.window, min_context=args.min_context,
                           max_clusters=args.max_clusters, max_members=args.max_members,
                           layers=args.layers, batch_size=args.batch_size, n_boot=args.n_boot,
                           seed=args.seed)
    out = args.out or default_out("clusters", models)
    settings = {"models": models, "texts": args.texts, "n": args.n, "dtype": args.dtype,
                "revision": args.revision, "clusters": config_dict(config),
                "text_column": args.text_column, "label_column": args.label_column,
                "split": args.split}
    signature = run_signature(settings)
    out_dir = prepare_out_dir(out, signature, overwrite=args.overwrite)
    manifest = base_manifest("clusters", settings, signature)
    timings: dict[str, float] = {}
    texts = load_texts_from_args(args)
    states, info, cset = [], [], None
    for spec in models:
        t = time.perf_counter()
        model = load_model_from_args(args, spec)
        timings[f"load_s[{spec}]"] = time.perf_counter() - t
        if cset is None:
            t = time.perf_counter()
            cset = find_clusters(model.tokenizer, texts, config, reference=spec)
            timings["find_clusters_s"] = time.perf_counter() - t
        st = cluster_states(model, cset, layers=config.layers, batch_size=config.batch_size,
                            progress=progress, cache=not args.no_cache)
        st.model = spec
        timings[f"forward_s[{spec}]"] = st.timings["forward_s"]
        states.append(st)
        info.append(model.describe())
        del model
    df = table.frame(cluster_rows(states, cset, texts_label=args.texts,
                                  revision=args.revision or ""))
    table.write_table(df, out_dir, "clusters")
    extra = plot_metric_by_layer(df, [("cluster_dispersion", "cluster_dispersion_all")],
                                 out_dir / "plots", "clusters",
                                 title="Within-cluster dispersion per layer",
                                 dashed={"cluster_dispersion_all"})
    sizes = cset.sizes
    manifest.update({
        "models": models, "texts": texts.source, "n_texts": len(texts), "texts_hash": texts.hash,
        "reference_tokenizer": cset.reference, "n_candidates": cset.n_candidates,
        "n_clusters_found": cset.n_found, "n_clusters_used": len(cset),
        "n_contexts": int(sizes.sum()), "cluster_size_mean": float(sizes.mean()),
        "examples": [{"continuation": c.continuation, "contexts": [x[-120:] for x in c.contexts[:3]]}
                     for c in cset.clusters[:5]],
        "model_info": info, "extra_plots": [str(p.relative_to(out_dir)) for p in extra],
        "seeds": {"texts": args.seed, "sampling_and_bootstrap": config.seed},
        "timings": {**timings, "total_s": time.perf_counter() - t0}, "finished": now(),
    })
    report = write_report(out_dir, df, manifest, title=f"lmgeom clusters — {', '.join(models)}")
    write_json(out_dir / "manifest.json", manifest)

    print(f"{texts.source}: {cset.n_found} clusters found (reference tokenizer {cset.reference}), "
          f"{len(cset)} used, {int(sizes.sum())} contexts (mean size {sizes.mean():.2f})")
    rows = []
    by = {}
    for r in df[df.metric == "cluster_dispersion"].itertuples():
        by.setdefault(r.layer, {})[r.model] = (r.value, r.ci_low, r.ci_high)
    labels = list(dict.fromkeys(df[df.metric == "cluster_dispersion"].layer))
    for lab in labels:
        row = {"layer": lab}
        for m in models:
            v = by[lab].get(m)
            row[m] = f"{v[0]:.3f} [{v[1]:.3f},{v[2]:.3f}]" if v and np.isfinite(v[1]) else (
                f"{v[0]:.3f}" if v else "")
        rows.append(row)
    print("\nwithin-cluster dispersion (size-weighted mean over clusters, 95 % CI):")
    print_table(rows)
    for r in df[df.metric == "cluster_dispersion_diff"].itertuples():
        print(f"\n{r.model} - {models[0]} at final: {r.value:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
    print(f"\nwrote {out_dir}/clusters.parquet, clusters.csv, manifest.json and {report.name}")
    return 0
