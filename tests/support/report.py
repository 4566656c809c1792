"""Helpers and fixtures shared by tests/unit/test_report.py and tests/e2e/test_report_e2e.py."""

from __future__ import annotations

import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmgeom.report import plots
from lmgeom.results.table import frame, row

L = 30  # blocks of the synthetic model


LABELS = [str(i) for i in range(L + 1)] + ["final"]  # 32 points on the layer axis


N_LAYERS = len(LABELS)


XSS = "<script>alert(1)</script>"


XSS_IMG = '<img src=x onerror="window.__xss=2">'


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


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return full_table()


class Doc(HTMLParser):
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


def parse(path: Path) -> Doc:
    d = Doc()
    d.feed(path.read_text(encoding="utf-8"))
    return d


PLOT_FUNCS = [plots.plot_pga, plots.plot_pc1, plots.plot_spectral, plots.plot_logit_lens,
              plots.plot_dispersion, plots.plot_probes]

