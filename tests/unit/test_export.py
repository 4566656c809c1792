"""Activations as data: safetensors / parquet / hf round trips, streaming, push validation."""

from __future__ import annotations

import numpy as np
import pytest

import lmgeom
from conftest import CORPUS
from lmgeom.activations import export as ex
from lmgeom.activations import from_disk
from lmgeom.errors import CacheError, ConfigError
from lmgeom.texts import TextSet

TEXTS = TextSet(ids=tuple(f"t{i}" for i in range(7)), texts=tuple(CORPUS[:7]),
                labels=tuple("ab"[i % 2] for i in range(7)), source="test")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return lmgeom.load_model(str(tiny_dir("llama")))


@pytest.fixture(scope="module")
def pooled(tiny):
    return lmgeom.extract(tiny, TEXTS, layers="all", pooling="mean", cache=False, batch_size=3)


@pytest.fixture(scope="module")
def sampled(tiny):
    return lmgeom.extract(tiny, TEXTS, layers="0,2,final", pooling="tokens", n_tokens=25,
                          cache=False, batch_size=3)


def _same(a, b):
    assert a.layers == b.layers
    assert a.states.dtype == b.states.dtype == np.float32
    np.testing.assert_array_equal(a.states.view(np.uint32), b.states.view(np.uint32))  # bits
    assert a.text_ids == b.text_ids and a.labels == b.labels
    assert a.model == b.model and a.settings == b.settings and a.key == b.key
    np.testing.assert_array_equal(a.n_tokens, b.n_tokens)
    for f in ("row_text", "row_pos", "row_token"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("fmt", ex.FORMATS)
@pytest.mark.parametrize("which", ["pooled", "sampled"])
def test_round_trip_bit_equal(fmt, which, request, tmp_path):
    acts = request.getfixturevalue(which)
    paths = ex.export_activations(acts, tmp_path / "acts", format=fmt, rows_per_group=4)
    assert all(p.exists() for p in paths)
    back = lmgeom.Activations.from_disk(paths[0])
    _same(acts, back)


def test_parquet_is_row_grouped_and_self_describing(pooled, tmp_path):
    import pyarrow.parquet as pq

    (path,) = pooled.export(tmp_path / "a", format="parquet")
    assert pq.ParquetFile(path).metadata.num_row_groups == 1  # default: ~64 MiB per group
    ex.write_parquet(pooled, path, rows_per_group=3)
    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups == 3
    names = pf.schema_arrow.names
    assert names == ["id", "label", *pooled.layers]
    assert pf.schema_arrow.field("final").type.list_size == pooled.states.shape[2]
    tbl = pf.read(columns=["id", "label", "final"])
    assert tbl.column("id").to_pylist() == list(TEXTS.ids)
    assert tbl.column("label").to_pylist() == list(TEXTS.labels)
    np.testing.assert_array_equal(np.array(tbl.column("final").to_pylist(), np.float32),
                                  pooled.layer("final"))


def test_streaming_builds_each_group_from_slices(pooled):
    """Every batch holds only its rows (no batch carries all N rows of all layers)."""
    batches = list(ex.record_batches(pooled, rows_per_group=2))
    assert [b.num_rows for b in batches] == [2, 2, 2, 1]
    got = np.array([v for b in batches for v in b.column("3").to_pylist()], np.float32)
    np.testing.assert_array_equal(got, pooled.layer("3"))


def test_hf_dataset_columns(pooled, sampled, tmp_path):
    import datasets

    (path,) = pooled.export(tmp_path / "ds", format="hf")
    ds = datasets.load_from_disk(str(path))
    assert ds.num_rows == 7 and ds.column_names == ["id", "label", *pooled.layers]
    np.testing.assert_array_equal(np.asarray(ds.with_format("numpy")["final"]),
                                  pooled.layer("final"))
    tok = sampled.to_dataset()
    assert tok.column_names[:5] == ["id", "label", "text_index", "position", "token_id"]
    assert tok.num_rows == 25
    row = tok[0]
    t, p = row["text_index"], row["position"]
    assert row["id"] == TEXTS.ids[t] and p >= 1
    ids = lmgeom.activations.encode_texts(lmgeom.load_model(pooled.model), TEXTS.texts, 128).ids
    assert [r["token_id"] for r in tok] == [int(ids[r["text_index"]][r["position"]]) for r in tok]


def test_to_pandas(pooled, sampled):
    df = pooled.to_pandas("final")
    d = pooled.states.shape[2]
    assert list(df.columns[:2]) == ["id", "label"] and df.shape == (7, 2 + d)
    np.testing.assert_array_equal(df.filter(like="dim_").to_numpy(), pooled.layer("final"))
    tdf = sampled.to_pandas(2)
    assert list(tdf.columns[:5]) == ["id", "label", "text_index", "position", "token_id"]
    np.testing.assert_array_equal(tdf["position"].to_numpy(), sampled.row_pos)
    with pytest.raises(ConfigError, match="was not extracted"):
        sampled.to_pandas("1")


def test_token_activations_export(tiny, tmp_path):
    toks = lmgeom.extract_tokens(tiny, TEXTS, layers="1,final", cache=False, batch_size=3)
    enc = lmgeom.activations.encode_texts(tiny, TEXTS.texts, 512)
    for fmt in ("parquet", "hf"):
        (path,) = toks.export(tmp_path / f"tok-{fmt}", format=fmt)
        back = from_disk(path)
        n = int(toks.n_tokens.sum())
        assert back.states.shape == (2, n, tiny.width)
        for lb in ("1", "final"):
            want = np.concatenate([toks.get(i, lb) for i in range(len(TEXTS))])
            np.testing.assert_array_equal(back.layer(lb), want)
        np.testing.assert_array_equal(back.row_token, np.concatenate(enc.ids))
        np.testing.assert_array_equal(back.row_pos,
                                      np.concatenate([np.arange(len(x)) for x in enc.ids]))
        assert [back.text_ids[t] for t in back.row_text[:1]] == ["t0"]
    with pytest.raises(ConfigError, match="parquet or hf"):
        toks.export(tmp_path / "x", format="safetensors")


def test_push_to_hub_validation(pooled, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="--format hf"):
        ex.export_activations(pooled, tmp_path / "a", format="parquet", push_to_hub="me/acts")
    for bad in ("me/acts/extra", "-bad/x", "me/..x", "a b/c", ""):
        with pytest.raises(ConfigError, match="not a hub repo id"):
            ex.check_export(pooled, format="hf", push_to_hub=bad)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        ex.export_activations(pooled, tmp_path / "a", format="hf", push_to_hub="me/acts")
    assert not (tmp_path / "a").exists()  # validated before writing anything
    with pytest.raises(ConfigError, match="unknown activations format"):
        ex.export_activations(pooled, tmp_path / "a", format="csv")


def test_foreign_files_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "f.parquet")
    with pytest.raises(CacheError, match="no lmgeom manifest"):
        from_disk(tmp_path / "f.parquet")
    (tmp_path / "d").mkdir()
    with pytest.raises(CacheError, match="not a saved Hugging Face dataset"):
        from_disk(tmp_path / "d")


