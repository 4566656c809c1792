"""The results of extraction as objects: :class:`Activations` (pooled states in memory) and
:class:`TokenActivations` (token states in shards on disk), and reading them back from any
export format (:func:`from_disk`).

Imports the writers (:mod:`.export`) and the cache (:mod:`.cache`) below it; extraction
(:mod:`.core`, :mod:`.tokens`) sits above.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy as stnp  # stnp.save_file at call time: tests fault-inject it
from safetensors import safe_open

from .._io import atomic_path, sha256_bytes, write_json
from ..errors import CacheError, ConfigError
from .cache import tensors_digest
from .export import META_KEY, column_matrix, export_activations, to_dataset, to_pandas


@dataclass
class Activations:
    """Pooled hidden states of one model on one text set.

    Attributes:
        states: ``(n_layers, N, d)`` float32; ``states[i]`` belongs to ``layers[i]``.
            With ``pooling="tokens"`` N is the number of sampled tokens (see ``row_text``).
        layers: point labels (``"0"``..``"L"``, ``"final"``, ``"ℓ.attn_out"``...).
        model: the model spec; ``model_identity`` pins the weights.
        texts_hash: content hash of the text set; ``text_ids`` / ``labels`` from it.
        settings: pooling, max_length, dtype, batch_size, seed, ...
        n_tokens: tokens per text after truncation, ``(n_texts,)``.
        n_truncated: texts cut to ``max_length``.
        row_text / row_pos: for ``tokens`` pooling, the text index and position of each row.
        row_token: for ``tokens`` pooling, the token id at each row (None in older files).
        key: the cache key.
    """

    states: np.ndarray
    layers: tuple[str, ...]
    model: str
    model_identity: dict[str, Any]
    texts_hash: str
    text_ids: tuple[str, ...]
    labels: tuple[str, ...] | None
    settings: dict[str, Any]
    n_tokens: np.ndarray
    n_truncated: int
    row_text: np.ndarray | None = None
    row_pos: np.ndarray | None = None
    key: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    row_token: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.states.shape)  # type: ignore[return-value]

    def layer(self, label: str | int) -> np.ndarray:
        """``(N, d)`` states of one point."""
        label = str(label)
        if label not in self.layers:
            raise ConfigError(f"layer {label!r} was not extracted (have: {', '.join(self.layers)})")
        return self.states[self.layers.index(label)]

    __getitem__ = layer

    def subset(self, indices: Sequence[int] | np.ndarray, *, texts_hash: str) -> Activations:
        """The states of the texts at ``indices`` (positions in this set, increasing), as if
        only they had been extracted: per-text rows for ``last`` / ``mean`` pooling, the
        sampled token rows of those texts for ``tokens``. ``texts_hash`` is the hash of the
        subset's :class:`~lmgeom.texts.TextSet` (``ts.subset(indices).hash``)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self.text_ids)
        if idx.size == 0 or idx.min() < 0 or idx.max() >= n or np.any(np.diff(idx) <= 0):
            raise ConfigError(f"subset: indices must be increasing positions in 0..{n - 1}")
        row_text = row_pos = row_token = None
        if self.row_text is None:
            rows = idx
        else:
            keep = np.isin(self.row_text, idx)
            rows = np.flatnonzero(keep)
            row_text = np.searchsorted(idx, self.row_text[keep]).astype(self.row_text.dtype)
            row_pos = self.row_pos[keep] if self.row_pos is not None else None
            row_token = self.row_token[keep] if self.row_token is not None else None
        digest = sha256_bytes(idx.tobytes())[:16]
        return replace(
            self, states=self.states[:, rows], texts_hash=texts_hash,
            text_ids=tuple(self.text_ids[i] for i in idx.tolist()),
            labels=None if self.labels is None else tuple(self.labels[i] for i in idx.tolist()),
            n_tokens=self.n_tokens[idx], row_text=row_text, row_pos=row_pos, row_token=row_token,
            n_truncated=int(np.sum(self.n_tokens[idx] >= int(self.settings["max_length"])))
            if self.settings.get("max_length") else self.n_truncated,
            key=f"{self.key}-subset-{digest}", timings={})

    def manifest(self) -> dict[str, Any]:
        return {
            "format": "lmgeom.activations/1",
            "layers": list(self.layers),
            "model": self.model,
            "model_identity": self.model_identity,
            "texts_hash": self.texts_hash,
            "text_ids": list(self.text_ids),
            "labels": list(self.labels) if self.labels is not None else None,
            "settings": self.settings,
            "n_tokens": self.n_tokens.tolist(),
            "n_truncated": self.n_truncated,
            "key": self.key,
            "shape": list(self.states.shape),
        }

    def save(self, path: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``PATH.safetensors`` (tensors) and ``PATH.json`` (manifest), atomically."""
        base = Path(path)
        if base.suffix in (".safetensors", ".json"):
            base = base.with_suffix("")
        st, js = base.with_suffix(".safetensors"), base.with_suffix(".json")
        tensors = {"states": np.ascontiguousarray(self.states)}
        if self.row_text is not None:
            tensors["row_text"] = self.row_text
            tensors["row_pos"] = self.row_pos
        if self.row_token is not None:
            tensors["row_token"] = self.row_token
        digest = tensors_digest(tensors)
        need = sum(v.nbytes for v in tensors.values()) + 4096
        with atomic_path(st, need=need) as tmp:
            stnp.save_file(tensors, str(tmp), metadata={"sha256": digest})
        write_json(js, {**self.manifest(), "sha256": digest})
        return st, js

    # data formats (writers: activations/export.py; readers: below)
    def export(self, out: str | os.PathLike[str], *, format: str = "safetensors",
               push_to_hub: str | None = None) -> list[Path]:
        """Write as ``safetensors`` / ``parquet`` / ``hf``; see :func:`export_activations`."""
        return export_activations(self, out, format=format, push_to_hub=push_to_hub)

    def to_dataset(self):
        """A ``datasets.Dataset``: one row per text (or sampled token), a column per layer."""
        return to_dataset(self)

    def to_pandas(self, layer: str | int):
        """One layer as a DataFrame: ``id``, ``label`` (token rows add ``text_index``,
        ``position``, ``token_id``), then ``dim_0 .. dim_{d-1}``."""
        return to_pandas(self, layer)

    @classmethod
    def from_disk(cls, path: str | os.PathLike[str]) -> Activations:
        """Read a safetensors pair, a ``.parquet`` file or an ``hf`` dataset folder."""
        return from_disk(path)


def load_activations(path: str | os.PathLike[str]) -> Activations:
    """Load an activations file written by :meth:`Activations.save` / ``lmgeom extract``.

    Only safetensors and JSON are read (no pickle); the contents are checked against the
    recorded sha256.
    """
    base = Path(path)
    if base.suffix in (".safetensors", ".json"):
        base = base.with_suffix("")
    st, js = base.with_suffix(".safetensors"), base.with_suffix(".json")
    for p in (st, js):
        if not p.is_file():
            raise CacheError(f"activations file {p} does not exist")
    try:
        man = json.loads(js.read_text())
        tensors = stnp.load_file(str(st))
    except Exception as exc:
        raise CacheError(f"cannot read activations {st}: {exc}") from exc
    if man.get("sha256") and tensors_digest(tensors) != man["sha256"]:
        raise CacheError(f"activations file {st} is corrupt (checksum mismatch); re-extract it")
    return Activations(
        states=tensors["states"],
        layers=tuple(man["layers"]),
        model=man["model"],
        model_identity=man["model_identity"],
        texts_hash=man["texts_hash"],
        text_ids=tuple(man["text_ids"]),
        labels=tuple(man["labels"]) if man.get("labels") is not None else None,
        settings=man["settings"],
        n_tokens=np.asarray(man["n_tokens"], dtype=np.int64),
        n_truncated=int(man["n_truncated"]),
        row_text=tensors.get("row_text"),
        row_pos=tensors.get("row_pos"),
        key=man.get("key", ""),
        row_token=tensors.get("row_token"),
    )


@dataclass
class TokenActivations:
    """Each text's ``(T_i, d)`` states at chosen points, stored on disk in shards.

    Nothing is held in memory: :meth:`get` and :meth:`iter_layer` read one shard at a time
    (safetensors, memory-mapped).
    """

    folder: Path
    layers: tuple[str, ...]
    n_texts: int
    n_tokens: np.ndarray
    model: str
    settings: dict[str, Any]
    _where: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)
    text_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] | None = None
    texts_hash: str = ""
    token_ids: tuple[np.ndarray, ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return self.n_texts

    def _shard(self, s: int) -> Path:
        return self.folder / f"shard-{s:05d}.safetensors"

    def get(self, i: int, layer: str) -> np.ndarray:
        """``(T_i, d)`` float32 states of text ``i`` at ``layer``."""
        if layer not in self.layers:
            raise ConfigError(f"layer {layer!r} was not extracted (have: {', '.join(self.layers)})")
        s, j = self._where[i]
        with safe_open(str(self._shard(s)), framework="np") as fh:
            off = fh.get_tensor("offsets")
            x = fh.get_slice(f"h:{layer}")[int(off[j]) : int(off[j + 1])]
        return np.asarray(x)

    def iter_layer(self, layer: str):
        """Yield ``(text_index, (T_i, d) array)`` for every text at ``layer``."""
        for i in range(self.n_texts):
            yield i, self.get(i, layer)

    def export(self, out: str | os.PathLike[str], *, format: str = "parquet",
               push_to_hub: str | None = None) -> list[Path]:
        """Write one row per token as ``parquet`` / ``hf``; see :func:`export_activations`."""
        return export_activations(self, out, format=format, push_to_hub=push_to_hub)

    def to_dataset(self):
        """A ``datasets.Dataset`` with one row per token (text id, position, token id)."""
        return to_dataset(self)


# ---------------------------------------------------------------------- readers
def from_disk(path: str | os.PathLike[str]) -> Activations:
    """Read activations written in any of :data:`FORMATS` (detected from the path).

    A folder with ``dataset_info.json`` is an ``hf`` dataset, ``*.parquet`` is parquet, and a
    stem / ``.safetensors`` / ``.json`` is the safetensors pair. Values come back bit-equal.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / "dataset_info.json").is_file() and not (p / "state.json").is_file():
            raise CacheError(f"{p} is a folder but not a saved Hugging Face dataset "
                             "(no dataset_info.json / state.json)")
        return read_hf(p)
    if p.suffix == ".parquet":
        return read_parquet(p)
    return load_activations(p)


