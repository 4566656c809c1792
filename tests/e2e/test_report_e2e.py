"""Tests of the report layer: plots, readings, the HTML page, and the page in a real Chromium.

End-to-end half (the unit half is tests/unit/test_report.py).
"""

from __future__ import annotations

from xml.etree import ElementTree

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from PIL import Image
from support.report import (
    LABELS,
    N_LAYERS,
    PLOT_FUNCS,
    XSS,
    XSS_IMG,
    collapse_curve,
    full_table,
    parse,
    pga_rows,
    positive_curve,
    table,  # noqa: F401 (a fixture)
)

from conftest import CHROME_ARGS, CHROMIUM
from lmgeom.errors import ConfigError, DataError
from lmgeom.report import html as report_html
from lmgeom.report import plots
from lmgeom.report.html import write_report
from lmgeom.results.table import frame, read_table, row, write_table

CCRS = (0, 1, 5, 10)


MANIFEST = {
    "command": "lmgeom analyze --model toy-30 --texts builtin:domains",
    "models": ["toy-30"],
    "texts": "builtin:domains",
    "n_texts": 256,
    "settings": {"k": 100, "ccr": [0, 1, 5, 10], "n_null": 100, "pooling": "last",
                 "pairs": {"mode": "sample", "m": 20000}},
    "seeds": {"pairs": 0, "null": 1},
    "versions": {"lmgeom": "0.1.0", "torch": "2.13.0", "numpy": "2.0"},
    "timings": {"extract": 12.5, "metrics": 75.25},
    "started": "2025-01-01T10:00:00+00:00",
    "finished": "2025-01-01T10:01:27.750000+00:00",
    "signature": "0123456789abcdef",
}


@pytest.mark.parametrize("fn", PLOT_FUNCS, ids=lambda f: f.__name__)
def test_plots_written_as_valid_png_and_svg(table, tmp_path, fn):
    paths = fn(table, tmp_path)
    assert [p.suffix for p in paths] == [".png", ".svg"]
    png, svg = paths
    with Image.open(png) as im:
        im.load()
        assert im.format == "PNG"
        assert im.width >= 600 and im.height >= 250
        # not a blank canvas: many distinct colours
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20
    root = ElementTree.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert svg.stat().st_size > 10_000
    assert not list(tmp_path.glob(".*.tmp"))


def test_bad_inputs_raise_typed_errors(table, tmp_path):
    with pytest.raises(DataError, match="columns"):
        plots.plot_pga(table.drop(columns=["layer_index"]), tmp_path)
    with pytest.raises(DataError, match="DataFrame"):
        plots.plot_pga([1, 2], tmp_path)
    with pytest.raises(ConfigError, match="plain file name"):
        plots.plot_metric_by_layer(table, ["pga_z"], tmp_path, "../evil", title="t")
    with pytest.raises(ConfigError, match="mapping"):
        write_report(tmp_path, table, ["not", "a", "dict"])


def test_layer_axis_order_and_ticks(table):
    shuffled = table.sample(frac=1.0, random_state=3)
    fig = plots.build_layer_figure(shuffled, ["pga_z"], title="t", zero_line=True)
    (ax,) = fig.axes
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("CCR-")]
    assert [ln.get_label() for ln in lines] == ["CCR-0", "CCR-1", "CCR-5", "CCR-10"]
    x = lines[1].get_xdata()
    assert list(x) == list(range(N_LAYERS))
    np.testing.assert_allclose(lines[1].get_ydata(), collapse_curve())
    ticks = dict(zip(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()]))
    assert ticks[N_LAYERS - 1] == "final" and ticks[0] == "0"
    assert set(ticks.values()) <= set(LABELS)


