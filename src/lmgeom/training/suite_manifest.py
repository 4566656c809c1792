"""A suite folder on disk: its checkpoints (:func:`suite_checkpoints`), its manifest
(:func:`write_manifest`, :func:`read_suite`) and the text the CLI prints about it."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._io import write_json
from ..errors import CacheError
from ..results.console import format_table
from ..results.manifest import now, versions
from .suite_config import (
    FORMAT,
    WIDTH_DONE,
    SuiteConfig,
    checkpoint_steps,
    model_shape,
    width_label,
)
from .suite_width import checkpoint_meta

log = logging.getLogger("lmgeom.training.suite")


def _widths_on_disk(root: Path) -> list[int]:
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def suite_checkpoints(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every saved checkpoint of a suite folder, sorted by width then step: dicts with
    ``width``, ``label`` (``w128``), ``step``, ``revision`` (``step512``), ``path``,
    ``tokens``, ``val_loss``, ``weights_sha256``."""
    root = Path(root)
    if not (root / "suite.json").is_file():
        raise CacheError(f"{root} is not a suite folder (no suite.json); train one with "
                         "`lmgeom suite train --out DIR`")
    out = []
    for w in _widths_on_disk(root):
        for d in (root / str(w)).iterdir():
            if not (d.is_dir() and d.name.startswith("step") and d.name[4:].isdigit()):
                continue
            meta = checkpoint_meta(d)
            if meta is None:
                continue
            out.append({"width": w, "label": width_label(w), "step": int(d.name[4:]),
                        "revision": d.name, "path": str(d), "tokens": meta.get("tokens"),
                        "val_loss": meta.get("val_loss"), "weights_sha256": meta.get("weights_sha256")})
    return sorted(out, key=lambda c: (c["width"], c["step"]))


def duplicate_weights(items: Sequence[tuple[str, str | None]]) -> list[list[str]]:
    """Groups of names whose weight hashes are equal: ``[(name, sha), ...]`` → ``[[a, b], ...]``
    (hash ``None`` is skipped)."""
    by: dict[str, list[str]] = {}
    for name, sha in items:
        if sha:
            by.setdefault(sha, []).append(name)
    return [names for names in by.values() if len(names) > 1]


def write_manifest(root: str | os.PathLike[str], config: SuiteConfig | None = None, *,
                   data_s: float | None = None) -> dict[str, Any]:
    """Rebuild ``root/manifest.json`` from what is on disk; warn about identical checkpoints."""
    root = Path(root)
    suite = json.loads((root / "suite.json").read_text())
    settings = suite["settings"]
    info = json.loads((root / "data" / "data.json").read_text())
    cks = suite_checkpoints(root)
    total_steps = int(settings["tokens"]) // (int(settings["batch_size"]) * int(settings["seq_len"]))
    want = checkpoint_steps(total_steps, int(settings["n_regular"]))
    cfg = config or SuiteConfig(widths=tuple(_widths_on_disk(root)) or (64,),
                                **{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()})
    widths: dict[str, Any] = {}
    for w in _widths_on_disk(root):
        done = root / str(w) / WIDTH_DONE
        rec = json.loads(done.read_text()) if done.is_file() else {}
        mine = [c for c in cks if c["width"] == w]
        have = {c["step"] for c in mine}
        status = "complete" if rec.get("status") == "complete" and set(want) <= have else "partial"
        widths[str(w)] = {
            "label": width_label(w),
            "status": status,
            "shape": rec.get("shape") or model_shape(w, cfg),
            "n_params": rec.get("n_params"),
            "n_params_non_embedding": rec.get("n_params_non_embedding"),
            "steps": sorted(have),
            "missing_steps": sorted(set(want) - have),
            "checkpoints": {c["revision"]: {"step": c["step"], "tokens": c["tokens"],
                                            "val_loss": c["val_loss"],
                                            "weights_sha256": c["weights_sha256"],
                                            "path": os.path.relpath(c["path"], root)}
                            for c in mine},
            "threads": rec.get("threads"),
            "timings": rec.get("timings", {}),
        }
    dups = duplicate_weights([(f"{c['label']}@{c['revision']}", c["weights_sha256"]) for c in cks])
    for group in dups:
        log.warning("identical weights in the suite: %s (a checkpoint did not change — "
                    "was the learning rate 0?)", ", ".join(group))
    old = {}
    if (root / "manifest.json").is_file():
        try:
            old = json.loads((root / "manifest.json").read_text())
        except ValueError:
            old = {}
    timings = dict(old.get("timings", {}))
    if data_s is not None:
        timings.setdefault("data_s", data_s)
    timings["train_s_total"] = sum(float(v["timings"].get("train_s", 0.0)) for v in widths.values())
    timings["eval_s_total"] = sum(float(v["timings"].get("eval_s", 0.0)) for v in widths.values())
    timings["save_s_total"] = sum(float(v["timings"].get("save_s", 0.0)) for v in widths.values())
    manifest = {
        "format": FORMAT,
        "created": old.get("created") or now(),
        "updated": now(),
        "settings": settings,
        "tokens_per_width": total_steps * int(settings["batch_size"]) * int(settings["seq_len"]),
        "steps_total": total_steps,
        "checkpoint_steps": want,
        "seed": settings["seed"],
        "tokenizer": {"path": "tokenizer", "vocab_size": info["vocab_size"],
                      "sha256": info["tokenizer_sha256"]},
        "data": {k: info[k] for k in ("data_hash", "n_docs", "n_tokens", "sources", "dtype")},
        "widths": widths,
        "identical_weights": dups,
        "timings": {**info.get("timings", {}), **timings},
        "versions": versions(),
    }
    write_json(root / "manifest.json", manifest)
    return manifest


