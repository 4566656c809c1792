"""``lmgeom hardness``: rank texts by dispersion (low first = likely hard), checked against
perplexity."""

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

NAME = "hardness"
HELP = "label-free hardness ranking: texts ranked by token-level dispersion, checked vs perplexity"
DESCRIPTION = (
    "Per text, one forward pass gives the dispersion of its token states at --layer (default "
    "'final', the post-norm states the readout reads; a prepended BOS is left out) and its "
    "perplexity. Texts are ranked by dispersion, lowest first (rank 1 = predicted hardest). "
    "Evaluation: Spearman of dispersion with perplexity (bootstrap 95 % CI; the papers expect it "
    "negative) and the share of the top-perplexity decile found in the lowest-dispersion decile, "
    "against random rankings (expected 10 %; seeded permutation interval and p-value). Writes "
    "hardness.csv (id, label, rank, dispersion, perplexity, n_tokens, snippet), "
    "hardness.parquet (tidy, model-level rows), manifest.json and report.html."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_texts_args(p, default="builtin:domains", n=500)
    g = p.add_argument_group("hardness")
    g.add_argument("--layer", default="final", help="the point whose token states are used")
    g.add_argument("--max-length", type=int, default=256, help="tokens kept per text")
    g.add_argument("--batch-size", type=int, default=8, help="texts per forward pass")
    g.add_argument("--quantile", type=float, default=0.1,
                   help="fraction of texts in the 'hardest' sets compared (0.1 = deciles)")
    g.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates")
    g.add_argument("--n-perm", type=int, default=1000, help="random rankings in the null")
    g.add_argument("--show", type=int, default=10, help="texts to print from each end")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    add_run_args(p, out=None)


def run(args) -> int:
    from dataclasses import asdict

    from .._io import atomic_path, write_json
    from ..experiments.hardness import HardnessConfig, hardness_rows, rank_hardness
    from ..report.html import write_report
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now

    t0 = time.perf_counter()
    progress = progress_from_args(args)
    config = HardnessConfig(layer=args.layer, max_length=args.max_length,
                            batch_size=args.batch_size, n_boot=args.n_boot, n_perm=args.n_perm,
                            quantile=args.quantile, seed=args.seed)
    out = args.out or default_out("hardness", args.model)
    settings = {"model": args.model, "texts": args.texts, "n": args.n, "dtype": args.dtype,
                "revision": args.revision, "hardness": asdict(config),
                "text_column": args.text_column, "label_column": args.label_column,
                "split": args.split}
    signature = run_signature(settings)
    out_dir = prepare_out_dir(out, signature, overwrite=args.overwrite)
    manifest = base_manifest("hardness", settings, signature)
    texts = load_texts_from_args(args)
    model = load_model_from_args(args)
    res = rank_hardness(model, texts, config, progress=progress, cache=not args.no_cache)
    rows = hardness_rows(res, model=args.model, texts_label=args.texts, config=config,
                         revision=args.revision or "")
    df = table.frame(rows)
    table.write_table(df, out_dir, "hardness")
    with atomic_path(out_dir / "hardness.csv") as tmp:
        res.ranking.to_csv(tmp, index=False)
    lo, hi = res.null_interval
    manifest.update({
        "models": [args.model], "texts": texts.source, "n_texts": len(texts),
        "texts_hash": texts.hash, "layer": res.layer, "n_ranked": res.n,
        "n_skipped": res.n_skipped, "k": res.k, "model_info": model.describe(),
        "seeds": {"texts": args.seed, "bootstrap": config.seed, "permutation": config.seed},
        "timings": {"forward_s": res.settings["forward_s"], "total_s": time.perf_counter() - t0},
        "finished": now(),
    })
    report = write_report(out_dir, df, manifest, title=f"lmgeom hardness — {args.model}")
    write_json(out_dir / "manifest.json", manifest)

    r = res.spearman
    print(f"{args.model} on {texts.source}: {res.n} texts ranked by dispersion at layer "
          f"{res.layer} (low first){f', {res.n_skipped} too short' if res.n_skipped else ''}; "
          f"corpus perplexity {res.corpus_perplexity:.4g}")
    print(f"Spearman(dispersion, perplexity) = {r[0]:+.3f}  95 % CI [{r[1]:+.3f}, {r[2]:+.3f}]")
    print(f"top-perplexity {config.quantile:.0%} (k={res.k}) found in the lowest-dispersion "
          f"{config.quantile:.0%}: {res.overlap:.1%}  (random ranking {res.null_mean:.1%}, "
          f"95 % [{lo:.1%}, {hi:.1%}], p = {res.p_value:.3g})")
    k = max(0, args.show)
    if k:
        rk = res.ranking
        cols = ["rank", "id", "dispersion", "perplexity", "snippet"]
        print(f"\nlowest dispersion (predicted hardest), {min(k, len(rk))}:")
        print_table(rk.head(k)[cols].to_dict("records"))
        print("\nhighest dispersion:")
        print_table(rk[rk["rank"].notna()].tail(k)[cols].iloc[::-1].to_dict("records"))
    print(f"\nwrote {out_dir}/hardness.csv, hardness.parquet, manifest.json and {report.name}")
    return 0