def test_null_band_and_ci_bands(table):
    fig = plots.build_layer_figure(table, ["pga_z"], title="t", bands=plots.PGA_BAND)
    assert sum(isinstance(c, PolyCollection) for c in fig.axes[0].collections) == len(CCRS)
    no_band = table.loc[~table["metric"].isin(["null_z_low", "null_z_high"])]
    fig = plots.build_layer_figure(no_band, ["pga_z"], title="t", bands=plots.PGA_BAND)
    assert not fig.axes[0].collections
    # CI bands: two settings (level=chunk / level=group) with intervals
    fig = plots.build_layer_figure(table, ["corr_spearman"], title="t")
    assert sum(isinstance(c, PolyCollection) for c in fig.axes[0].collections) == 2
    no_ci = table.assign(ci_low=np.nan, ci_high=np.nan)
    fig = plots.build_layer_figure(no_ci, ["corr_spearman"], title="t")
    assert not fig.axes[0].collections
    # few points: whiskers (an errorbar LineCollection) instead of a band
    few = table.loc[table["layer_index"] < 5]
    fig = plots.build_layer_figure(few, ["probe_acc"], title="t")
    assert fig.axes[0].collections and not any(
        isinstance(c, PolyCollection) for c in fig.axes[0].collections)


def test_panels_per_model_and_log_scale(table, tmp_path):
    two = pd.concat([table, full_table("other-model")], ignore_index=True)
    fig = plots.build_layer_figure(two, ["pga_z"], title="t")
    assert len(fig.axes) == 2
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["toy-30", "other-model"]
    fig = plots.build_layer_figure(table, list(plots.SPECTRAL_METRICS), title="t",
                                   logy={"condition_number"})
    assert [ax.get_yscale() for ax in fig.axes] == ["linear"] * 4 + ["log"]
    (p1, _), (p2, _) = plots.plot_pga(table, tmp_path / "a"), plots.plot_pga(two, tmp_path / "b")
    with Image.open(p1) as a, Image.open(p2) as b:
        assert b.width > 1.05 * a.width
    revs = pd.concat([full_table("m", revision=f"step{s}") for s in (1000, 2000, 3000, 4000)])
    fig = plots.build_layer_figure(revs, ["pga_z", "pc1_share"], title="t")
    assert len(fig.axes) == 8  # 4 runs × 2 panels, wrapped after 3 columns
    assert {ax.get_title(loc="left") for ax in fig.axes} >= {"m @ step1000", "m @ step4000"}


def test_dollar_signs_do_not_break_plots(tmp_path):
    name = "weird$\\frac{x}$model$^"
    df = frame(pga_rows(name, {1: positive_curve()}, setting_suffix=",tag=$x^$"))
    assert len(plots.plot_pga(df, tmp_path)) == 2
    fig = plots.build_layer_figure(df, ["pga_z"], title=name)
    (ax,) = fig.axes
    # escaped: shown literally, never parsed as math text
    assert ax.get_title(loc="left") == name.replace("$", "\\$")
    assert ax.get_lines()[0].get_label() == "CCR-1,tag=\\$x^\\$"


def test_write_report_structure(table, tmp_path):
    path = write_report(tmp_path, table, MANIFEST)
    assert path == tmp_path / "report.html"
    doc = parse(path)
    ids = doc.ids()
    for key in ("pga", "pc1", "spectral", "logit_lens", "dispersion", "probes"):
        assert f"section-{key}" in ids and f"table-{key}" in ids
        assert doc.rows[f"table-{key}"] == N_LAYERS
    assert doc.rows["table-pga-null"] == N_LAYERS
    assert doc.rows["table-model-level"] == 1
    assert "section-other" not in ids
    page = path.read_text(encoding="utf-8")
    # header
    for s in ("toy-30", "builtin:domains", "256", "1 min 28 s", "0123456789abcdef",
              "lmgeom analyze --model toy-30"):
        assert s in page
    # every manifest setting, seed, version and timing is listed
    settings_text = page.split('id="table-settings"')[1].split("</table>")[0]
    for group in ("settings", "seeds", "versions", "timings"):
        for key in report_html._flatten(MANIFEST[group]):
            assert f"<code>{key[0]}</code>" in settings_text
    assert doc.rows["table-settings"] >= 14
    # collapse rows are marked, in the PGA table
    pga = page.split('id="table-pga"')[1].split("</table>")[0]
    assert pga.count('class="collapse"') == 4
    # images are embedded; links point at files that exist; nothing external
    imgs = [a for t, a in doc.tags if t == "img"]
    assert len(imgs) == 6 and all(a["src"].startswith("data:image/png;base64,") for a in imgs)
    for tag, a in doc.tags:
        for attr in ("src", "href"):
            v = a.get(attr)
            if v is None or v.startswith(("data:", "#")):
                continue
            assert "://" not in v and not v.startswith("//"), v
            assert (tmp_path / v).is_file(), v
    assert {t for t, _ in doc.tags}.isdisjoint({"script", "link", "iframe", "object", "embed"})
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(
        f"{k}.{ext}" for k in ("pga", "pc1", "spectral", "logit_lens", "dispersion", "probes")
        for ext in ("png", "svg"))
    assert not list(tmp_path.rglob(".*.tmp"))


