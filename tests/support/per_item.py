"""Helpers and fixtures shared by tests/unit/test_per_item.py and tests/e2e/test_per_item_e2e.py."""

from __future__ import annotations

import json

import numpy as np

WORDS = ["river", "stone", "light", "window", "paper", "garden", "music", "winter", "number", "question", "table", "orange", "forest", "engine", "silver", "market"]


def corpus(tmp_path, n=24):
    rng = np.random.default_rng(0)
    rows = [{"text": " ".join(rng.choice(WORDS, size=int(rng.integers(3, 60)))),
             "label": ["a", "b"][i % 2]} for i in range(n)]
    p = tmp_path / "texts.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p

