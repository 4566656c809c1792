"""Tests of :func:`lmgeom.report.plots.plot_pga_by_layer`: Subspace PGA z per layer drawn from
results computed on arrays in hand (docs/own-data.md), with no results table."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from PIL import Image

from lmgeom import metrics as M
from lmgeom.errors import ConfigError
from lmgeom.report import plots

LAYERS = ("0", "5", "final")


@pytest.fixture(scope="module")
def results():
    """Per layer the {m: PGAResult} of subspace_pga_levels at CCR 0 and 1, on random states."""
    rng = np.random.default_rng(0)
    basis = M.readout_basis(rng.standard_normal((50, 16)), k=4)
    return {layer: M.subspace_pga_levels(rng.standard_normal((20, 16)) + i, basis, ccr=(0, 1),
                                         n_null=20, seed=0, warn=False)
            for i, layer in enumerate(LAYERS)}


@pytest.fixture
def figures(monkeypatch):
    """The figures the helper saves (it still writes the files)."""
    seen = []
    save = plots.save_figure

    def spy(fig, out_dir, stem):
        seen.append(fig)
        return save(fig, out_dir, stem)

    monkeypatch.setattr(plots, "save_figure", spy)
    return seen


def test_writes_png_and_svg_of_the_house_size(tmp_path, results):
    paths = plots.plot_pga_by_layer(results, tmp_path / "plots", model="toy")
    assert paths == [tmp_path / "plots" / "pga.png", tmp_path / "plots" / "pga.svg"]
    with Image.open(paths[0]) as img:
        assert img.format == "PNG"
        # one panel: 9.0 x (2.9 + 0.6) inches at the plots' DPI
        assert img.size == (round(9.0 * plots.DPI), round(3.5 * plots.DPI))
        pixels = np.asarray(img.convert("L"))
    assert pixels.min() < 100 and pixels.max() == 255  # drawn lines on a white background
    assert paths[1].read_text().lstrip().startswith("<?xml")
    assert plots.plot_pga_by_layer(results, tmp_path, "other")[0].name == "other.png"


def test_axes_hold_one_line_per_ccr_level_with_its_null_band(tmp_path, results, figures):
    plots.plot_pga_by_layer(results, tmp_path, model="toy", title="my states")
    (fig,) = figures
    (ax,) = fig.axes
    assert fig.get_suptitle() == "my states"
    assert ax.get_title(loc="left") == "toy"
    assert ax.get_ylabel() == "PGA z" and ax.get_xlabel() == "layer"
    # integer labels at their position, "final" one step after the last one
    assert [t.get_text() for t in ax.get_xticklabels()] == list(LAYERS)
    assert list(ax.get_xticks()) == [0, 5, 6]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert set(lines) == {"CCR-0", "CCR-1"}
    for m in (0, 1):
        x, y = lines[f"CCR-{m}"].get_data()
        assert list(x) == [0, 5, 6]
        np.testing.assert_allclose(y, [results[layer][m].z for layer in LAYERS])
    # the zero line and one shaded null band per level, spanning its null_z_low..null_z_high
    assert any(list(ln.get_ydata()) == [0, 0] for ln in ax.get_lines())
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    low = min(results[layer][m].null_z_low for layer in LAYERS for m in (0, 1))
    high = max(results[layer][m].null_z_high for layer in LAYERS for m in (0, 1))
    ys = np.concatenate([p.vertices[:, 1] for c in bands for p in c.get_paths()])
    assert ys.min() == pytest.approx(low) and ys.max() == pytest.approx(high)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["CCR-0", "CCR-1",
                                                                   "null central 95 %"]


def test_single_results_and_lists_are_accepted(tmp_path, results, figures):
    one = {layer: res[1] for layer, res in results.items()}
    plots.plot_pga_by_layer(one, tmp_path, "one")
    both = {int(k) if k.isdecimal() else k: list(v.values()) for k, v in results.items()}
    plots.plot_pga_by_layer(both, tmp_path, "both")
    labels = [{ln.get_label() for ln in fig.axes[0].get_lines()
               if not ln.get_label().startswith("_")} for fig in figures]
    assert labels == [{"CCR-1"}, {"CCR-0", "CCR-1"}]
    assert (tmp_path / "one.png").is_file() and (tmp_path / "both.png").is_file()


@pytest.mark.parametrize("bad, match", [
    ({}, "non-empty mapping"),
    ([1.0, 2.0], "non-empty mapping"),
    ({"0": 1.5}, "expected a PGAResult"),
    ("twice", "two results for CCR-1"),
    ("order", "in their order"),
])
def test_refuses_what_it_cannot_draw(tmp_path, results, bad, match):
    if bad == "twice":
        bad = {"0": [results["0"][1], results["5"][1]]}
    elif bad == "order":
        bad = {"5": results["5"], "0": results["0"]}
    with pytest.raises(ConfigError, match=match):
        plots.plot_pga_by_layer(bad, tmp_path)
    assert list(tmp_path.iterdir()) == []
