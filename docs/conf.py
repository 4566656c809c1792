"""Sphinx configuration of the lmgeom site (``make docs`` -> docs/_build/html).

Fully offline: pydata-sphinx-theme vendors its fonts and scripts, no intersphinx (no network),
no analytics. Nitpicky: a reference to a name that does not exist is a warning, and the build
runs with ``-W`` (warnings are errors) in the test suite.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import lmgeom

project = "lmgeom"
author = "the lmgeom developers"
copyright = "2026, the lmgeom developers"
release = version = lmgeom.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
    "sphinxarg.ext",
    "apigen",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "CONTRIBUTING-helpers.md", "Thumbs.db", ".DS_Store"]

# MyST: Markdown pages, heading anchors so [text](page.md#a-heading) links resolve (and are
# checked), $...$ maths, ::: fences for directives.
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

# One docstring style throughout: Google sections (Args / Returns / Raises / Attributes), the
# style lmgeom's dataclass help (lmgeom.commands.options.field_docs) also parses.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# `make docs` installs only the docs extra: optional packages the reference imports are mocked
# where they are missing (Ray, FAISS, PEFT), so every page builds from a fresh clone.
autodoc_mock_imports = [m for m in ("ray", "faiss", "peft") if importlib.util.find_spec(m) is None]

autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_class_signature = "separated"
autodoc_preserve_defaults = True

# MathJax is the one script Sphinx would fetch from a CDN: the site is offline, so maths
# renders as its TeX source unless a local MathJax is configured (none is bundled).
mathjax_path = "about:blank"

nitpicky = True
# References into other projects' docs cannot resolve offline (no intersphinx inventories):
# external names are not checked, every lmgeom name is.
nitpick_ignore_regex = [
    (r"py:.*", (r"(numpy|np|torch|pandas|pd|pyarrow|pa|transformers|datasets|peft|ray|faiss|"
               r"matplotlib|scipy|sklearn|safetensors|tokenizers|huggingface_hub|filelock|"
               r"collections|typing|pathlib|os|argparse|logging|concurrent|dataclasses|"
               r"contextlib|enum|abc|types|io|numpy\.typing|npt)(\..*)?")),
    (r"py:class", (r"(int|float|str|bool|bytes|dict|list|tuple|set|frozenset|object|type|None|"
                  r"Path|Any|Callable|Iterable|Iterator|Sequence|Mapping|Collection|Literal|"
                  r"Optional|Union|ArrayLike|NDArray|Tensor|DataFrame|Generator|Hashable|"
                  r"TextIO|BinaryIO|PathLike|Self|ndarray|module|Module|optional)")),
]

html_theme = "pydata_sphinx_theme"
html_title = f"lmgeom {release}"
html_static_path = ["_static"]
html_favicon = "_static/lmgeom.svg"
html_logo = "_static/lmgeom.svg"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "navbar_end": ["theme-switcher", "navbar-icon-links"],
}
# the user pages rank before the API reference in the search (docs/_static/scorer.js)
html_search_scorer = str(ROOT / "docs" / "_static" / "scorer.js")
html_css_files = ["lmgeom.css"]
# the left sidebar lists a section's sub-pages: only the API reference has any, so it is shown
# there and left out elsewhere (it was an empty "Section Navigation" box on every other page)
html_sidebars = {"*": [], "api/**": ["sidebar-nav-bs"]}
html_show_sourcelink = False
html_copy_source = False
