"""The tidy results table every experiment writes (one row per model × revision × layer ×
metric × setting) and the helpers that read and write it.

Columns
-------
::

    model        str    model spec as the user gave it (e.g. ``smollm2-135m``)
    revision     str    checkpoint / revision label, ``""`` when none
    layer        str    layer label: ``"0"`` (embeddings), ``"1"``..``"L"``, ``"final"``; or a
                        measurement point such as ``"30.attn_out"``; ``""`` for model-level rows
    layer_index  int    position on the layer axis (0..L, ``final`` = L+1); -1 for model-level rows
    depth        float  layer_index / (L+1), comparable across models of different depth
    metric       str    e.g. ``pga_z``, ``rho_readout``, ``null_mean``, ``null_std``, ``p_value``,
                        ``pc1_share``, ``pc1_baseline``, ``pc1_evr``, ``rankme``, ``alpha_req``,
                        ``isoscore``, ``mean_cosine``, ``condition_number``, ``logit_lens_top1``,
                        ``logit_lens_kl``, ``dispersion``, ``perplexity``, ...
    setting      str    the setting that distinguishes rows of one metric, e.g. ``ccr=1``; ``""``
    value        float  the number
    ci_low       float  lower end of the 95 % interval (NaN when none)
    ci_high      float  upper end of the 95 % interval (NaN when none)
    seed         float  seed of the sampling the value depends on (NaN when deterministic)
    n            float  number of samples (texts, chunks, pairs, ...) the value rests on
    flag         str    ``""`` for an ordinary value; else why it rests on too little data, as
                        ``";"``-joined codes (``low_n``, ``few_distinct``, ``low_null``,
                        ``low_pairs``, ``k_rank``: :mod:`lmgeom.metrics.sample_size`)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .._io import atomic_path

COLUMNS: tuple[str, ...] = (
    "model",
    "revision",
    "layer",
    "layer_index",
    "depth",
    "metric",
    "setting",
    "value",
    "ci_low",
    "ci_high",
    "seed",
    "n",
    "flag",
)

#: columns of text (the others are numbers)
_STR_COLUMNS = ("model", "revision", "layer", "metric", "setting", "flag")

_DEFAULTS: dict[str, Any] = {
    "revision": "",
    "layer": "",
    "layer_index": -1,
    "depth": math.nan,
    "setting": "",
    "ci_low": math.nan,
    "ci_high": math.nan,
    "seed": math.nan,
    "n": math.nan,
    "flag": "",
}


def row(**fields: Any) -> dict[str, Any]:
    """One table row with defaults filled in; unknown keys are an error (typos)."""
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise KeyError(f"unknown result columns: {sorted(unknown)}")
    out = {**_DEFAULTS, **fields}
    missing = [c for c in COLUMNS if c not in out]
    if missing:
        raise KeyError(f"result row is missing {missing}")
    return {c: out[c] for c in COLUMNS}


def frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Build a tidy table with the canonical column order and dtypes."""
    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    df["flag"] = df["flag"].where(df["flag"].notna(), "")  # rows from before the column
    for c in _STR_COLUMNS:
        df[c] = df[c].astype(str)
    df["layer_index"] = df["layer_index"].astype("int64")
    for c in ("depth", "value", "ci_low", "ci_high", "seed", "n"):
        df[c] = df[c].astype("float64")
    return df


def write_table(df: pd.DataFrame, out_dir: str | os.PathLike[str], stem: str) -> list[Path]:
    """Atomically write ``stem.parquet`` and ``stem.csv`` into ``out_dir``."""
    out = Path(out_dir)
    paths = [out / f"{stem}.parquet", out / f"{stem}.csv"]
    with atomic_path(paths[0]) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(paths[1]) as tmp:
        df.to_csv(tmp, index=False)
    return paths


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a table written by :func:`write_table` (parquet or csv)."""
    path = Path(path)
    if path.suffix == ".csv":
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
        for c in _STR_COLUMNS:
            if c in df.columns:
                df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
        return frame(df.to_dict("records"))
    return normalise(pd.read_parquet(path))


def normalise(df: pd.DataFrame) -> pd.DataFrame:
    """A table written before a column existed (``flag``) with that column added (``""``)."""
    if "flag" not in df.columns:
        df = df.copy()
        df["flag"] = ""
    return df


_STEP = re.compile(r"step[_-]?(\d+)$")


def flag_summary(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The flagged rows of a table, for a run's manifest (``{}`` when none): per flag code the
    number of rows, and the metrics, models and layers they cover, so a reader of the JSON
    alone sees which numbers rest on too little data (the codes are ``;``-joined in ``flag``)."""
    if "flag" not in df.columns or df.empty:
        return {}
    flagged = df[df["flag"].fillna("").astype(str) != ""]
    out: dict[str, dict[str, Any]] = {}
    for r in flagged.itertuples(index=False):
        for code in str(r.flag).split(";"):
            if not code:
                continue
            e = out.setdefault(code, {"rows": 0, "metrics": {}, "models": {}, "layers": {}})
            e["rows"] += 1
            e["metrics"][str(r.metric)] = None
            e["models"][str(r.model)] = None
            if str(r.layer) != "":
                e["layers"][str(r.layer)] = None
    return {c: {"rows": e["rows"], **{k: list(e[k]) for k in ("metrics", "models", "layers")}}
            for c, e in out.items()}


def step_of(revision: str) -> int | None:
    """``step512`` → 512 (also ``step_512``); ``None`` for other revision names."""
    m = _STEP.search(str(revision))
    return int(m.group(1)) if m else None