def test_cli_extract_formats_round_trip(tiny_dir, tmp_path, capsys):
    """``lmgeom extract --format parquet|hf`` writes what ``--format safetensors`` writes."""
    import lmgeom
    from lmgeom.activations import from_disk
    from lmgeom.cli import main

    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(f"text number {i} about rivers and {i * 'stones '}"
                               for i in range(10)) + "\n")
    base = ["extract", "--model", str(tiny_dir("llama")), "--texts", str(texts), "--layers",
            "0,1,final", "--quiet"]
    assert main(base + ["--out", str(tmp_path / "a")]) == 0
    ref = lmgeom.load_activations(tmp_path / "a")
    for fmt, path in (("parquet", tmp_path / "b.parquet"), ("hf", tmp_path / "c")):
        assert main(base + ["--format", fmt, "--out", str(path.with_suffix(""))]) == 0
        assert str(path) in capsys.readouterr().out
        got = from_disk(path)
        np.testing.assert_array_equal(got.states, ref.states)
        assert got.text_ids == ref.text_ids and got.layers == ref.layers
    assert main(base + ["--push-to-hub", "org/name", "--out", str(tmp_path / "d")]) == 2
    assert "--format hf" in capsys.readouterr().err
    assert not (tmp_path / "d.safetensors").exists()