def _from_table(get_column, man: dict[str, Any], n_rows: int) -> Activations:
    layers = tuple(man["layers"])
    d = int(man["shape"][2])
    states = np.empty((len(layers), n_rows, d), dtype=np.float32)
    for i, lb in enumerate(layers):  # one layer at a time
        states[i] = column_matrix(get_column(lb))
    row_text = row_pos = row_token = None
    if man.get("row_kind") == "token":
        row_text = np.asarray(get_column("text_index").to_numpy(), dtype=np.int64)
        row_pos = np.asarray(get_column("position").to_numpy(), dtype=np.int64)
        tok = get_column("token_id")
        row_token = None if tok.null_count == len(tok) else np.asarray(
            tok.to_numpy(zero_copy_only=False), dtype=np.int64)
    return Activations(
        states=states, layers=layers, model=man["model"],
        model_identity=man.get("model_identity") or {}, texts_hash=man.get("texts_hash", ""),
        text_ids=tuple(man.get("text_ids") or ()),
        labels=tuple(man["labels"]) if man.get("labels") is not None else None,
        settings=man.get("settings") or {},
        n_tokens=np.asarray(man.get("n_tokens") or [], dtype=np.int64),
        n_truncated=int(man.get("n_truncated", 0)), row_text=row_text, row_pos=row_pos,
        row_token=row_token, key=man.get("key", ""),
    )


