"""The documentation site: built from docs/ with warnings as errors (nitpicky: a reference to a
name that does not exist, a broken link or a missing page fails), complete (every public name,
every command and option), and working offline in a real headless Chromium."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CHROME_ARGS, CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ("getting-started", "concepts", "tour", "claims", "python-api", "own-data", "monitoring",
         "commands", "caching",
         "outputs", "checkpoints", "cluster", "checks", "METHODS", "design", "api/index")

pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install -e '.[docs]')")
sys.path.insert(0, str(DOCS / "_ext"))
from apigen import PACKAGES, public_names  # what the reference documents: one list


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``make docs``'s build (``-n -W --keep-going``) into a fresh folder."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q",
         "-d", str(out / ".doctrees"), str(DOCS), str(out / "html")],
        check=False, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"sphinx-build -W failed:\n{proc.stderr[-6000:]}"
    assert proc.stderr.strip() == "", proc.stderr[-4000:]
    return out / "html"


def test_every_page_is_built_and_reachable_from_the_index(site):
    index = (site / "index.html").read_text()
    for page in PAGES:
        assert (site / f"{page}.html").is_file(), page
        assert f'href="{page}.html' in index, f"{page} is not linked from the index"


def test_the_api_reference_documents_every_public_name(site):
    import lmgeom

    html = "".join(p.read_text() for p in (site / "api").rglob("*.html"))
    ids = set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', html))
    ids |= {m[len("module-"):] for m in re.findall(r'id="(module-[^"]+)"', html)}
    missing = []
    for pkg in PACKAGES:
        module = importlib.import_module(f"lmgeom.{pkg}")
        names = public_names(module)  # lmgeom.errors has no __all__: what it defines
        assert names, pkg
        missing += [f"lmgeom.{pkg}.{n}" for n in names if f"lmgeom.{pkg}.{n}" not in ids]
    assert missing == []
    # the top level: each lazy name links to the entry of the object it is, on its package's page
    top = (site / "api" / "generated" / "lmgeom.html").read_text()
    links = set(re.findall(r'href="([a-z_]+)\.html#([^"]+)"', top))
    for name in lmgeom.__all__:
        if name == "__version__":
            assert 'id="lmgeom.__version__"' in top
            continue
        obj = getattr(lmgeom, name)
        owner = obj.__name__ if inspect.ismodule(obj) else next(
            f"lmgeom.{p}" for p in PACKAGES if getattr(importlib.import_module(f"lmgeom.{p}"),
                                                       name, None) is obj)
        target = f"module-{owner}" if inspect.ismodule(obj) else f"{owner}.{name}"
        page = owner.rsplit(".", 1)[1]
        assert (page, target) in links, f"lmgeom.{name} does not link to {page}.html#{target}"
        assert target in ids or target.startswith("module-"), target


def test_the_commands_reference_is_the_parser(site):
    """Every subcommand and every option string of ``lmgeom``'s parser is on the page."""
    from lmgeom.cli import build_parser

    page = (site / "commands.html").read_text()
    text = re.sub(r"<[^>]+>", "", page).replace("&#8212;", "--").replace("&#x2014;", "--")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 17
    for name, cmd in sub.choices.items():
        assert f"lmgeom {name}" in text, name
        for action in cmd._actions:
            for opt in action.option_strings:
                assert opt in text, f"{name} {opt}"




def _serve(folder: Path):
    """The site over http on localhost (what ``python -m http.server -d docs/_build/html``
    does): a thread, stopped by the caller."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _search(page, start: str, query: str = "subspace_pga") -> list[str]:
    """Type a query into the theme's search field (opened with Ctrl+K) and return the hits."""
    page.goto(start, wait_until="load", timeout=60_000)
    page.keyboard.press("Control+k")
    box = page.locator("input[name=q]:visible").first
    box.fill(query)
    box.press("Enter")
    page.wait_for_url(f"**/search.html?q={query}*", timeout=60_000)
    page.wait_for_selector("#search-results li", timeout=60_000)
    return page.locator("#search-results li a").all_inner_texts()


#: JS: for each table of the page's article, how far its content reaches past what its box
#: shows (px; > 0: columns hidden behind a scroll bar)
HIDDEN_TABLE_PX = """() => Array.from(document.querySelectorAll('.bd-article table')).map(
    t => t.scrollWidth - t.parentElement.clientWidth)"""

#: JS: the links the visible left sidebar holds (-1: no visible left sidebar)
SIDEBAR_LINKS = """() => { const s = document.querySelector('.bd-sidebar-primary');
    if (!s || s.getBoundingClientRect().width < 2) return -1;
    return s.querySelectorAll('nav a').length; }"""


@pytest.mark.browser
def test_site_in_headless_chromium_offline(site):
    """Served from localhost, the index and the API reference load with no console error and no
    request leaving the machine (no CDN), and the search box finds a function. Opened as files
    (file://), search finds it too; only the result snippets are missing there, because the
    browser refuses the page fetches they come from (a file:// origin is ``null``)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("python package 'playwright' is not installed (pip install playwright)")
    if CHROMIUM is None:
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium; make browser)")
    errors: list[str] = []
    requests: list[str] = []
    missing: list[str] = []
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS,
                                         timeout=60_000)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("request", lambda r: requests.append(r.url))
                page.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
                page.goto(f"{base}/index.html", wait_until="load", timeout=60_000)
                assert "lmgeom" in page.title()
                page.goto(f"{base}/api/generated/metrics.html", wait_until="load")
                assert page.locator('[id="lmgeom.metrics.subspace_pga"]').count() == 1
                hits = _search(page, f"{base}/index.html")
                page.wait_for_selector("#search-results li p.context", timeout=60_000)
                # user pages rank before the API reference
                _search(page, f"{base}/index.html", "dispersion")
                first = page.locator("#search-results li a").first.get_attribute("href")
                # wide tables show every column at 1280 px; the left sidebar is useful or gone
                hidden, sidebars = {}, {}
                for name in ("getting-started", "checks", "claims", "tour"):
                    page.goto(f"{base}/{name}.html", wait_until="load")
                    hidden[name] = [px for px in page.evaluate(HIDDEN_TABLE_PX) if px > 2]
                    sidebars[name] = page.evaluate(SIDEBAR_LINKS)
                served_errors = list(errors)
                file_hits = _search(browser.new_page(), (site / "index.html").as_uri())
            finally:
                browser.close()
    finally:
        server.shutdown()
    # pydata-sphinx-theme logs one console.error when no theme mode is stored yet (a fresh
    # browser profile): not a fault of the page
    served_errors = [e for e in served_errors if not e.startswith("Got invalid theme mode")]
    assert missing == []
    assert served_errors == []
    assert any("subspace_pga" in h for h in hits), hits
    assert any("subspace_pga" in h for h in file_hits), file_hits
    assert first is not None and not first.startswith(("api/", "/api/")), first
    assert all(not v for v in hidden.values()), f"columns hidden at 1280 px: {hidden}"
    assert all(v != 0 for v in sidebars.values()), f"an empty left sidebar: {sidebars}"
    outside = [u for u in requests if not u.startswith((base, "file:", "data:"))]
    assert outside == []
