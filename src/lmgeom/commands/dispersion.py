"""``lmgeom dispersion``: token-level dispersion vs perplexity per layer, for every model × corpus."""

from __future__ import annotations

import argparse
import time

from ..experiments.dispersion import (
    DEFAULT_CHUNK_LEN,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_GROUPS,
)
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

NAME = "dispersion"
HELP = "dispersion vs perplexity per layer on fixed-length chunks (chunk and group level, CIs)"
DESCRIPTION = (
    "Joins each corpus into one token stream (texts separated by the tokenizer's EOS), cuts it "
    "into chunks of exactly --chunk-len tokens (tail dropped; --max-chunks keeps a seeded "
    "sample) and runs each model once per batch of chunks: per chunk its perplexity and, at "
    "every requested layer, the token-level dispersion 1 - mean pairwise cosine of its token "
    "states. Then per layer the Spearman and Pearson correlations of dispersion with perplexity, "
    "over chunks (level=chunk) and over perplexity-sorted groups of --group-size chunks "
    "(level=group; the released code uses 100 on thousands of chunks; default "
    f"{DEFAULT_GROUP_SIZE} suits a few hundred), with seeded bootstrap 95 % intervals. Writes "
    "dispersion.parquet/.csv (tidy; setting = 'texts=SPEC;level=chunk' or "
    "'texts=SPEC;level=group;g=G'), chunks.parquet (per-chunk values), manifest.json, plots and "
    "report.html. --model and --texts repeat: every model x corpus in one call. Per-batch results "
    "are cached, so a killed run resumes and reruns are cheap."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p, multiple=True)
    add_texts_args(p, default="builtin:wiki", n=None, multiple=True)
    g = p.add_argument_group("dispersion")
    g.add_argument("--chunk-len", type=int, default=DEFAULT_CHUNK_LEN, help="tokens per chunk")
    g.add_argument("--layers", default="all",
                   help="all | blocks | final | 0,5,10 | 3-7 | 12.attn_out (comma-separated)")
    g.add_argument("--max-chunks", type=int, default=256,
                   help="keep a seeded sample of at most this many chunks per corpus (0: all)")
    g.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                   help="chunks per perplexity-sorted group for level=group")
    g.add_argument("--max-groups", type=int, default=DEFAULT_MAX_GROUPS,
                   help="at most this many groups, spread evenly in perplexity")
    g.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates per interval")
    g.add_argument("--bos", default="auto", choices=["auto", "on", "off"],
                   help="BOS before each chunk: auto = when the tokenizer prepends one")
    g.add_argument("--batch-size", type=int, default=4, help="chunks per forward pass")
    g.add_argument("--position-chunk", type=int, default=None,
                   help="positions per readout matmul (default: 64 MiB of float32 logits)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the chunk cache")
    g.add_argument("--attach", default=None, metavar="RUN_DIR",
                   help="also add the results to an `lmgeom analyze` run folder and regenerate "
                        "its report.html with a dispersion section")
    add_run_args(p, out=None)


def config_from_args(args):
    from ..experiments.dispersion import DispersionConfig

    return DispersionConfig(chunk_len=args.chunk_len, layers=args.layers,
                            max_chunks=args.max_chunks or None, group_size=args.group_size,
                            max_groups=args.max_groups, n_boot=args.n_boot, seed=args.seed,
                            bos=args.bos, batch_size=args.batch_size,
                            position_chunk=args.position_chunk)


