"""The inputs of model / checkpoint selection (:mod:`lmgeom.experiments.select`
scores them): the domain and general token sets (each candidate's own tokenizer)
and the candidates (a training suite's checkpoints, or models named one by one)."""

from __future__ import annotations

import json
import keyword
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, ModelError, TextsError
from ...training.suite_manifest import suite_checkpoints

DOMAINS: dict[str, tuple[str, ...]] = {
    "math": tuple("0123456789"),
    "code": tuple(keyword.kwlist),
}
FORMS = ("both", "bare", "space")


# ---------------------------------------------------------------------- tokens
def domain_words(domain: str) -> tuple[str, tuple[str, ...]]:
    """``(name, words)``: ``math`` / ``code``, or a comma-separated list (name ``custom``)."""
    d = str(domain).strip()
    if d in DOMAINS:
        return d, DOMAINS[d]
    words = tuple(dict.fromkeys(w.strip() for w in d.split(",") if w.strip()))
    if len(words) < 2:
        raise ConfigError(f"--domain {domain!r}: use math, code, or at least 2 comma-separated "
                          "tokens (e.g. 'def,return,class')")
    return "custom", words


@dataclass(frozen=True)
class TokenSet:
    """Domain token ids for one tokenizer.

    Attributes:
        ids: ``(|T|,)`` distinct ids, in word order.
        kept: ``(word, form, id, token string)`` of every single-id form.
        dropped: words with no single-id form.
    """

    ids: np.ndarray
    kept: tuple[tuple[str, str, int, str], ...]
    dropped: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        return {"n": len(self.ids), "kept": [list(k) for k in self.kept],
                "dropped": list(self.dropped)}


