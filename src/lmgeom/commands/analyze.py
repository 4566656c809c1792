"""``lmgeom analyze``: the main job — one layer sweep of a model with an HTML report."""

from __future__ import annotations

import argparse
import time

from ._common import (
    add_engine_args,
    add_extract_args,
    add_model_args,
    add_run_args,
    add_texts_args,
    default_out,
    load_kwargs_from_args,
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
    add_engine_args(p)


def analyze_one(spec: str, texts, config, *, load_kwargs: dict, cache: bool = True,
                probes: bool = True, folds: int = 5, revision: str = "",
                work_dir: str | None = None, progress: bool | None = None):
    """One model of ``lmgeom analyze``: load, extract (through the cache), layer sweep, probes.

    Plain, picklable arguments and results, so the ``ray`` engine runs it as one task per
    model. Returns ``(frame, model_info, timings)``.
    """
    import pandas as pd

    from ..activations import extract
    from ..experiments.layer_sweep import run_layer_sweep
    from ..models import load_model
    from ..results import table

    timings: dict[str, float] = {}
    t = time.perf_counter()
    model = load_model(spec, **load_kwargs)
    timings["load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    acts = extract(model, texts, layers=config.layers, pooling=config.pooling,
                   max_length=config.max_length, batch_size=config.batch_size,
                   cache=cache, seed=config.seed, progress=progress)
    timings["extract_s"] = time.perf_counter() - t
    df, tm = run_layer_sweep(model, acts, config, work_dir=work_dir, revision=revision,
                             progress=progress)
    timings["metrics_s"] = tm["metrics_s"]
    timings["logit_lens_s"] = tm["logit_lens_s"]
    frames = [df]
    if probes:
        from ..experiments.probes import probe_rows

        t = time.perf_counter()
        frames.append(table.frame(probe_rows(model, acts, folds=folds, seed=config.seed,
                                             revision=revision, progress=progress)))
        timings["probes_s"] = time.perf_counter() - t
    info = {**model.describe(), "activations_key": acts.key, "n_truncated": acts.n_truncated,
            "batches_cached": acts.timings["batches_cached"]}
    return pd.concat(frames, ignore_index=True), info, timings


def run(args) -> int:
    from .._io import write_json
    from ..engines import map_calls
    from ..errors import LmgeomError
    from ..experiments.layer_sweep import config_dict
    from ..models.bundled import DEFAULT_MODEL
    from ..results import table
    from ..results.folder import prepare_out_dir, run_signature
    from ..results.manifest import base_manifest, now
    from ._common import engine_from_args

    t_start = time.perf_counter()
    progress = progress_from_args(args)
    models = args.model or [DEFAULT_MODEL]
    config = sweep_config_from_args(args, logit_lens=not args.no_logit_lens)
    engine = engine_from_args(args)
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
    manifest["engine"] = engine.describe()
    probes = texts.labels is not None and not args.no_probes
    calls = [((spec, texts, config),
              dict(load_kwargs=load_kwargs_from_args(args), cache=not args.no_cache,
                   probes=probes, folds=args.folds, revision=args.revision or "",
                   work_dir=str(out_dir / ".work"),
                   progress=progress if engine.engine == "local" else False))
             for spec in models]
    frames, model_info = [], []
    if engine.engine == "local":  # in this process: errors surface as they are
        results = [(analyze_one(*a, **k), 1) for a, k in calls]
    else:
        results = []
        for spec, oc in zip(models, map_calls(analyze_one, calls, engine, names=list(models))):
            if not oc.ok:
                if isinstance(oc.exception, LmgeomError):
                    raise oc.exception
                raise RuntimeError(f"{spec} failed after {oc.attempts} attempts on Ray: "
                                   f"{oc.error}\n{oc.traceback or ''}")
            results.append((oc.value, oc.attempts))
    for spec, ((df_m, info, tm), attempts) in zip(models, results):
        frames.append(df_m)
        model_info.append({**info, "attempts": attempts})
        timings.update({f"{k}[{spec}]": v for k, v in tm.items()})
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