def _manifest_from(raw: str | bytes | None, where: Path) -> dict[str, Any]:
    if not raw:
        raise CacheError(f"{where} has no lmgeom manifest: it was not written by lmgeom "
                         "(export_activations / lmgeom extract --format)")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CacheError(f"{where}: unreadable lmgeom manifest ({exc})") from exc


def read_parquet(path: str | os.PathLike[str]) -> Activations:
    """Read a parquet export back into :class:`Activations` (layer by layer)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise CacheError(f"activations file {path} does not exist")
    try:
        pf = pq.ParquetFile(str(path))
    except Exception as exc:
        raise CacheError(f"cannot read {path} as parquet: {exc}") from exc
    meta = pf.schema_arrow.metadata or {}
    man = _manifest_from(meta.get(META_KEY.encode()), path)
    return _from_table(lambda c: pf.read(columns=[c]).column(c), man, pf.metadata.num_rows)


def read_hf(path: str | os.PathLike[str]) -> Activations:
    """Read an ``hf`` export (a ``save_to_disk`` folder) back into :class:`Activations`."""
    import datasets

    path = Path(path)
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise CacheError(f"cannot load the dataset {path}: {exc}") from exc
    man = _manifest_from(ds.info.description, path)
    table = ds.data
    return _from_table(table.column, man, ds.num_rows)
