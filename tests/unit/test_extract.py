"""Extraction: pooling definitions, cache reuse/resume/corruption, round trips (tiny model)."""

from __future__ import annotations

import numpy as np
import pytest
from support.extract import make_states, tiny  # noqa: F401 (fixtures)

from conftest import CORPUS
from lmgeom.activations import extract, extract_tokens, load_activations
from lmgeom.errors import CacheError, ConfigError, TextsError


def test_cache_hit_and_resume_after_losing_a_shard(tiny, tmp_path):
    kw = dict(pooling="last", batch_size=2, cache_root=tmp_path)
    first = extract(tiny, CORPUS[:10], **kw)
    assert first.timings["batches_computed"] == 5
    again = extract(tiny, CORPUS[:10], **kw)
    assert again.timings["batches_computed"] == 0
    np.testing.assert_array_equal(first.states, again.states)
    shards = sorted((tmp_path / first.key).glob("shard-*.safetensors"))
    shards[2].unlink()
    resumed = extract(tiny, CORPUS[:10], **kw)
    assert resumed.timings["batches_computed"] == 1
    np.testing.assert_array_equal(first.states, resumed.states)


def test_corrupt_shard_is_never_used(tiny, tmp_path):
    kw = dict(pooling="last", batch_size=3, cache_root=tmp_path)
    first = extract(tiny, CORPUS[:9], **kw)
    shard = sorted((tmp_path / first.key).glob("shard-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-8:] = b"\x00\x01\x02\x03\x04\x05\x06\x07"  # flip payload bytes, header intact
    shard.write_bytes(bytes(data))
    again = extract(tiny, CORPUS[:9], **kw)
    assert again.timings["batches_computed"] == 1
    np.testing.assert_array_equal(first.states, again.states)
    shard.write_bytes(b"truncated")
    np.testing.assert_array_equal(first.states, extract(tiny, CORPUS[:9], **kw).states)


def test_cache_key_tracks_settings(tiny, tmp_path):
    base = extract(tiny, CORPUS[:4], cache_root=tmp_path)
    keys = {base.key}
    for kw in ({"max_length": 8}, {"pooling": "mean"}, {"layers": [1, 2]}):
        keys.add(extract(tiny, CORPUS[:4], cache_root=tmp_path, **kw).key)
    keys.add(extract(tiny, CORPUS[1:5], cache_root=tmp_path).key)
    assert len(keys) == 5


def test_truncation_is_reported(tiny):
    acts = extract(tiny, CORPUS[:6], max_length=5, cache=False)
    assert acts.n_truncated == sum(len(tiny.tokenizer(t)["input_ids"]) > 5 for t in CORPUS[:6]) > 0
    assert acts.n_tokens.max() == 5


def test_save_load_round_trip(tiny, tmp_path):
    acts = extract(tiny, CORPUS[:5], cache=False)
    st, js = acts.save(tmp_path / "acts")
    back = load_activations(tmp_path / "acts")
    np.testing.assert_array_equal(back.states, acts.states)
    assert back.layers == acts.layers and back.texts_hash == acts.texts_hash
    raw = bytearray(st.read_bytes())
    raw[-4:] = b"\xff\xff\xff\xff"
    st.write_bytes(bytes(raw))
    with pytest.raises(CacheError, match="corrupt"):
        load_activations(tmp_path / "acts")


def test_token_level_states_stream_to_disk(tiny, tmp_path):
    tok = extract_tokens(tiny, CORPUS[:5], layers=["2", "final"], batch_size=2, cache_root=tmp_path)
    assert len(tok) == 5
    for i in range(5):
        hs, ids = make_states(tiny, CORPUS[i])
        got = tok.get(i, "2")
        assert got.shape == (len(ids), 32)
        np.testing.assert_allclose(got, hs[2], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(tok.get(i, "final"), hs[-1], rtol=1e-4, atol=1e-5)


def test_bad_inputs(tiny):
    with pytest.raises(TextsError):
        extract(tiny, [], cache=False)
    with pytest.raises(ConfigError, match="pooling"):
        extract(tiny, CORPUS[:2], pooling="max", cache=False)
    with pytest.raises(ConfigError, match="out of range"):
        extract(tiny, CORPUS[:2], layers=[9], cache=False)


def test_early_stop_matches_full_forward(tiny):
    early = extract(tiny, CORPUS[:3], layers=[1], cache=False)
    full = extract(tiny, CORPUS[:3], layers="all", cache=False)
    np.testing.assert_array_equal(early.layer("1"), full.layer("1"))