def test_sections_only_when_metrics_exist(tmp_path):
    df = frame(pga_rows("m", {1: positive_curve()}))
    doc = parse(write_report(tmp_path, df, {}))
    ids = doc.ids()
    assert {"section-pga", "table-pga", "section-settings", "section-reading"} <= ids
    for key in ("pc1", "spectral", "logit_lens", "dispersion", "probes", "model-level", "other"):
        assert f"section-{key}" not in ids
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["pga.png", "pga.svg"]
    # an empty table still gives a valid page with the settings section only
    doc = parse(write_report(tmp_path / "empty", frame([]), None))
    assert "section-pga" not in doc.ids() and "section-settings" in doc.ids()


def test_unknown_metrics_and_csv_round_trip(table, tmp_path):
    extra = frame([row(model="toy-30", layer=lab, layer_index=i, metric="knn_ppl", value=10.0 - i / 10)
                   for i, lab in enumerate(LABELS)])
    df = pd.concat([table, extra], ignore_index=True)
    (csv,) = [p for p in write_table(df, tmp_path, "results") if p.suffix == ".csv"]
    doc = parse(write_report(tmp_path, read_table(csv), MANIFEST))
    assert doc.rows["table-other"] == N_LAYERS
    assert doc.rows["table-pga"] == N_LAYERS


def test_two_models_share_tables(table, tmp_path):
    two = pd.concat([table, full_table("other-model")], ignore_index=True)
    doc = parse(write_report(tmp_path, two, {"models": ["toy-30", "other-model"]}))
    assert doc.rows["table-pga"] == 2 * N_LAYERS
    text = "".join(doc.text)
    assert "toy-30: highest PGA z" in text and "other-model: highest PGA z" in text


@pytest.mark.browser
def test_report_in_headless_chromium(table, tmp_path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("python package 'playwright' is not installed (pip install playwright)")
    if CHROMIUM is None:
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium; make browser)")
    hostile = full_table(XSS.replace("alert(1)", "window.__xss=1"))
    manifest = {**MANIFEST, "models": [hostile["model"].iloc[0]], "texts": XSS_IMG}
    path = write_report(tmp_path, hostile, manifest)
    console_errors: list[str] = []
    page_errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.resolve().as_uri(), wait_until="load", timeout=60_000)
            imgs = page.evaluate(
                "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
            )
            rows = page.evaluate(
                "Object.fromEntries(Array.from(document.querySelectorAll('table.layers'))"
                ".map(t => [t.id, t.tBodies[0].rows.length]))"
            )
            xss = page.evaluate("window.__xss === undefined")
            title = page.title()
            width = page.evaluate("document.documentElement.scrollWidth")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert console_errors == [] and page_errors == []
    assert len(imgs) == 6 and all(c and w > 0 and h > 0 for c, w, h in imgs), imgs
    for key in ("pga", "pc1", "spectral", "logit_lens", "dispersion", "probes"):
        assert rows[f"table-{key}"] == N_LAYERS
    assert xss, "a hostile model name ran as script"
    assert "<script>" in title  # shown as text, not run
    assert width <= 1280  # wide tables scroll inside their box, the page does not
    assert all(u.startswith(("file:", "data:")) for u in requests), requests

