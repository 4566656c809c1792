"""What ``lmgeom texts`` prints: the table of built-in corpora and a preview of any corpus.

Plain strings, so the same summaries serve the CLI and a notebook::

    from lmgeom.texts import builtin_table, describe, load_texts
    print(builtin_table())
    print(describe(load_texts("builtin:domains", limit=250), show=3))
"""

from __future__ import annotations

from .builtin import corpora_dir, list_builtin
from .textset import TextSet

__all__ = ["builtin_table", "describe"]


def _table(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def builtin_table() -> str:
    """The built-in offline corpora (name, size, fetched or not, licence) and the cache path."""
    rows = [["name", "texts", "words", "fetched", "licence", "description"]]
    for r in list_builtin():
        rows.append(
            [
                f"builtin:{r['name']}",
                f"{r['n_texts']:,}" if r["n_texts"] is not None else "-",
                f"{r['n_words']:,}" if r["n_words"] is not None else "-",
                "yes" if r["fetched"] else "no",
                r["licence"],
                r["description"],
            ]
        )
    return (_table(rows, right={1, 2})
            + f"\n\ncache: {corpora_dir()}  (fetch all: lmgeom texts --fetch)")


def _short(text: str, width: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: max(width - 1, 1)] + "…"


def describe(ts: TextSet, *, show: int = 5, width: int = 100) -> str:
    """Source, size, hash, label counts and the first ``show`` texts (one line each)."""
    words = ts.n_words
    lines = [
        f"{ts.source}",
        f"texts: {len(ts):,}   words: {words:,}   mean words/text: {words / len(ts):.1f}"
        + (f"   dropped empty: {ts.n_dropped}" if ts.n_dropped else ""),
        f"hash: {ts.hash[:16]}",
    ]
    counts = ts.label_counts()
    if counts is not None:
        lines.append("labels: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for i in range(min(show, len(ts))):
        label = f" [{ts.labels[i]}]" if ts.labels is not None else ""
        lines.append(f"{ts.ids[i]}{label}: {_short(ts.texts[i], width)}")
    return "\n".join(lines)
