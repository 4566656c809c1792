"""Tests of the report layer: plots, readings, the HTML page, and the page in a real Chromium."""

from __future__ import annotations

import html as _html
import math

import numpy as np
from support.report import (
    LABELS,
    PLOT_FUNCS,
    XSS,
    XSS_IMG,
    collapse_curve,
    parse,
    pga_rows,
    positive_curve,
    table,  # noqa: F401 (a fixture)
)

from lmgeom.metrics.regime import pga_findings
from lmgeom.report import html as report_html
from lmgeom.report import plots, reading
from lmgeom.report.html import write_report
from lmgeom.report.reading import describe_pga, fmt_num, layers_phrase
from lmgeom.results.table import frame, row


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



def test_header_shows_model_facts_not_a_raw_dict(tmp_path):
    """A manifest whose models are dicts (analyze's) gives the header a table of model facts
    (name, family, width, blocks, dtype, k, weights hash); the host and pid are not in the
    header (they stay in the settings table below)."""
    df = frame(pga_rows("toy-30", {1: positive_curve()}))
    info = {"name": "toy-30", "model_type": "llama", "width": 576, "n_blocks": 30,
            "dtype": "float32", "k": 100, "weights_sha256": "ab" * 32, "host": "box-17",
            "pid": 4242}
    page = write_report(tmp_path, df, {"command": "analyze", "models": [info]}).read_text()
    header = page.split('<header class="top">', 1)[1].split("</header>", 1)[0]
    facts = header.split('id="table-models"', 1)[1].split("</table>", 1)[0]
    for want in ("toy-30", "llama", "576", "30", "float32", "100", "abababababababab"):
        assert f">{want}<" in facts
    assert "box-17" not in header and "4242" not in header and "{" not in header


def test_the_pga_table_has_a_how_to_read_box(tmp_path):
    """Beside the first z table of every report: how to read z, the null band, CCR and the
    LOW SAMPLE mark (issue 49); a report without PGA rows has no such box."""
    page = write_report(tmp_path / "a", frame(pga_rows("toy-30", {1: positive_curve()})),
                        {"command": "analyze"}).read_text()
    pga = page.split('id="section-pga"', 1)[1].split("</section>", 1)[0]
    box = pga.split('id="how-to-read-z"', 1)[1].split("</aside>", 1)[0]
    assert pga.index('id="table-pga"') < pga.index('id="how-to-read-z"')
    for words in ("null band", "CCR-m", "marked *", "random"):
        assert words in box
    other = frame([row(model="m", layer="", metric="dispersion", value=0.4)])
    assert "how-to-read-z" not in write_report(tmp_path / "b", other, {}).read_text()


def test_each_claim_row_names_the_paper_it_tests():
    """Every row of the claims report's verdict table cites its paper (P: Xu 2026, D: Li et
    al. 2025), as plain text: the report links nowhere outside (issue 49)."""
    import pandas as pd

    from lmgeom.report.claims import verdict_table

    df = pd.DataFrame([{"claim": c, "statement": "s", "verdict": "supported", "direction": ">",
                        "threshold": 0.0, "models": "m", "quantity": "q", "estimate": 1.0,
                        "ci_low": 0.5, "ci_high": 1.5, "reason": "r"}
                       for c in ("P2", "P2.zone", "D1.token")])
    page = verdict_table(df)
    rows = page.split("<tbody>", 1)[1].split("</tr>")[:3]
    assert "arXiv:2605.17084" in rows[0] and "arXiv:2605.17084" in rows[1]
    assert "arXiv:2506.24106" in rows[2] and "://" not in page