def domain_token_ids(tokenizer, words: Sequence[str], *, forms: str = "both") -> TokenSet:
    """Map words to single token ids with ``tokenizer`` (see the module docstring)."""
    if forms not in FORMS:
        raise ConfigError(f"forms must be one of {', '.join(FORMS)}, got {forms!r}")
    variants = {"both": ("{}", " {}"), "bare": ("{}",), "space": (" {}",)}[forms]
    kept: list[tuple[str, str, int, str]] = []
    dropped: list[str] = []
    seen: set[int] = set()
    for w in words:
        got = False
        for v in variants:
            form = v.format(w)
            ids = tokenizer(form, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:
                got = True
                i = int(ids[0])
                if i not in seen:
                    seen.add(i)
                    kept.append((w, form, i, str(tokenizer.convert_ids_to_tokens(i))))
        if not got:
            dropped.append(w)
    return TokenSet(ids=np.array([k[2] for k in kept], dtype=np.int64), kept=tuple(kept),
                    dropped=tuple(dropped))


def general_token_ids(tokenizer, texts: Sequence[str], exclude, *, n: int = 500,
                      pool: int = 5000, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """A seeded sample of ``n`` of the ``pool`` most frequent ids of ``texts`` that are not in
    ``exclude`` and not special tokens. Returns ``(ids, info)``."""
    if n < 1 or pool < 1:
        raise ConfigError(f"n_general and general_pool must be >= 1 (got {n}, {pool})")
    enc = tokenizer(list(texts), add_special_tokens=False, truncation=False,
                    verbose=False)["input_ids"]
    counts: Counter[int] = Counter()
    for row in enc:
        counts.update(int(i) for i in row)
    bad = {int(i) for i in exclude} | {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    ranked = sorted((i for i in counts if i not in bad), key=lambda i: (-counts[i], i))
    if not ranked:
        raise TextsError("the general corpus has no tokens outside the domain set")
    top = np.array(ranked[:pool], dtype=np.int64)
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(top, size=min(n, len(top)), replace=False))
    info = {"n": len(ids), "pool": len(top), "distinct_in_corpus": len(counts),
            "corpus_tokens": int(sum(counts.values())), "seed": int(seed),
            "examples": [str(tokenizer.convert_ids_to_tokens(int(i))) for i in ids[:12]]}
    return ids, info


# ---------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidate:
    """One model to rank: ``spec`` is what :func:`load_model` gets; ``label`` / ``revision``
    go into the table's ``model`` / ``revision`` columns."""

    spec: str
    label: str
    revision: str = ""
    step: int | None = None
    group: str = ""

    @property
    def name(self) -> str:
        return f"{self.label}@{self.revision}" if self.revision else self.label


_STEP = re.compile(r"^step[_-]?(\d+)$")


def suite_candidates(folder: str | Path) -> list[Candidate]:
    """Checkpoints of a locally trained suite (``lmgeom suite train --out DIR``).

    A folder with ``suite.json`` is read with :func:`lmgeom.training.suite_manifest.suite_checkpoints`
    (widths labelled ``w64`` ..., revisions ``step<N>``). Otherwise reads ``DIR/manifest.json``
    when it lists checkpoints (a list under ``checkpoints``,
    ``models`` or ``runs`` whose entries have a ``path``/``dir``/``folder``, optional ``width``,
    ``step``), else finds every ``DIR/<width>/step<N>/`` folder with a ``config.json``.
    Ordered by width, then step.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ModelError(f"--suite {root}: no such folder (train one with `lmgeom suite train "
                         f"--out {root}`)")
    found: dict[str, Candidate] = {}
    if (root / "suite.json").is_file():
        for ck in suite_checkpoints(root):
            p = Path(ck["path"])
            found[str(p.resolve())] = _suite_candidate(root, p, str(ck["label"]), int(ck["step"]))
        if found:
            return sorted(found.values(), key=lambda c: (_width_key(c.group), c.step or 0, c.spec))
    man = root / "manifest.json"
    if man.is_file():
        try:
            data = json.loads(man.read_text())
        except ValueError as exc:
            raise ModelError(f"--suite {root}: manifest.json is not valid JSON ({exc})") from exc
        for entry in _manifest_entries(data):
            path = entry.get("path") or entry.get("dir") or entry.get("folder")
            if not path:
                continue
            p = Path(path)
            p = p if p.is_absolute() else root / p
            if not (p / "config.json").is_file():
                continue
            width = str(entry.get("width", p.parent.name))
            step = entry.get("step")
            if step is None:
                m = _STEP.match(p.name)
                step = int(m.group(1)) if m else None
            found[str(p.resolve())] = _suite_candidate(root, p, width, step)
    if not found:
        for cfg in sorted(root.glob("*/*/config.json")):
            p = cfg.parent
            m = _STEP.match(p.name)
            if m:
                found[str(p.resolve())] = _suite_candidate(root, p, p.parent.name,
                                                           int(m.group(1)))
    if not found:
        raise ModelError(f"--suite {root}: no checkpoints found (expected manifest.json or "
                         "<width>/step<N>/ model folders)")
    return sorted(found.values(), key=lambda c: (_width_key(c.group), c.step or 0, c.spec))


def filter_candidates(cands: Sequence[Candidate], *, widths: Sequence[str] | None = None,
                      steps: Sequence[int] | None = None) -> list[Candidate]:
    """Keep suite checkpoints of the given widths (``64`` or ``w64``) and steps."""
    out = list(cands)
    if widths:
        want = {str(w).lstrip("w") for w in widths}
        out = [c for c in out if c.group.lstrip("w") in want]
    if steps:
        want_s = {int(x) for x in steps}
        out = [c for c in out if c.step in want_s]
    if not out:
        raise ConfigError("no suite checkpoint matches --widths / --steps")
    return out


def _manifest_entries(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, list):
        return [e for e in data if isinstance(e, dict)]
    if not isinstance(data, dict):
        return []
    for key in ("checkpoints", "models", "runs"):
        v = data.get(key)
        if isinstance(v, list):
            return [e for e in v if isinstance(e, dict)]
        if isinstance(v, dict):  # {width: [entries]} or {width: {step: path}}
            out = []
            for width, sub in v.items():
                items = sub if isinstance(sub, list) else (
                    [{"step": s, "path": q} for s, q in sub.items()] if isinstance(sub, dict)
                    else [])
                for e in items:
                    if isinstance(e, dict):
                        out.append({"width": width, **e})
                    elif isinstance(e, str):
                        out.append({"width": width, "path": e})
            return out
    return []


def _width_key(w: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", w)
    return (int(digits) if digits else 0, w)


def _suite_candidate(root: Path, path: Path, width: str, step: int | None) -> Candidate:
    group = str(width)
    return Candidate(spec=str(path), label=f"{root.name}/{group}",
                     revision=f"step{step}" if step is not None else path.name, step=step,
                     group=group)


def model_candidates(specs: Sequence[str]) -> list[Candidate]:
    out, seen = [], set()
    for s in specs:
        if s in seen:
            raise ConfigError(f"--model {s} is given twice")
        seen.add(s)
        out.append(Candidate(spec=s, label=s))
    return out