def read_suite(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a suite folder (rebuilt from disk when missing)."""
    root = Path(root)
    p = root / "manifest.json"
    if p.is_file():
        return json.loads(p.read_text())
    if (root / "suite.json").is_file() and (root / "data" / "data.json").is_file():
        return write_manifest(root)
    raise CacheError(f"{root} is not a suite folder; train one with `lmgeom suite train --out DIR`")


def plan_line(root: str | os.PathLike[str], config: SuiteConfig) -> str:
    """One line: what ``train_suite(root, config)`` is about to train."""
    return (f"suite {root}: widths {', '.join(map(str, config.widths))}, {config.steps} steps "
            f"of {config.tokens_per_step} tokens ({config.steps * config.tokens_per_step:,} "
            f"tokens per width), {config.n_layers} layers, seed {config.seed}")


def widths_table(manifest: dict[str, Any]) -> str:
    """One row per width of a suite manifest: status, shape, checkpoints, first/last held-out
    loss, training time; then a warning line per group of identical weights."""
    rows = []
    for w, v in sorted(manifest["widths"].items(), key=lambda kv: int(kv[0])):
        cks = sorted(v["checkpoints"].values(), key=lambda c: c["step"])
        tm = v.get("timings", {})
        rows.append({
            "width": int(w), "status": v["status"], "layers": v["shape"]["n_layers"],
            "heads": v["shape"]["n_heads"], "params": v.get("n_params") or "",
            "ckpts": len(cks),
            "val loss first": cks[0]["val_loss"] if cks else float("nan"),
            "val loss last": cks[-1]["val_loss"] if cks else float("nan"),
            "train s": float(tm.get("train_s", float("nan"))),
            "tok/s": float(tm.get("tokens_per_s", float("nan"))),
        })
    lines = [format_table(rows, floatfmt="{:.4g}")]
    for group in manifest.get("identical_weights", []):
        lines.append("WARNING: identical weights: " + ", ".join(group))
    return "\n".join(lines)


def describe_suite(root: str | os.PathLike[str], manifest: dict[str, Any], *,
                   steps: bool = False) -> str:
    """What ``lmgeom suite info`` prints: settings, data, checkpoint steps, the widths table
    and, with ``steps``, every checkpoint's held-out loss and weights hash."""
    m, s = manifest, manifest["settings"]
    lines = [
        (f"suite {root} ({m['format']}): {m['tokens_per_width']:,} tokens per width, "
        f"{m['steps_total']} steps of {s['batch_size']} x {s['seq_len']}, seed {m['seed']}, "
        f"vocab {m['tokenizer']['vocab_size']}, data {m['data']['data_hash'][:12]}"),
        (f"texts: {', '.join(s['texts'])} (excluded: {', '.join(s['exclude_texts']) or 'none'}); "
        f"checkpoint steps: {', '.join(map(str, m['checkpoint_steps']))}"),
        widths_table(m),
    ]
    if steps:
        rows = []
        for w, v in sorted(m["widths"].items(), key=lambda kv: int(kv[0])):
            for rev, c in sorted(v["checkpoints"].items(), key=lambda kv: kv[1]["step"]):
                rows.append({"width": int(w), "checkpoint": rev, "tokens": c["tokens"],
                             "val loss": c["val_loss"],
                             "weights": (c["weights_sha256"] or "")[:12]})
        lines += ["", format_table(rows, floatfmt="{:.4f}")]
    return "\n".join(lines)


__all__ = ["describe_suite", "duplicate_weights", "plan_line", "read_suite", "suite_checkpoints",
           "widths_table", "write_manifest"]
