"""Tests of the report layer: plots, readings, the HTML page, and the page in a real Chromium."""

from __future__ import annotations

import html as _html
import math
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from PIL import Image

from conftest import CHROME_ARGS, CHROMIUM
from lmgeom.errors import ConfigError, DataError
from lmgeom.metrics.regime import pga_findings
from lmgeom.report import html as report_html
from lmgeom.report import plots, reading
from lmgeom.report.html import write_report
from lmgeom.report.reading import describe_pga, fmt_num, layers_phrase
from lmgeom.results.table import frame, read_table, row, write_table

L = 30  # blocks of the synthetic model
LABELS = [str(i) for i in range(L + 1)] + ["final"]  # 32 points on the layer axis
N_LAYERS = len(LABELS)
CCRS = (0, 1, 5, 10)
XSS = "<script>alert(1)</script>"
XSS_IMG = '<img src=x onerror="window.__xss=2">'


# --------------------------------------------------------------------------- synthetic data


def collapse_curve() -> np.ndarray:
    """CCR-1-like z: rises to 20 at layer 12, collapses below 0 at layers 20–23, recovers."""
    z = np.empty(N_LAYERS)
    for i in range(L + 1):
        z[i] = 20 * math.exp(-((i - 12) / 5.0) ** 2) + 1.5
    z[20:24] = [-3.0, -12.0, -25.0, -8.0]
    z[24:31] = np.linspace(1.0, 4.0, 7)
    z[L + 1] = 15.0  # final
    return z


def positive_curve() -> np.ndarray:
    return np.array([6.0 + 10 * math.sin(math.pi * i / (N_LAYERS - 1)) for i in range(N_LAYERS)])


def pga_rows(model: str, curves: dict[int, np.ndarray], *, revision: str = "", band: bool = True,
             setting_suffix: str = "") -> list[dict]:
    out = []
    for m, z in curves.items():
        s = f"ccr={m}{setting_suffix}"
        for i, lab in enumerate(LABELS):
            common = {"model": model, "revision": revision, "layer": lab, "layer_index": i,
                      "depth": i / N_LAYERS, "setting": s, "n": 256.0}
            out.append(row(metric="pga_z", value=float(z[i]), seed=0.0, **common))
            out.append(row(metric="p_value", value=0.0099 if z[i] > 2 else 0.42, seed=0.0, **common))
            out.append(row(metric="rho_readout", value=0.3 + 0.01 * z[i], **common))
            out.append(row(metric="null_mean", value=0.3, **common))
            out.append(row(metric="null_std", value=0.01, **common))
            if band:
                out.append(row(metric="null_z_low", value=-1.9 - 0.01 * i, **common))
                out.append(row(metric="null_z_high", value=2.0 + 0.01 * i, **common))
    return out


def full_table(model: str = "toy-30", *, revision: str = "") -> pd.DataFrame:
    """Every metric the report knows, for a 30-block model (layers 0..30 + final)."""
    base = collapse_curve()
    curves = {0: base * 0.8 - 1.0, 1: base, 5: np.abs(base) * 0.5 + 2.0, 10: np.abs(base) * 0.4 + 1.0}
    rows = pga_rows(model, curves, revision=revision)
    rng = np.random.default_rng(0)
    for i, lab in enumerate(LABELS):
        c = {"model": model, "revision": revision, "layer": lab, "layer_index": i,
             "depth": i / N_LAYERS}
        t = i / (N_LAYERS - 1)
        share = 0.05 if 20 <= i <= 23 else 0.6 - 0.3 * t
        per = {
            "pc1_share": share, "pc1_baseline": 100 / 576, "pc1_evr": 0.1 + 0.4 * t,
            "rankme": 50 + 150 * t, "alpha_req": 0.5 + t, "isoscore": 0.01 + 0.2 * t,
            "mean_cosine": 0.9 - 0.6 * t, "condition_number": 10 ** (2 + 4 * t),
            "logit_lens_top1": 1 / (1 + math.exp(-(i - 22) / 2.0)),
            "logit_lens_kl": 8.0 * (1 - t) ** 2, "dispersion": 0.2 + 0.6 * t,
        }
        for metric, v in per.items():
            rows.append(row(metric=metric, value=float(v), **c))
        for level in ("chunk", "group"):
            for metric in ("corr_spearman", "corr_pearson"):
                r = -0.2 - 0.6 * t + (0.05 if level == "chunk" else 0.0) + rng.normal(0, 0.02)
                w = 0.1 if level == "chunk" else 0.05
                rows.append(row(metric=metric, setting=f"level={level}", value=r, ci_low=r - w,
                                ci_high=r + w, seed=1.0, n=1000.0, **c))
        acc = 0.3 + 0.6 * math.exp(-((i - 14) / 8.0) ** 2)
        rows.append(row(metric="probe_acc", setting="labels=domain", value=acc, ci_low=acc - 0.04,
                        ci_high=acc + 0.04, seed=0.0, n=256.0, **c))
        rows.append(row(metric="probe_baseline", setting="labels=domain", value=0.25, **c))
    rows.append(row(model=model, revision=revision, metric="perplexity", value=12.5, n=256.0))
    return frame(rows)


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


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return full_table()


