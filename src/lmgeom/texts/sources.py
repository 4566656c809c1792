"""Builders for the built-in corpora: raw files from wheels (or the stdlib) → clean records.

Each builder takes what it needs (a ``zipfile.ZipFile`` of the wheel, or the stdlib path)
and returns ``(records, summary)``: ``records`` is a list of ``{"id", "text"[, "label"]}``
dicts in a deterministic order and ``summary`` a short description such as
``"106 articles → 3819 paragraphs"``. Wheels are only read as zip archives: their code is never
imported or executed.
"""

from __future__ import annotations

import ast
import bz2
import json
import logging
import re
import sysconfig
import textwrap
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from .cleaning import clean_wikitext, detokenize, is_prose, n_words, pack_paragraphs

log = logging.getLogger(__name__)

Record = dict[str, str]

WIKI_MEMBER = (
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
NEWS_MEMBER = "gensim/test/test_data/lee_background.cor"
SENTIMENT_MEMBER = "gensim/test/test_data/pang_lee_polarity.cor"
SCIENCE_PREFIX = "aclsum/dataset/paper_jsons/"
MATH_MEMBER = "champ_dataset/dataset_files/v0.json"

MIN_WORDS = 60
MAX_WORDS = 400
MIN_KEEP = 40


def _read_member(zf: zipfile.ZipFile, name: str) -> bytes:
    try:
        return zf.read(name)
    except KeyError:
        raise KeyError(f"{Path(zf.filename or '?').name} has no member {name}") from None


# --------------------------------------------------------------------------------------------
# wiki
# --------------------------------------------------------------------------------------------


def build_wiki(zf: zipfile.ZipFile) -> tuple[list[Record], str]:
    """107 enwiki articles (gensim test data) → cleaned paragraphs of ~60–400 words.

    Main-namespace pages only; redirects and disambiguation pages are skipped.
    """
    raw = bz2.decompress(_read_member(zf, WIKI_MEMBER))
    root = ET.fromstring(raw)
    ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
    records: list[Record] = []
    n_articles = 0
    for page in root.iter(f"{ns}page"):
        title = page.findtext(f"{ns}title") or ""
        if page.findtext(f"{ns}ns") != "0" or page.find(f"{ns}redirect") is not None:
            continue
        wikitext = page.findtext(f"{ns}revision/{ns}text") or ""
        if title.endswith("(disambiguation)") or re.search(
            r"\{\{\s*(disambiguation|disambig|dab|hndis|geodis)\b", wikitext, re.IGNORECASE
        ):
            continue
        paragraphs = [p for p in clean_wikitext(wikitext) if is_prose(p)]
        passages = pack_paragraphs(
            paragraphs, min_words=MIN_WORDS, max_words=MAX_WORDS, min_keep=MIN_KEEP
        )
        if passages:
            n_articles += 1
        for j, text in enumerate(passages):
            records.append({"id": f"{title}#{j}", "text": text})
    return records, f"{n_articles} articles → {len(records)} paragraphs"


# --------------------------------------------------------------------------------------------
# news, sentiment (gensim test data)
# --------------------------------------------------------------------------------------------


def build_news(zf: zipfile.ZipFile) -> tuple[list[Record], str]:
    """The Lee background corpus: 300 ABC news articles, one per line; articles longer than
    400 words are split at sentence boundaries."""
    lines = _read_member(zf, NEWS_MEMBER).decode("utf-8").splitlines()
    records: list[Record] = []
    n_articles = 0
    for i, line in enumerate(lines):
        article = " ".join(line.split())
        if not article:
            continue
        n_articles += 1
        pieces = pack_paragraphs([article], min_words=MIN_WORDS, max_words=MAX_WORDS, min_keep=1)
        for j, text in enumerate(pieces):
            rid = f"lee{i:03d}" if len(pieces) == 1 else f"lee{i:03d}.{j}"
            records.append({"id": rid, "text": text})
    return records, f"{n_articles} articles → {len(records)} texts"


def build_sentiment(zf: zipfile.ZipFile) -> tuple[list[Record], str]:
    """Pang & Lee movie-review snippets with ``__label__pos`` / ``__label__neg`` prefixes."""
    # the file is Windows-1252 (em dashes 0x97, é 0xe9), not UTF-8
    lines = _read_member(zf, SENTIMENT_MEMBER).decode("cp1252").splitlines()
    records: list[Record] = []
    for i, line in enumerate(lines):
        m = re.match(r"__label__(\w+)\s+(.*)$", line.strip())
        if not m:
            continue
        text = detokenize(m.group(2))
        if text:
            records.append({"id": f"pl{i:03d}", "text": text, "label": m.group(1)})
    c = Counter(r["label"] for r in records)
    return records, f"{len(records)} snippets, " + ", ".join(
        f"{k} {v}" for k, v in sorted(c.items())
    )


# --------------------------------------------------------------------------------------------
# science (aclsum)
# --------------------------------------------------------------------------------------------

_CITE_SPACE = re.compile(r"\s+([,.;:)])")
_OPEN_SPACE = re.compile(r"\(\s+")


def _clean_science(text: str) -> str:
    text = " ".join(text.split())
    return _OPEN_SPACE.sub("(", _CITE_SPACE.sub(r"\1", text))


def build_science(zf: zipfile.ZipFile) -> tuple[list[Record], str]:
    """250 ACL papers (S2ORC parses in aclsum): each abstract as one text, and the body text
    paragraphs merged/split to ~60–400 words. Standalone equations and table fragments are
    dropped; back matter (acknowledgements) and the bibliography are not used."""
    names = sorted(n for n in zf.namelist() if n.startswith(SCIENCE_PREFIX) and n.endswith(".json"))
    records: list[Record] = []
    n_abs = n_body = 0
    for name in names:
        paper = json.loads(zf.read(name).decode("utf-8"))
        pid = Path(name).stem  # the ACL Anthology id (the JSON's paper_id is truncated for some)
        parse = paper.get("pdf_parse") or {}
        abstract = paper.get("abstract") or " ".join(
            p.get("text", "") for p in parse.get("abstract") or []
        )
        abstract = _clean_science(abstract)
        if n_words(abstract) >= 20:
            records.append({"id": f"{pid}/abstract", "text": abstract})
            n_abs += 1
        paragraphs = [_clean_science(p.get("text", "")) for p in parse.get("body_text") or []]
        paragraphs = [p for p in paragraphs if n_words(p) >= 5 and is_prose(p, min_alpha=0.5)]
        for j, text in enumerate(
            pack_paragraphs(paragraphs, min_words=MIN_WORDS, max_words=MAX_WORDS, min_keep=MIN_KEEP)
        ):
            records.append({"id": f"{pid}/body{j:03d}", "text": text})
            n_body += 1
    return records, f"{len(names)} papers → {n_abs} abstracts + {n_body} body passages"


# --------------------------------------------------------------------------------------------
# math (champ-dataset)
# --------------------------------------------------------------------------------------------


def build_math(zf: zipfile.ZipFile) -> tuple[list[Record], str]:
    """CHAMP competition problems: problem, step-by-step solution and answer as one text;
    label = category (Combinatorics, Inequality, Number-Theory, Polynomial, Sequence)."""
    data = json.loads(_read_member(zf, MATH_MEMBER).decode("utf-8"))
    problems: dict[str, Any] = data["problems"]

    def key(pid: str) -> tuple[str, int, str]:
        m = re.match(r"(.*?)(\d+)$", pid)
        return (m.group(1), int(m.group(2)), pid) if m else (pid, 0, pid)

    records: list[Record] = []
    for pid in sorted(problems, key=key):
        p = problems[pid]
        problem = (p.get("_text") or (p.get("_raw_text") or "").replace("@@", "")).strip()
        steps = [
            (s.get("_text") or (s.get("_raw_text") or "").replace("@@", "")).strip()
            for s in (p.get("solution") or {}).get("steps", [])
        ]
        steps = [s for s in steps if s]
        answer = str(p.get("_answer") or (p.get("_raw_answer") or "").replace("@@", "")).strip()
        if not problem or not steps:
            continue
        text = f"Problem: {problem}\n\nSolution: " + " ".join(steps)
        if answer:
            text += f"\n\nAnswer: {answer}"
        rec: Record = {"id": pid, "text": text}
        if p.get("category"):
            rec["label"] = str(p["category"])
        records.append(rec)
    c = Counter(r.get("label", "?") for r in records)
    return records, f"{len(records)} problems in {len(c)} categories"


# --------------------------------------------------------------------------------------------
# code (the running interpreter's standard library)
# --------------------------------------------------------------------------------------------

#: Directories under the stdlib that are not library code (tests, third-party, generated).
CODE_SKIP_DIRS = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "__pycache__",
        "encodings",
        "lib2to3",
        "ensurepip",
        "pydoc_data",
        "config",
        "turtledemo",
    }
)
CODE_MIN_WORDS = 30
CODE_MAX_WORDS = 400


