"""One self-contained HTML page from a tidy results table and its run manifest.

:func:`write_report` draws every plot itself (:mod:`lmgeom.report.plots`, written as PNG + SVG
into ``<out_dir>/plots/``), embeds the PNGs as base64 ``data:`` URIs, links the SVG/PNG files and
writes ``<out_dir>/report.html`` atomically. The page loads nothing from elsewhere (no CDN,
fonts or scripts) and contains no JavaScript. Every string that comes from the user or the data
(model names, paths, settings, labels, manifest values) is HTML-escaped.

Page layout: header (models, texts, N, command, times, run time, signature) → PGA reading →
one section per family of metrics present in the table (reading, plot, per-layer table) →
model-level results → other per-layer metrics → settings (every manifest setting, seeds,
versions, timings) → footer. A section appears only when its metrics have per-layer rows.

Stable hooks for tests and scripts: each per-layer table is
``<table class="layers" id="table-<section>">`` with one ``<tr>`` per model × layer in its
``<tbody>`` (sections: ``pga``, ``pc1``, ``spectral``, ``logit_lens``, ``dispersion``, ``probes``;
also ``pga-null`` and ``other``); sections are ``<section id="section-<name>">``; the settings
table is ``<table class="settings" id="table-settings">``; model-level results are
``id="table-model-level"``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import logging
import math
import os
import struct
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import __version__
from .._io import write_text
from .._testing import pause
from ..errors import ConfigError
from ..metrics.regime import MIN_RUN, STRONG_NEGATIVE_Z, pga_findings
from ..metrics.sample_size import describe_flag
from ..results.console import FLAG_MARK, flag_footer
from . import plots as P
from . import reading as R

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"
PLOTS_DIR = "plots"


def esc(x: Any) -> str:
    """HTML-escape ``str(x)`` (quotes included): safe in text and in quoted attributes."""
    return html.escape(str(x), quote=True)


@dataclass(frozen=True)
class Section:
    """A family of per-layer metrics: its plot, its table and its reading."""

    key: str
    title: str
    intro: str
    plot: Callable[[pd.DataFrame, Path], list[Path]]
    metrics: tuple[str, ...]
    """The section is shown when any of these has per-layer rows."""
    table: tuple[str, ...]
    describe: Callable[[pd.DataFrame], list[str]] | None
    by_setting: bool = False
    """Table columns grouped setting-first (z and p of each CCR side by side)."""


SECTIONS: tuple[Section, ...] = (
    Section(
        "pga", "Subspace PGA",
        "z of Spearman(d_full, d_readout), the agreement of a layer's pairwise cosine distances "
        "with the same distances inside the readout's top-k singular subspace, against random "
        "k-frames. z >> 0: the layer's distance structure is organised around the readout; "
        "z near 0: no special alignment; z < 0: random subspaces preserve it better. One line per "
        "CCR setting (top principal components removed); shaded: the null's central 95 % in z "
        "units; p: empirical p-value against the null.",
        P.plot_pga, ("pga_z",), ("pga_z", "p_value"), None, by_setting=True,
    ),
    Section(
        "pc1", "PC1 migration",
        "Share of the top principal direction u1 inside the readout space, |V_k^T u1|^2, "
        "against the random baseline k/d (dashed), and the variance ratio PC1 explains.",
        P.plot_pc1, ("pc1_share", "pc1_evr"), ("pc1_share", "pc1_baseline", "pc1_evr"),
        R.describe_pc1,
    ),
    Section(
        "spectral", "Spectral metrics",
        "Of the centred states: RankMe (effective rank), alpha-ReQ (eigenvalue decay slope), "
        "IsoScore and mean cosine of random pairs (isotropy / anisotropy), condition number "
        "(log scale).",
        P.plot_spectral, P.SPECTRAL_METRICS, P.SPECTRAL_METRICS, R.describe_spectral,
    ),
    Section(
        "logit_lens", "Logit lens",
        "Top-1 agreement and KL divergence between lm_head(norm(h)) at each layer and the "
        "model's final next-token distribution.",
        P.plot_logit_lens, ("logit_lens_top1", "logit_lens_kl"),
        ("logit_lens_top1", "logit_lens_kl"), R.describe_logit_lens,
    ),
    Section(
        "dispersion", "Representation dispersion",
        "Dispersion D = 1 - mean pairwise cosine; Spearman and Pearson correlation of per-chunk "
        "dispersion with perplexity per layer, at chunk level and over perplexity-sorted groups "
        "of chunks, with bootstrap 95 % intervals.",
        P.plot_dispersion, ("dispersion", "corr_spearman", "corr_pearson"),
        ("dispersion", "corr_spearman", "corr_pearson"), R.describe_dispersion,
    ),
    Section(
        "probes", "Linear probes",
        "Multinomial logistic regression on standardised states, stratified cross-validation; "
        "accuracy with its interval against the majority-class baseline, above PGA z on the same "
        "layer axis.",
        P.plot_probes, ("probe_acc",), ("probe_acc", "probe_baseline"), R.describe_probes,
    ),
)

PGA_NULL_METRICS = ("rho_readout", "null_mean", "null_std", "null_z_low", "null_z_high")
_SHORT = {"pga_z": "z", "p_value": "p"}
_HEADER_KEYS = ("command", "models", "texts", "n_texts", "started", "finished", "signature")
_TABLE_KEYS = ("settings", "seeds", "versions", "timings")

_CSS = """
:root { color-scheme: light; }
body { font: 15px/1.45 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Helvetica, Arial,
       sans-serif; color: #1d2330; background: #fbfbfc; margin: 0; }
main, header.top, footer { max-width: 1120px; margin: 0 auto; padding: 0 24px; }
header.top { padding-top: 22px; }
h1 { font-size: 1.55em; margin: 0 0 10px; }
h2 { font-size: 1.25em; margin: 34px 0 8px; border-bottom: 1px solid #dde1e8; padding-bottom: 4px; }
h3 { font-size: 1.02em; margin: 18px 0 6px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0; }
dl.meta dt { color: #5b6475; } dl.meta dd { margin: 0; overflow-wrap: anywhere; }
nav.toc { margin: 14px 0 0; font-size: .92em; } nav.toc a { margin-right: 12px; }
a { color: #1f5fbf; }
p.intro { color: #4a5365; font-size: .93em; margin: 4px 0 10px; }
aside.how-to-read { background: #f4f6fa; border-left: 3px solid #7a8aa6; padding: 6px 10px;
  margin: 10px 0; font-size: .9em; color: #333a48; }
ul.reading { background: #eef3fb; border-left: 4px solid #1f77b4; padding: 10px 14px 10px 30px;
             margin: 8px 0 14px; }
ul.reading li { margin: 2px 0; }
figure { margin: 10px 0 16px; background: #fff; border: 1px solid #e3e6ec; padding: 8px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { font-size: .85em; color: #5b6475; margin-top: 4px; }
.scroll { overflow-x: auto; margin: 6px 0 14px; }
table { border-collapse: collapse; font-size: .82em; background: #fff; }
th, td { border: 1px solid #e3e6ec; padding: 3px 8px; text-align: left; white-space: nowrap; }
thead th { background: #f1f3f7; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.neg { color: #b3261e; }
td.flagged { background: #fff4ce; }
abbr.flag { text-decoration: none; font-weight: 600; color: #8a5a00; cursor: help; }
p.flag-legend { font-size: .9em; color: #8a5a00; }
tr.collapse td, tr.collapse th { background: #fdecea; }
tr.final td { border-top: 2px solid #9aa3b2; }
table.settings td.value { white-space: pre-wrap; overflow-wrap: anywhere; max-width: 720px; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .9em;
       overflow-wrap: anywhere; }
details summary { cursor: pointer; color: #1f5fbf; margin: 6px 0; }
footer { color: #6b7385; font-size: .85em; border-top: 1px solid #dde1e8; margin-top: 40px;
         padding-top: 10px; padding-bottom: 30px; }
"""


# --------------------------------------------------------------------------- small helpers


def _text(v: Any) -> str:
    """A manifest value as text: strings as they are, containers as JSON."""
    if isinstance(v, str):
        return v
    if isinstance(v, (Mapping, list, tuple, set)):
        if isinstance(v, set):
            v = sorted(v, key=str)
        return json.dumps(v, default=str, ensure_ascii=False, sort_keys=isinstance(v, Mapping))
    return str(v)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k in sorted(d, key=lambda k: str(k)):
        v = d[k]
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def fmt_duration(seconds: float) -> str:
    """``12.3 s``, ``3 min 12 s``, ``1 h 02 min``."""
    s = float(seconds)
    if not math.isfinite(s) or s < 0:
        return "n/a"
    if s < 59.95:
        return f"{s:.1f} s"
    if s < 3600 - 0.5:
        total = round(s)
        return f"{total // 60} min {total % 60:02d} s"
    minutes = round(s / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _parse_time(v: Any) -> _dt.datetime | None:
    if isinstance(v, _dt.datetime):
        return v
    if isinstance(v, (int, float)) and math.isfinite(v):
        return _dt.datetime.fromtimestamp(float(v), tz=_dt.timezone.utc)
    if isinstance(v, str):
        try:
            return _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def run_time(manifest: Mapping[str, Any]) -> float | None:
    """Seconds the run took: ``finished - started`` when both parse, else ``timings["total"]``,
    else the sum of the numeric ``timings``; ``None`` when the manifest says nothing."""
    a, b = _parse_time(manifest.get("started")), _parse_time(manifest.get("finished"))
    if a is not None and b is not None:
        try:
            return (b - a).total_seconds()
        except TypeError:  # naive vs aware
            pass
    timings = manifest.get("timings")
    if isinstance(timings, Mapping) and timings:
        if isinstance(timings.get("total"), (int, float)):
            return float(timings["total"])
        nums = [float(v) for v in timings.values() if isinstance(v, (int, float))]
        if nums:
            return sum(nums)
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    return None


def _href(path: Path, base: Path) -> str:
    rel = os.path.relpath(path, base)
    return esc("/".join(urllib.parse.quote(part) for part in Path(rel).parts))


# --------------------------------------------------------------------------- page parts


def _figure(paths: Sequence[Path], out: Path, alt: str) -> str:
    png = next((p for p in paths if p.suffix == ".png"), None)
    if png is None:
        return ""
    data = png.read_bytes()
    size = _png_size(data)
    dims = f' width="{size[0]}" height="{size[1]}"' if size else ""
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    links = " · ".join(f'<a href="{_href(p, out)}">{esc(p.suffix[1:].upper())}</a>' for p in paths)
    return (f'<figure><img src="{uri}" alt="{esc(alt)}"{dims}>'
            f"<figcaption>{esc(alt)} — files: {links}</figcaption></figure>")


def _reading(lines: Sequence[str]) -> str:
    if not lines:
        return ""
    return '<ul class="reading">' + "".join(f"<li>{esc(s)}</li>" for s in lines) + "</ul>"


def _columns(rows: pd.DataFrame, metrics: Sequence[str], by_setting: bool) -> list[tuple[str, str]]:
    present = rows[["metric", "setting"]].drop_duplicates()
    pairs = [(str(m), str(s)) for m, s in present.itertuples(index=False) if m in metrics]
    if by_setting:
        return sorted(pairs, key=lambda t: (P.natural_key(t[1]), metrics.index(t[0])))
    return sorted(pairs, key=lambda t: (metrics.index(t[0]), P.natural_key(t[1])))


def _header_label(metric: str, setting: str) -> str:
    name = _SHORT.get(metric, P.metric_label(metric))
    return f"{name} {P.setting_label(setting)}".strip()


def _flag_mark(flag: str) -> str:
    """The mark after a value computed under ``flag`` (its codes in the tooltip)."""
    return f' <abbr class="flag" title="LOW SAMPLE: {esc(flag)}">{FLAG_MARK}</abbr>'


def layer_table(
    df: pd.DataFrame,
    metrics: Sequence[str],
    table_id: str,
    *,
    by_setting: bool = False,
    highlight: Mapping[tuple[str, str], set[str]] | None = None,
) -> str:
    """HTML table, one ``<tr>`` per model × revision × layer (layer-axis order), one column per
    metric × setting present; cells ``value [ci_low, ci_high]``. ``""`` when nothing is present.

    Args:
        df: tidy results table.
        metrics: the metrics to show, in column order.
        table_id: the ``id`` attribute (``table-<section>``).
        by_setting: group columns setting-first instead of metric-first.
        highlight: (model, revision) → layer labels whose rows get ``class="collapse"``.
    """
    metrics = list(metrics)
    rows = P.layer_rows(df, metrics)
    if rows.empty:
        return ""
    cols = _columns(rows, metrics, by_setting)
    runs = P.runs_of(rows)
    multi = len(runs) > 1
    highlight = highlight or {}
    flags_seen: list[str] = []
    cells: dict[tuple[str, str, str, str, str], Any] = {}
    for r in rows.itertuples(index=False):
        key = (r.model, r.revision, r.layer, r.metric, r.setting)
        cells.setdefault(key, r)  # first of duplicates, like the plots
    head = (["model"] if multi else []) + ["layer"] + [_header_label(m, s) for m, s in cols]
    out = [f'<div class="scroll"><table class="layers" id="{esc(table_id)}">',
           "<thead><tr>" + "".join(f'<th scope="col">{esc(h)}</th>' for h in head) + "</tr></thead>",
           "<tbody>"]
    for model, revision in runs:
        run = rows.loc[(rows["model"] == model) & (rows["revision"] == revision)]
        layers = (run[["layer_index", "layer"]].drop_duplicates()
                  .assign(k=lambda d: d["layer"].map(P.natural_key))
                  .sort_values(["layer_index", "k"]))
        marked = highlight.get((model, revision), set())
        for layer in layers["layer"]:
            cls = []
            if layer in marked:
                cls.append("collapse")
            if layer == "final":
                cls.append("final")
            tr = f'<tr class="{" ".join(cls)}">' if cls else "<tr>"
            tds = [f"<td>{esc(P.run_label(model, revision))}</td>"] if multi else []
            tds.append(f'<th scope="row">{esc(layer)}</th>')
            for m, s in cols:
                c = cells.get((model, revision, layer, m, s))
                if c is None:
                    tds.append('<td class="num"></td>')
                    continue
                klass = "num neg" if m == "pga_z" and c.value < 0 else "num"
                flag = str(getattr(c, "flag", "") or "")
                text = esc(R.fmt_ci(c.value, c.ci_low, c.ci_high))
                if flag:
                    flags_seen.extend(flag.split(";"))
                    klass += " flagged"
                    text += _flag_mark(flag)
                tds.append(f'<td class="{klass}">{text}</td>')
            out.append(tr + "".join(tds) + "</tr>")
    out.append("</tbody></table></div>")
    legend = flag_footer(flags_seen, describe_flag, "in the cells marked")
    if legend:
        out.append(f'<p class="flag-legend">{esc(legend)}</p>')
    return "\n".join(out)


def _model_level_table(df: pd.DataFrame) -> str:
    """Model-level rows (correlations, overlaps, perplexities ...): a value computed under a
    flag carries the mark and the legend, as in the per-layer tables."""
    ml = df.loc[df["layer_index"] < 0]
    if ml.empty:
        return ""
    head = ["model", "metric", "setting", "value", "95 % interval", "n"]
    out = ['<div class="scroll"><table class="results" id="table-model-level">',
           "<thead><tr>" + "".join(f'<th scope="col">{esc(h)}</th>' for h in head) + "</tr></thead>",
           "<tbody>"]
    flags_seen: list[str] = []
    for r in ml.itertuples(index=False):
        ci = (f"[{R.fmt_num(r.ci_low)}, {R.fmt_num(r.ci_high)}]"
              if np.isfinite(r.ci_low) and np.isfinite(r.ci_high) else "")
        n = R.fmt_num(r.n) if np.isfinite(r.n) else ""
        flag = str(getattr(r, "flag", "") or "")
        cells = [esc(v) for v in (P.run_label(r.model, r.revision), r.metric,
                                  P.setting_label(r.setting), R.fmt_num(r.value), ci, n)]
        klass = ["", "", "", "num", "num", "num"]
        if flag:
            flags_seen.extend(flag.split(";"))
            klass[3] += " flagged"
            cells[3] += _flag_mark(flag)
        out.append("<tr>" + "".join(f'<td class="{k}">{c}</td>' for k, c in zip(klass, cells))
                   + "</tr>")
    out.append("</tbody></table></div>")
    legend = flag_footer(flags_seen, describe_flag, "in the cells marked")
    if legend:
        out.append(f'<p class="flag-legend">{esc(legend)}</p>')
    return "\n".join(out)


def _settings_table(manifest: Mapping[str, Any]) -> str:
    rows: list[tuple[str, str, str]] = []
    for group in _TABLE_KEYS:
        v = manifest.get(group)
        if isinstance(v, Mapping):
            for k, val in _flatten(v):
                if group == "timings" and isinstance(val, (int, float)):
                    rows.append((group, k, f"{fmt_duration(val)} ({val:g} s)"))
                else:
                    rows.append((group, k, _text(val)))
        elif v is not None:
            rows.append((group, "", _text(v)))
    for k in sorted((k for k in manifest if k not in _TABLE_KEYS), key=str):
        rows.append(("run", str(k), _text(manifest[k])))
    if not rows:
        return "<p>The manifest records no settings.</p>"
    out = ['<div class="scroll"><table class="settings" id="table-settings">',
           ('<thead><tr><th scope="col">group</th><th scope="col">key</th>'
            '<th scope="col">value</th></tr></thead><tbody>')]
    for g, k, v in rows:
        out.append(f'<tr><td>{esc(g)}</td><td><code>{esc(k)}</code></td>'
                   f'<td class="value">{esc(v)}</td></tr>')
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _header(df: pd.DataFrame, manifest: Mapping[str, Any], title: str, toc: list[tuple[str, str]]) -> str:
    items: list[tuple[str, str]] = []
    models = manifest.get("models")
    if models is None:
        models = sorted({m for m in df["model"].astype(str) if m})
    elif isinstance(models, str):
        models = [models]
    facts = _model_facts(models) if models else ""
    if models and not facts:
        items.append(("model" if len(models) == 1 else "models",
                      ", ".join(str(m) for m in models)))
    revs = sorted({r for r in df["revision"].astype(str) if r}, key=P.natural_key)
    if revs:
        items.append(("revisions", ", ".join(revs)))
    if manifest.get("texts") is not None:
        items.append(("texts", _text(manifest["texts"])))
    if manifest.get("n_texts") is not None:
        items.append(("N texts", _text(manifest["n_texts"])))
    for key, label in (("started", "started"), ("finished", "finished")):
        if manifest.get(key) is not None:
            items.append((label, _text(manifest[key])))
    rt = run_time(manifest)
    if rt is not None:
        items.append(("run time", fmt_duration(rt)))
    if manifest.get("signature") is not None:
        items.append(("signature", _text(manifest["signature"])))
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    cmd = manifest.get("command")
    if cmd is not None:
        if isinstance(cmd, (list, tuple)):
            cmd = " ".join(str(c) for c in cmd)
        dl += f"<dt>command</dt><dd><code>{esc(cmd)}</code></dd>"
    nav = " ".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in toc)
    return (f'<header class="top"><h1>{esc(title)}</h1>{facts}<dl class="meta">{dl}</dl>'
            f'<nav class="toc">{nav}</nav></header>')


#: the model facts the report's header shows (manifest key, column): what the model is, not
#: where or by which process it ran (host and pid stay in the settings table)
MODEL_FACTS = (("name", "model"), ("model_type", "family"), ("width", "width d"),
               ("n_blocks", "blocks"), ("dtype", "dtype"), ("k", "k"),
               ("weights_sha256", "weights sha256"))


def _model_facts(models: Sequence[Any]) -> str:
    """The header's table of model facts (one row per model), ``""`` when the manifest lists
    the models by name only."""
    rows = [m for m in models if isinstance(m, Mapping)]
    if not rows:
        return ""
    cols = [(k, label) for k, label in MODEL_FACTS if any(r.get(k) is not None for r in rows)]
    head = "".join(f'<th scope="col">{esc(label)}</th>' for _, label in cols)

    def cell(k: str, v: Any) -> str:
        if v is None:
            return ""
        text = str(v)[:16] if k == "weights_sha256" else _text(v)
        return (f'<code title="{esc(str(v))}">{esc(text)}</code>' if k == "weights_sha256"
                else esc(text))

    body = "".join("<tr>" + "".join(f"<td>{cell(k, r.get(k))}</td>" for k, _ in cols)
                   + "</tr>" for r in rows)
    return (f'<div class="scroll"><table class="models" id="table-models"><thead><tr>{head}'
            f"</tr></thead><tbody>{body}</tbody></table></div>")


def _known_metrics() -> set[str]:
    known = {m for s in SECTIONS for m in (*s.metrics, *s.table)}
    return known | set(PGA_NULL_METRICS)


# --------------------------------------------------------------------------- the page


def _default_title(df: pd.DataFrame, manifest: Mapping[str, Any]) -> str:
    models = manifest.get("models") or sorted({m for m in df["model"].astype(str) if m})
    if isinstance(models, str):
        models = [models]
    names = [str(m.get("name", "model")) if isinstance(m, Mapping) else str(m) for m in models]
    return "lmgeom report" + (": " + ", ".join(names) if names else "")


def _reading_section(df: pd.DataFrame, toc: list[tuple[str, str]],
                     manifest: Mapping[str, Any] | None = None) -> list[str]:
    """The PGA reading (the verdicts of :mod:`lmgeom.metrics.regime`, phrased) and the rule;
    a k lowered to fit the texts is said first (the manifest's ``k_note``)."""
    pga_lines = R.describe_pga(df)
    if not pga_lines:
        return []
    pga_lines = R.k_notes(manifest or {}) + pga_lines
    toc.append(("section-reading", "Reading"))
    return ['<section id="section-reading"><h2>Reading</h2>' + _reading(pga_lines)
            + "<p class=\"intro\">Collapse-zone rule: a run of at least "
              f"{MIN_RUN} consecutive non-final layers after the peak with z &lt; 0 "
              f"under the primary setting (CCR-1 by default), or one such layer with "
              f"z &lt; {esc(R.fmt_num(STRONG_NEGATIVE_Z))}; collapse-zone rows are "
              "shaded in the table below.</p></section>"]


#: the "how to read this" box under the first z table of every report (the same reading as the
#: site's "How to read a z table", concepts page; plain text: the page links nowhere outside)
HOW_TO_READ_Z = (
    '<aside class="how-to-read" id="how-to-read-z"><strong>How to read this table.</strong> '
    "Each z compares how well the readout's top-k subspace keeps the layer's pairwise distances "
    "with how well random k-dimensional subspaces keep them, in units of the random subspaces' "
    "spread. A z inside the null band (about &plusmn;2; the shaded band of the plot) decides "
    "nothing; z clearly above it: the layer's geometry is organised for the readout; clearly "
    "below it: random directions keep the geometry better (a collapse zone when this happens "
    "in late, non-final layers). CCR-m: the same after removing the top m principal components "
    "(anisotropy correction). At small n add the text-sampling error (about "
    "&plusmn;2/&radic;(n/64) more). A cell marked * rests on too little data (its flag says "
    "why): read it as an indication, not a result.</aside>")


def _layer_sections(df: pd.DataFrame, out: Path, toc: list[tuple[str, str]]) -> list[str]:
    """One section per entry of :data:`SECTIONS` with data: plot, reading, table."""
    zones = {(f.model, f.revision): f.zone_layers for f in pga_findings(df)}
    body = []
    for sec in SECTIONS:
        rows = P.layer_rows(df, sec.metrics)
        if rows.empty:
            continue
        paths = sec.plot(df, out / PLOTS_DIR)
        pause("report")
        parts = [f'<section id="section-{esc(sec.key)}"><h2>{esc(sec.title)}</h2>',
                 f'<p class="intro">{esc(sec.intro)}</p>']
        if sec.describe is not None:
            parts.append(_reading(sec.describe(df)))
        parts.append(_figure(paths, out, f"{sec.title} per layer"))
        parts.append(layer_table(df, sec.table, f"table-{sec.key}", by_setting=sec.by_setting,
                                 highlight=zones if sec.key in ("pga", "pc1") else None))
        if sec.key == "pga":
            parts.append(HOW_TO_READ_Z)
            null = layer_table(df, PGA_NULL_METRICS, "table-pga-null", by_setting=True,
                               highlight=zones)
            if null:
                parts.append("<details><summary>Readout correlation and null distribution per "
                             "layer</summary>" + null + "</details>")
        parts.append("</section>")
        toc.append((f"section-{sec.key}", sec.title))
        body.append("\n".join(parts))
    return body


#: the two papers every report cites (the README's and the site's Citing section); plain text,
#: as the page makes no outside reference (it must open offline, self-contained)
CITATIONS = ("Xu (2026), arXiv:2605.17084 (Subspace PGA) and Li, Li, Livescu, Zhou (2025), "
             "arXiv:2506.24106 (representation dispersion)")


def _page(df: pd.DataFrame, manifest: Mapping[str, Any], title: str,
          toc: list[tuple[str, str]], body: list[str]) -> str:
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    footer = (f"<footer>Generated by lmgeom {esc(__version__)} on {esc(generated)} from a results "
              f"table of {len(df)} rows. Plots are also written as SVG and PNG in "
              f"<code>{esc(PLOTS_DIR)}/</code> next to this page. Methods: Subspace PGA and "
              "representation dispersion as specified in lmgeom's METHODS, from "
              f"{CITATIONS}.</footer>")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        _header(df, manifest, title, toc),
        "<main>", *body, "</main>",
        footer,
        "</body></html>",
        "",
    ])


def write_report(
    out_dir: str | os.PathLike[str],
    df: pd.DataFrame,
    manifest: Mapping[str, Any] | None,
    *,
    title: str | None = None,
    extra_figures: Sequence[tuple[str, Sequence[Path], str]] = (),
) -> Path:
    """Draw every plot and write ``<out_dir>/report.html``, one self-contained page.

    Args:
        out_dir: output folder (created); plots go to ``<out_dir>/plots/<section>.png|svg``.
        df: tidy results table (:mod:`lmgeom.results.table` columns).
        manifest: the run manifest; every key is optional (``command``, ``models``, ``texts``,
            ``n_texts``, ``settings``, ``seeds``, ``versions``, ``timings``, ``started``,
            ``finished``, ``signature``; unknown keys are listed in the settings table).
        title: page title; default ``lmgeom report: <models>``.
        extra_figures: ``(title, [png, svg], caption)`` for figures an experiment drew itself
            (e.g. the cross-model heatmap); each becomes a section after the per-layer ones.

    Returns:
        The path of ``report.html``.

    Raises:
        DataError: ``df`` is not a results table.
        ConfigError: ``manifest`` is not a mapping.
    """
    df = P.check_table(df)
    if manifest is None:
        manifest = {}
    if not isinstance(manifest, Mapping):
        raise ConfigError(
            f"manifest must be a mapping (the run's manifest.json as a dict), got "
            f"{type(manifest).__name__}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if title is None:
        title = _default_title(df, manifest)
    toc: list[tuple[str, str]] = []
    body = _reading_section(df, toc, manifest) + _layer_sections(df, out, toc)
    for i, (fig_title, fig_paths, caption) in enumerate(extra_figures):
        key = f"section-extra-{i}"
        toc.append((key, str(fig_title)))
        body.append(f'<section id="{key}"><h2>{esc(fig_title)}</h2><p class="intro">{esc(caption)}</p>'
                    + _figure([Path(p) for p in fig_paths], out, str(fig_title)) + "</section>")
    ml = _model_level_table(df)
    if ml:
        toc.append(("section-model-level", "Model-level results"))
        body.append('<section id="section-model-level"><h2>Model-level results</h2>' + ml
                    + "</section>")
    other = sorted(set(P.layer_rows(df)["metric"]) - _known_metrics())
    if other:
        toc.append(("section-other", "Other metrics"))
        body.append('<section id="section-other"><h2>Other per-layer metrics</h2>'
                    + layer_table(df, other, "table-other") + "</section>")
    toc.append(("section-settings", "Settings"))
    body.append('<section id="section-settings"><h2>Settings</h2>'
                '<p class="intro">Every setting the run recorded, with seeds, versions and '
                "timings.</p>" + _settings_table(manifest) + "</section>")
    if len(body) == 1:
        body.insert(0, "<p>The results table has no per-layer results to show.</p>")
    page = _page(df, manifest, title, toc, body)
    target = out / REPORT_NAME
    write_text(target, page)
    log.info("report written to %s", target)
    return target