# --------------------------------------------------------------------------- HTML parsing


class _Doc(HTMLParser):
    """Collects tags, attributes and table rows of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: dict[str, int] = {}
        self._table: list[str | None] = []
        self._in_tbody = False
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table.append(a.get("id"))
        elif tag == "tbody":
            self._in_tbody = True
        elif tag == "tr" and self._in_tbody and self._table and self._table[-1]:
            self.rows[self._table[-1]] = self.rows.get(self._table[-1], 0) + 1

    def handle_endtag(self, tag):
        if tag == "table" and self._table:
            self._table.pop()
        elif tag == "tbody":
            self._in_tbody = False

    def handle_data(self, data):
        self.text.append(data)

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.tags if a.get("id")}


def parse(path: Path) -> _Doc:
    d = _Doc()
    d.feed(path.read_text(encoding="utf-8"))
    return d


# --------------------------------------------------------------------------- plots


PLOT_FUNCS = [plots.plot_pga, plots.plot_pc1, plots.plot_spectral, plots.plot_logit_lens,
              plots.plot_dispersion, plots.plot_probes]


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


def test_missing_metrics_skip_plots(tmp_path):
    only_pga = frame(pga_rows("m", {1: positive_curve()}))
    for fn in PLOT_FUNCS[1:]:
        assert fn(only_pga, tmp_path) == []
    empty = frame([])
    for fn in PLOT_FUNCS:
        assert fn(empty, tmp_path) == []
    assert plots.plot_metric_by_layer(only_pga, ["nope"], tmp_path, "x", title="t") == []
    assert [p.name for p in tmp_path.iterdir()] == []
    # a panel alone of dashed baselines is no plot
    base = frame([row(model="m", layer=lab, layer_index=i, metric="probe_baseline", value=0.25)
                  for i, lab in enumerate(LABELS)])
    assert plots.plot_probes(base, tmp_path) == []


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


# --------------------------------------------------------------------------- readings


def test_describe_pga_collapse_zone_and_restoration():
    z = collapse_curve()
    df = frame(pga_rows("pythia-like", {0: z - 1, 1: z, 5: np.abs(z) * 0.5 + 1, 10: np.abs(z) * 0.5 + 2}))
    lines = describe_pga(df)
    text = "\n".join(lines)
    assert lines[0].startswith("pythia-like: highest PGA z = 21.5 at layer 12 (CCR-1)")
    assert "Collapse zone under CCR-1: layers 20–23" in text
    assert "lowest z = -25.0 at layer 22" in text
    assert "CCR-5 restores positive z in all 4 layers" in text
    assert "CCR-10 restores positive z in all 4 layers" in text
    assert "Final layer (final): z = 15.0 under CCR-1" in text and "recovers" in text
    (f,) = pga_findings(df)
    assert f.primary == "ccr=1" and f.higher == ("ccr=5", "ccr=10")
    assert [zn.layers for zn in f.zones] == [("20", "21", "22", "23")]


def test_describe_pga_positive_curve_says_no_collapse():
    df = frame(pga_rows("big", {1: positive_curve(), 5: positive_curve() + 1}))
    lines = describe_pga(df)
    text = "\n".join(lines)
    assert "No collapse zone" in text and "Collapse zone under" not in text
    assert "z is positive in every layer under CCR-1" in text
    (f,) = pga_findings(df)
    assert f.zones == () and f.all_positive


def test_describe_pga_rules_edges():
    z = positive_curve()
    # a single non-final layer after the peak below -2 is a zone on its own
    strong = z.copy()
    strong[25] = -5.0
    (f,) = pga_findings(frame(pga_rows("m", {1: strong})))
    assert [zn.layers for zn in f.zones] == [("25",)]
    # a single weak dip is not
    weak = z.copy()
    weak[25] = -0.5
    lines = describe_pga(frame(pga_rows("m", {1: weak})))
    assert pga_findings(frame(pga_rows("m", {1: weak})))[0].zones == ()
    assert any("isolated weak dip below 0 at layer 25" in s for s in lines)
    # negative layers before the peak are no collapse zone
    early = z.copy()
    early[1:4] = -3.0
    assert pga_findings(frame(pga_rows("m", {1: early})))[0].zones == ()
    # a negative final layer is not part of a zone
    fin = z.copy()
    fin[-2:] = [-1.0, -9.0]
    assert pga_findings(frame(pga_rows("m", {1: fin})))[0].zones == ()
    # partial restoration by CCR-5
    c = collapse_curve()
    c5 = np.abs(c) + 1
    c5[22:24] = [-1.0, -0.5]
    text = "\n".join(describe_pga(frame(pga_rows("m", {1: c, 5: c5}))))
    assert "CCR-5 restores positive z in 2 of 4 layers (still <= 0 at layers 22 and 23)" in text
    # no CCR-1 present: the smallest ccr > 0 is the primary setting
    (f,) = pga_findings(frame(pga_rows("m", {0: c, 5: np.abs(c) + 1})))
    assert f.primary == "ccr=5" and f.zones == ()


def test_describe_pga_several_models_and_sub_settings():
    df = frame(pga_rows("small", {1: collapse_curve(), 5: np.abs(collapse_curve())})
               + pga_rows("large", {1: positive_curve()}, setting_suffix=",readout=raw"))
    lines = describe_pga(df)
    starts = [s.split(":")[0] for s in lines if s.startswith(("small:", "large:"))]
    assert starts == ["small", "large"]
    assert sum("Collapse zone" in s for s in lines) == 1
    assert describe_pga(frame([])) == []


def test_other_readings(table):
    r = reading.describe(table)
    assert set(r) == {"pga", "pc1", "spectral", "logit_lens", "dispersion", "probes"}
    assert all(r.values())
    pc1 = "\n".join(r["pc1"])
    assert "below the baseline at layers 20–23" in pc1
    assert "In the PGA collapse zone the share is at most 0.05" in pc1
    assert any(s.startswith("RankMe: lowest 50.0 at layer 0, highest 200 at layer final") for s in
               r["spectral"])
    assert any("first reaches 50 % at layer 22" in s for s in r["logit_lens"])
    assert any("Spearman r of dispersion and perplexity (level=group): strongest" in s
               for s in r["dispersion"])
    assert any("Best probe accuracy (labels=domain): 0.9 [0.86, 0.94] at layer 14" in s
               and "majority baseline 0.25" in s for s in r["probes"])
    assert reading.describe(frame([])) == {k: [] for k in r}


def test_number_and_layer_formatting():
    assert [report_html.fmt_duration(s) for s in (12.34, 59.96, 87.75, 119.6, 3599.8, 7260)] == [
        "12.3 s", "1 min 00 s", "1 min 28 s", "2 min 00 s", "1 h 00 min", "2 h 01 min"]
    assert [fmt_num(x) for x in (0.0, 0.0099, 0.17361, 2.345, -31.84, 123.4, 2.5e6, math.nan)] == [
        "0", "0.0099", "0.174", "2.35", "-31.8", "123", "2.50e+06", "n/a"]
    assert layers_phrase(["20", "21", "22", "23"]) == "layers 20–23"
    assert layers_phrase(["5"]) == "layer 5"
    assert layers_phrase(["29", "30", "final"]) == "layers 29, 30 and final"


# --------------------------------------------------------------------------- HTML


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


def test_user_strings_are_escaped(tmp_path):
    df = frame(pga_rows(XSS, {1: positive_curve()}, setting_suffix=f",label={XSS_IMG}"))
    manifest = {
        "models": [XSS], "texts": XSS_IMG, "command": f"lmgeom analyze --model '{XSS}'",
        "settings": {"labels": XSS, XSS: "key is hostile too"},
        "versions": {"lmgeom": XSS_IMG}, "signature": "\"><script>alert(3)</script>",
    }
    path = write_report(tmp_path, df, manifest, title=XSS)
    page = path.read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert "<img src=x" not in page
    assert "onerror=" not in page.replace("onerror=&quot;", "")
    assert _html.escape(XSS) in page
    assert _html.escape(XSS_IMG) in page
    doc = parse(path)
    assert not any(t == "script" for t, _ in doc.tags)
    assert all(not k.startswith("on") for _, a in doc.tags for k in a)
    # the text reads back as the original strings
    text = "".join(doc.text)
    assert XSS in text and XSS_IMG in text
    # the linked SVG files are inert too
    for svg in (tmp_path / "plots").glob("*.svg"):
        s = svg.read_text(encoding="utf-8")
        assert "<script" not in s and "<img" not in s


# --------------------------------------------------------------------------- a real browser



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
