"""Plain-text tables for what commands print (aligned columns, numbers right-aligned)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                 floatfmt: str = "{:.4g}") -> str:
    """Rows (dicts) as an aligned plain-text table; ``(no rows)`` when empty."""
    if not rows:
        return "(no rows)"
    cols = list(columns or list(rows[0]))

    def fmt(v: Any) -> str:
        return floatfmt.format(v) if isinstance(v, float) else str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)),
             "  ".join("-" * w for w in widths)]
    for row in cells:
        lines.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w)
                               for v, w in zip(row, widths)))
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


#: the mark a flagged number carries in every printed table (and the report's tables)
FLAG_MARK = "*"


def mark_flags(rows: Sequence[Mapping[str, Any]], flags: Sequence[str],
               column: str = "flag") -> list[dict[str, Any]]:
    """``rows`` with a ``flag`` column (``* code;code`` on a flagged row, ``""`` else), added
    only when some row is flagged: the one way every command's table marks a number computed
    under a flag (too few texts, k at or above the rank, ...). :func:`flag_footer` says what
    the codes mean."""
    out = [dict(r) for r in rows]
    if not any(flags):
        return out
    for r, f in zip(out, flags):
        r[column] = f"{FLAG_MARK} {f}" if f else ""
    return out


def flag_footer(flags: Iterable[str], describe: Callable[[str], str],
                where: str = "") -> str:
    """The line under a table with flagged rows (``""`` when none): each code and its
    meaning, and that the marked numbers rest on too little data to read as they are."""
    codes: dict[str, None] = {}
    for f in flags:
        for c in str(f or "").split(";"):
            if c:
                codes.setdefault(c, None)
    if not codes:
        return ""
    meaning = "; ".join(f"{c} = {describe(c)}" for c in codes)
    return (f"{FLAG_MARK} LOW SAMPLE{f' {where}' if where else ''}: {meaning}. The marked "
            "numbers rest on too little data: read them as indications, not results.")
