"""Plain-text tables for what commands print (aligned columns, numbers right-aligned)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
