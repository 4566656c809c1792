"""Activations as data: the writers for safetensors, parquet and a Hugging Face (Arrow) dataset.

The readers (:func:`~lmgeom.activations.from_disk`) live with the classes they rebuild, in
:mod:`lmgeom.activations.states`; this module imports no sibling.

Formats (:data:`FORMATS`):

* ``safetensors`` — ``OUT.safetensors`` + ``OUT.json``, exactly :meth:`Activations.save`
  (pooled :class:`Activations` only);
* ``parquet`` — one file ``OUT.parquet``; one row per text (``pooling`` ``last`` / ``mean``)
  with columns ``id``, ``label``, then one ``fixed_size_list<float32>[d]`` column per layer,
  named by the layer label (``"0"``, ``"12"``, ``"final"``, ``"3.attn_out"``);
* ``hf`` — a folder written by ``datasets.Dataset.save_to_disk`` with the same columns
  (``datasets.load_from_disk(OUT)["final"]``), ready for ``push_to_hub``.

Token-level activations (``pooling="tokens"`` :class:`Activations`, or a
:class:`TokenActivations` from ``extract_tokens``) are written one row per token with the
columns ``id`` (text id), ``label``, ``text_index``, ``position`` (0-based, in the model input
including special tokens), ``token_id`` (null where the source did not record it), then the
layer columns.

Both tabular writers stream: rows are cut into row groups (``rows_per_group``, default about
64 MiB of floats) and each group is built from slices of the source (a view of
``Activations.states`` or one shard read of a :class:`TokenActivations`), so no second copy of
all layers is ever held. The ``hf`` writer streams the groups into an Arrow file that
``datasets`` memory-maps, then ``save_to_disk`` copies it into place.

The manifest (model, identity, settings, ``n_tokens``, ...) travels with the data: in the
parquet schema metadata (key ``lmgeom.activations``) and in the ``hf`` dataset's
``info.description`` (JSON), so :func:`from_disk` rebuilds an equal :class:`Activations` from
any of the three formats. A token-level export reads back as an :class:`Activations` with one
row per token (``row_text``, ``row_pos``, ``row_token`` set).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_path, record_tree, remove_written
from .._paths import cache_dir
from ..errors import CacheError, ConfigError

FORMATS = ("safetensors", "parquet", "hf")
#: Schema-metadata key (parquet) / description prefix (hf) holding the manifest.
META_KEY = "lmgeom.activations"
#: Default size of one row group: this many bytes of float32 states.
GROUP_BYTES = 64 << 20
_TOKEN_COLUMNS = ("text_index", "position", "token_id")
_REPO_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")

#: What the writers take: pooled :class:`~lmgeom.activations.Activations` (it has ``states``)
#: or :class:`~lmgeom.activations.TokenActivations` (its states stay in shards on disk). The
#: writers read attributes only, so this module imports neither class: they sit above it.
AnyActivations = Any


def _pooled(acts: AnyActivations) -> bool:
    return hasattr(acts, "states")


def _token_shards(acts: AnyActivations) -> bool:
    return hasattr(acts, "iter_layer") and hasattr(acts, "folder")


# ---------------------------------------------------------------------- public API
def export_activations(
    acts: AnyActivations,
    out: str | os.PathLike[str],
    *,
    format: str = "safetensors",
    push_to_hub: str | None = None,
    rows_per_group: int | None = None,
) -> list[Path]:
    """Write ``acts`` to ``out`` in ``format``; return the paths written.

    Args:
        acts: pooled :class:`Activations` or a :class:`TokenActivations`.
        out: path stem (``safetensors``: ``OUT.safetensors`` + ``OUT.json``; ``parquet``:
            ``OUT.parquet``, a given ``.parquet`` suffix is kept) or, for ``hf``, a folder.
        format: one of :data:`FORMATS`.
        push_to_hub: a hub dataset repo (``user/name``) to upload the ``hf`` dataset to after
            writing it locally. Needs ``format="hf"`` and a reachable hub; checked before
            anything is written.
        rows_per_group: rows per parquet row group / Arrow record batch (default: about
            64 MiB of states).

    Raises:
        ConfigError: unknown format, a bad repo id, ``push_to_hub`` without ``hf`` or with
            ``HF_HUB_OFFLINE=1``, safetensors for token-level states.
        CacheError: the push failed (the local copy is complete; the message says how to
            upload it later).
    """
    check_export(acts, format=format, push_to_hub=push_to_hub)
    with claim_export(out, format):
        if format == "safetensors":
            return list(acts.save(out))  # type: ignore[union-attr]
        if format == "parquet":
            path = export_paths(out, format)[0]
            write_parquet(acts, path, rows_per_group=rows_per_group)
            return [path]
        path = Path(out)
        write_hf(acts, path, rows_per_group=rows_per_group)
    if push_to_hub:
        _push(path, push_to_hub)
    return [path]


def export_paths(out: str | os.PathLike[str], format: str) -> list[Path]:
    """The paths :func:`export_activations` writes for ``out`` in ``format``."""
    path = Path(out).expanduser()
    if format == "safetensors":
        base = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
        return [base.with_suffix(".safetensors"), base.with_suffix(".json")]  # as Activations.save
    if format == "parquet":
        return [path if path.suffix == ".parquet" else path.with_name(path.name + ".parquet")]
    return [path]


@contextlib.contextmanager
def claim_export(out: str | os.PathLike[str], format: str, *, option: str = "--out"):
    """Check the export's output paths (never a file or folder lmgeom did not write, never the
    cache / current folder / home) and lock them against a second run until the block ends."""
    from ..results.folder import acquire_output_lock, check_output_path, release_output_lock

    kind = "folder" if format == "hf" else "file"
    paths = [check_output_path(p, option=option, kind=kind)  # all checked before any is locked
             for p in export_paths(out, format)]
    with contextlib.ExitStack() as stack:
        for p in paths:
            stack.callback(release_output_lock, acquire_output_lock(p, option=option))
        yield


def check_export(acts: Any, *, format: str, push_to_hub: str | None = None) -> None:
    """Validate export options without writing anything (what the CLI calls before a run)."""
    if format not in FORMATS:
        raise ConfigError(f"unknown activations format {format!r} (use one of {', '.join(FORMATS)})")
    if acts is not None and not (_pooled(acts) or _token_shards(acts)):
        raise ConfigError(f"cannot export a {type(acts).__name__}: expected Activations or "
                          "TokenActivations (from lmgeom.extract / extract_tokens)")
    if format == "safetensors" and _token_shards(acts):
        raise ConfigError("token-level activations (extract_tokens) export as parquet or hf, "
                          "not safetensors: use format='parquet' or format='hf'")
    if push_to_hub is None:
        return
    if format != "hf":
        raise ConfigError(f"--push-to-hub uploads a Hugging Face dataset: use --format hf "
                          f"(got --format {format})")
    if not _REPO_RE.match(push_to_hub) or ".." in push_to_hub or push_to_hub.endswith(".git"):
        raise ConfigError(f"--push-to-hub {push_to_hub!r} is not a hub repo id: use NAME or "
                          "USER/NAME (letters, digits, '-', '_', '.'; at most 96 characters each)")
    if _hub_offline():
        raise ConfigError(f"cannot push to {push_to_hub!r}: HF_HUB_OFFLINE is set, so the hub is "
                          "not reachable; drop --push-to-hub (the dataset is still written) and "
                          "upload it later on a machine with a hub: "
                          "datasets.load_from_disk(OUT).push_to_hub(REPO)")


def to_pandas(acts: AnyActivations, layer: str | int):
    """One layer as a ``pandas.DataFrame``: the key columns (``id``, ``label``, and for
    token rows ``text_index``, ``position``, ``token_id``), then one float32 column per
    dimension, ``dim_0 .. dim_{d-1}`` (a wide numeric frame: ``df.filter(like="dim_")``
    is the ``(N, d)`` matrix)."""
    import pandas as pd

    label = str(layer)
    if label not in acts.layers:
        raise ConfigError(f"layer {label!r} was not extracted (have: {', '.join(acts.layers)})")
    keys: dict[str, Any] = {}
    blocks = []
    for batch in record_batches(acts, layers=(label,)):
        blocks.append(column_matrix(batch.column(label)))
        for name in batch.schema.names:
            if name != label:
                keys.setdefault(name, []).append(batch.column(name).to_numpy(zero_copy_only=False))
    X = np.concatenate(blocks) if blocks else np.zeros((0, _width(acts)), np.float32)
    frame = {k: np.concatenate(v) for k, v in keys.items()}
    dims = pd.DataFrame(X, columns=[f"dim_{j}" for j in range(X.shape[1])], copy=False)
    return pd.concat([pd.DataFrame(frame), dims], axis=1)


def to_dataset(acts: AnyActivations, *, rows_per_group: int | None = None):
    """A ``datasets.Dataset`` of ``acts`` (the ``hf`` layout), memory-mapped from an Arrow file
    under ``$LMGEOM_CACHE/datasets`` (states are streamed there, not copied in memory)."""
    folder = Path(tempfile.mkdtemp(prefix="acts-", dir=cache_dir("datasets")))
    return _arrow_dataset(acts, folder / "data.arrow", rows_per_group)


# ---------------------------------------------------------------------- rows
def _is_tokens(acts: AnyActivations) -> bool:
    return _token_shards(acts) or acts.row_text is not None


def _width(acts: AnyActivations) -> int:
    if _pooled(acts):
        return int(acts.states.shape[2])
    return int(acts.get(0, acts.layers[0]).shape[1])


def _n_rows(acts: AnyActivations) -> int:
    if _pooled(acts):
        return int(acts.states.shape[1])
    return int(np.sum(acts.n_tokens))


def _group_rows(acts: AnyActivations, rows_per_group: int | None) -> int:
    if rows_per_group is not None:
        if rows_per_group < 1:
            raise ConfigError(f"rows_per_group must be >= 1, got {rows_per_group}")
        return int(rows_per_group)
    return max(1, GROUP_BYTES // (4 * len(acts.layers) * _width(acts)))


def schema(acts: AnyActivations, layers: tuple[str, ...] | None = None):
    """The Arrow schema of an export (with the manifest in the schema metadata)."""
    import pyarrow as pa

    d = _width(acts)
    fields = [pa.field("id", pa.string()), pa.field("label", pa.string())]
    if _is_tokens(acts):
        fields += [pa.field(c, pa.int64()) for c in _TOKEN_COLUMNS]
    fields += [pa.field(lb, pa.list_(pa.float32(), d)) for lb in (layers or acts.layers)]
    return pa.schema(fields, metadata={META_KEY: json.dumps(manifest(acts))})


def manifest(acts: AnyActivations) -> dict[str, Any]:
    """The JSON manifest stored with an export."""
    if _pooled(acts):
        man = acts.manifest()
        man["row_kind"] = "token" if acts.row_text is not None else "text"
        return man
    return {
        "format": "lmgeom.activations/1", "layers": list(acts.layers), "model": acts.model,
        "model_identity": {}, "texts_hash": acts.texts_hash, "text_ids": list(acts.text_ids),
        "labels": list(acts.labels) if acts.labels is not None else None,
        "settings": acts.settings, "n_tokens": np.asarray(acts.n_tokens).tolist(),
        "n_truncated": 0, "key": acts.folder.name, "row_kind": "token",
        "shape": [len(acts.layers), _n_rows(acts), _width(acts)],
    }


def record_batches(acts: AnyActivations, *, rows_per_group: int | None = None,
                   layers: tuple[str, ...] | None = None) -> Iterator[Any]:
    """Yield ``pyarrow.RecordBatch`` es of at most ``rows_per_group`` rows, in row order."""
    layers = tuple(layers or acts.layers)
    n = _group_rows(acts, rows_per_group)
    sch = schema(acts, layers)
    if _pooled(acts):
        yield from _pooled_batches(acts, n, layers, sch)
    else:
        yield from _token_batches(acts, n, layers, sch)


def _ids_labels(acts: AnyActivations, text_index: np.ndarray):
    import pyarrow as pa

    n_texts = len(acts.n_tokens)
    ids = acts.text_ids if len(acts.text_ids) == n_texts else tuple(str(i) for i in range(n_texts))
    idc = pa.array([ids[i] for i in text_index], pa.string())
    lab = pa.array([acts.labels[i] for i in text_index] if acts.labels is not None
                   else [None] * len(text_index), pa.string())
    return idc, lab


def _vectors(block: np.ndarray, d: int):
    import pyarrow as pa

    flat = pa.array(np.ascontiguousarray(block, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, d)


def _pooled_batches(acts: AnyActivations, n: int, layers, sch):
    import pyarrow as pa

    N, d = acts.states.shape[1], acts.states.shape[2]
    li = [acts.layers.index(lb) for lb in layers]
    for a in range(0, N, n):
        b = min(a + n, N)
        rows = np.arange(a, b)
        text = acts.row_text[a:b] if acts.row_text is not None else rows
        cols = list(_ids_labels(acts, text))
        if acts.row_text is not None:
            tok = acts.row_token[a:b] if acts.row_token is not None else None
            cols += [pa.array(acts.row_text[a:b], pa.int64()), pa.array(acts.row_pos[a:b], pa.int64()),
                     pa.array(tok, pa.int64()) if tok is not None else pa.nulls(b - a, pa.int64())]
        cols += [_vectors(acts.states[i, a:b], d) for i in li]
        yield pa.RecordBatch.from_arrays(cols, schema=sch)


def _token_batches(acts: AnyActivations, n: int, layers, sch):
    import pyarrow as pa

    d = _width(acts)
    pending: list[int] = []
    count = 0

    def flush(texts: list[int]):
        lens = [int(acts.n_tokens[t]) for t in texts]
        text = np.repeat(np.asarray(texts, dtype=np.int64), lens)
        pos = np.concatenate([np.arange(m, dtype=np.int64) for m in lens])
        cols = list(_ids_labels(acts, text))
        cols += [pa.array(text), pa.array(pos)]
        if acts.token_ids:
            cols.append(pa.array(np.concatenate([acts.token_ids[t] for t in texts]), pa.int64()))
        else:
            cols.append(pa.nulls(len(text), pa.int64()))
        for lb in layers:
            cols.append(_vectors(np.concatenate([acts.get(t, lb) for t in texts]), d))
        return pa.RecordBatch.from_arrays(cols, schema=sch)

    for t in range(acts.n_texts):
        pending.append(t)
        count += int(acts.n_tokens[t])
        if count >= n:
            yield flush(pending)
            pending, count = [], 0
    if pending:
        yield flush(pending)


# ---------------------------------------------------------------------- writers
def write_parquet(acts: AnyActivations, path: str | os.PathLike[str], *,
                  rows_per_group: int | None = None) -> Path:
    """Stream ``acts`` into one parquet file, one row group per record batch (atomic)."""
    import pyarrow.parquet as pq

    path = Path(path)
    with atomic_path(path) as tmp, pq.ParquetWriter(str(tmp), schema(acts),
                                                    compression="zstd") as writer:
        for batch in record_batches(acts, rows_per_group=rows_per_group):
            writer.write_batch(batch)
    return path


def _arrow_dataset(acts: AnyActivations, arrow_file: Path, rows_per_group: int | None):
    import datasets
    import pyarrow as pa

    sch = schema(acts)
    with pa.OSFile(str(arrow_file), "wb") as sink, pa.ipc.new_stream(sink, sch) as writer:
        for batch in record_batches(acts, rows_per_group=rows_per_group):
            writer.write_batch(batch)
    info = datasets.DatasetInfo(description=json.dumps(manifest(acts)))
    return datasets.Dataset.from_file(str(arrow_file), info=info)


def write_hf(acts: AnyActivations, path: str | os.PathLike[str], *,
             rows_per_group: int | None = None) -> Path:
    """Write ``acts`` as a Hugging Face dataset folder (``save_to_disk``), streamed through a
    memory-mapped Arrow file next to ``path``; the folder appears complete or not at all."""
    from ..results.folder import check_output_path

    path = check_output_path(path, kind="folder")  # an existing folder holds only lmgeom's files
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        ds = _arrow_dataset(acts, work / "stream.arrow", rows_per_group)
        staged = work / "dataset"
        if os.environ.get("LMGEOM_QUIET"):
            import datasets

            datasets.disable_progress_bars()
        ds.save_to_disk(str(staged))
        del ds
        if path.exists():
            _, kept = remove_written(path)  # the previous export, lmgeom's files only
            if kept or any(path.iterdir()):
                raise CacheError(f"{path} holds files lmgeom did not write; choose another --out")
            path.rmdir()
        os.replace(staged, path)
        record_tree(path)
    except OSError as exc:
        raise CacheError(f"could not write the dataset {path}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def _hub_offline() -> bool:
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return True
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return bool(constants.HF_HUB_OFFLINE) or str(env).upper() in ("1", "ON", "YES", "TRUE")


def _push(path: Path, repo: str) -> None:  # pragma: no cover - needs a reachable hub
    import datasets

    try:
        datasets.load_from_disk(str(path)).push_to_hub(repo)
    except Exception as exc:
        raise CacheError(
            f"could not push {path} to the hub repo {repo!r} ({type(exc).__name__}: "
            f"{str(exc)[:200]}); the local dataset is complete — upload it later with "
            f"datasets.load_from_disk({str(path)!r}).push_to_hub({repo!r}) after `hf auth login`"
        ) from exc


# ---------------------------------------------------------------------- columns
def column_matrix(col) -> np.ndarray:
    """An Arrow ``fixed_size_list<float32>[d]`` column as an ``(N, d)`` array."""
    import pyarrow as pa

    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    d = col.type.list_size
    parts = [c.values.slice(c.offset * d, len(c) * d).to_numpy(zero_copy_only=False).reshape(-1, d)
             for c in chunks if len(c)]
    return np.concatenate(parts) if parts else np.zeros((0, d), np.float32)