def run(args) -> int:
    import pandas as pd

    from .._io import write_json
    from ..experiments.dispersion import (
        attach_to_run,
        config_dict,
        correlation_rows,
        measure_chunks,
        plot_scatter,
    )
    from ..models.bundled import DEFAULT_MODEL
    from ..report.html import write_report
    from ..report.plots import plot_metric_by_layer
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now

    t_start = time.perf_counter()
    progress = progress_from_args(args)
    models = args.model or [DEFAULT_MODEL]
    corpora = args.texts or ["builtin:wiki"]
    config = config_from_args(args)
    out = args.out or default_out("dispersion", models)
    settings = {"models": models, "texts": corpora, "n": args.n, "revision": args.revision,
                "dtype": args.dtype, "dispersion": config_dict(config),
                "text_column": args.text_column, "label_column": args.label_column,
                "split": args.split}
    signature = run_signature(settings)
    out_dir = prepare_out_dir(out, signature, overwrite=args.overwrite)
    manifest = base_manifest("dispersion", settings, signature)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    textsets = {spec: load_texts_from_args(args, spec) for spec in corpora}
    timings["texts_s"] = time.perf_counter() - t
    rows, chunk_frames, measured, info = [], [], [], []
    for spec in models:
        t = time.perf_counter()
        model = load_model_from_args(args, spec)
        timings[f"load_s[{spec}]"] = time.perf_counter() - t
        for cspec, ts in textsets.items():
            m = measure_chunks(model, ts, texts_label=cspec, chunk_len=config.chunk_len,
                               layers=config.layers, max_chunks=config.max_chunks,
                               seed=config.seed, bos=config.bos, batch_size=config.batch_size,
                               position_chunk=config.position_chunk, cache=not args.no_cache,
                               progress=progress)
            m.model = spec
            timings[f"forward_s[{spec}|{cspec}]"] = m.timings["forward_s"]
            rows.extend(correlation_rows(m, config, revision=args.revision or ""))
            chunk_frames.append(m.to_frame(revision=args.revision or ""))
            measured.append(m)
            info.append({"model": spec, "texts": cspec, "n_texts": len(ts),
                         "texts_hash": ts.hash, "n_document_tokens": m.chunks.n_document_tokens,
                         "n_chunks_available": m.chunks.n_available, "n_chunks": len(m.chunks),
                         "bos": m.chunks.bos, "separator_id": m.chunks.separator,
                         "forward_key": m.key, "batches_cached": m.batches_cached})
        manifest.setdefault("model_info", []).append(model.describe())
        del model
    df = table.frame(rows)
    table.write_table(df, out_dir, "dispersion")
    chunks = pd.concat(chunk_frames, ignore_index=True)
    from .._io import atomic_path

    with atomic_path(out_dir / "chunks.parquet") as tmp:
        chunks.to_parquet(tmp, index=False)
    plots = out_dir / "plots"
    extra = plot_scatter(measured, config, plots)
    extra += plot_metric_by_layer(df, ["corr_spearman", "corr_pearson"], plots,
                                  "dispersion_correlation",
                                  title="Correlation of dispersion with perplexity per layer",
                                  zero_line=True)
    manifest.update({
        "models": models, "texts": corpora, "runs": info,
        "group_size_used": config.group_size,
        "seeds": {"chunk_sample": config.seed, "bootstrap": config.seed, "texts": args.seed},
        "extra_plots": [str(p.relative_to(out_dir)) for p in extra],
        "timings": timings, "finished": now(),
    })
    report = write_report(out_dir, df, manifest,
                          title=f"lmgeom dispersion — {', '.join(models)} on {', '.join(corpora)}")
    timings["total_s"] = time.perf_counter() - t_start
    write_json(out_dir / "manifest.json", manifest)
    attached = attach_to_run(args.attach, df) if args.attach else None

    _print_summary(df, measured, config)
    print(f"\nwrote {out_dir}/dispersion.parquet, dispersion.csv, chunks.parquet, manifest.json, "
          "plots and the report:")
    print(f"  {report.resolve()}")
    if attached is not None:
        print(f"attached to {args.attach}: {attached.resolve()}")
    print(f"total {timings['total_s']:.1f} s")
    return 0


def _fmt(v, lo, hi) -> str:
    import math

    if not math.isfinite(v):
        return "n/a"
    if math.isfinite(lo) and math.isfinite(hi):
        return f"{v:+.2f} [{lo:+.2f},{hi:+.2f}]"
    return f"{v:+.2f}"


def _print_summary(df, measured, config) -> None:
    for m in measured:
        s_chunk = f"texts={m.texts};level=chunk"
        s_group = f"texts={m.texts};level=group;g={config.group_size}"
        sub = df[(df.model == m.model)]
        ppl = sub[(sub.metric == "perplexity") & (sub.setting == s_chunk)].iloc[0]
        ng = int(sub[(sub.metric == "n_groups")].iloc[0].value) if (sub.metric == "n_groups").any() else 0
        sub = sub[sub.setting.isin([s_chunk, s_group])]
        print(f"\n{m.model} on {m.texts}: {len(m.perplexity)} chunks of {config.chunk_len} tokens "
              f"(of {m.chunks.n_available}), perplexity {ppl.value:.4g}; groups: {ng} of "
              f"g={config.group_size}")
        out = []
        for layer in m.layers:
            r = sub[sub.layer == layer]

            def get(metric, setting, r=r):
                x = r[(r.metric == metric) & (r.setting == setting)]
                return _fmt(*x[["value", "ci_low", "ci_high"]].iloc[0]) if len(x) else ""

            d = r[(r.metric == "dispersion")]
            out.append({"layer": layer, "dispersion": float(d.value.iloc[0]) if len(d) else float("nan"),
                        "spearman chunk": get("corr_spearman", s_chunk),
                        "pearson chunk": get("corr_pearson", s_chunk),
                        "spearman group": get("corr_spearman", s_group),
                        "pearson group": get("corr_pearson", s_group)})
        print_table(out, floatfmt="{:.3f}")