def stdlib_path() -> Path:
    """The running interpreter's standard library (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _code_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in CODE_SKIP_DIRS or part.startswith("config-") for part in rel[:-1]):
            continue
        if rel[-1].startswith("test_") or rel[-1].endswith("_test.py"):
            continue
        out.append(p)
    return out


def _node_source(lines: list[str], node: ast.AST) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1 : node.end_lineno]).rstrip()


def _chunks(lines: list[str], tree: ast.Module) -> list[tuple[str, str]]:
    """``(qualified name, source)`` for top-level functions and classes; a class longer than
    the limit is replaced by its methods (dedented so they parse on their own)."""
    out: list[tuple[str, str]] = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        src = _node_source(lines, node)
        if isinstance(node, ast.ClassDef) and n_words(src) > CODE_MAX_WORDS:
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append(
                        (f"{node.name}.{sub.name}", textwrap.dedent(_node_source(lines, sub)))
                    )
        else:
            out.append((node.name, src))
    return out


def build_code(stdlib: Path | None = None) -> tuple[list[Record], str]:
    """The Python standard library of the running interpreter, split with ``ast`` into
    top-level function and class chunks of 30–400 words (test packages, ``site-packages`` and
    generated modules skipped; exact duplicates removed)."""
    root = stdlib or stdlib_path()
    files = _code_files(root)
    records: list[Record] = []
    seen: set[str] = set()
    ids: set[str] = set()
    n_files = 0
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source, filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
            log.debug("skipping %s: %s", path, exc)
            continue
        lines = source.splitlines(keepends=True)
        rel = path.relative_to(root).as_posix()
        used = False
        for qual, src in _chunks(lines, tree):
            w = n_words(src)
            if not CODE_MIN_WORDS <= w <= CODE_MAX_WORDS or src in seen:
                continue
            seen.add(src)
            rid = f"{rel}:{qual}"
            k = 2
            while rid in ids:
                rid = f"{rel}:{qual}~{k}"
                k += 1
            ids.add(rid)
            records.append({"id": rid, "text": src})
            used = True
        n_files += used
    return records, f"{n_files} stdlib files → {len(records)} functions/classes"
