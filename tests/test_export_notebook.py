"""An executed notebook keeps its figures outside Jupyter: converted to HTML by nbconvert it shows
every figure (and the player's still) offline, with plotly.js inside the page, not from a CDN, and
the executed notebook stays small enough to commit."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_dag_decoding.ipynb"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # widget state off, as `jupyter nbconvert --execute --ExecutePreprocessor.store_widget_state=False`:
    # stored, it is megabytes of widget code for a widget manager nbconvert fetches from a CDN
    NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    out = tmp_path_factory.mktemp("nb")
    path = out / NOTEBOOK.name
    nbformat.write(nb, path)
    body, _ = HTMLExporter().from_notebook_node(nb)
    (out / "page.html").write_text(body)
    return nb, path, out / "page.html"


def figure_outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})
            or "application/vnd.jupyter.widget-view+json" in o.get("data", {})]


def test_every_figure_carries_an_offline_copy_and_plotly_js_once(executed):
    nb, path, page = executed
    figs = figure_outputs(nb)
    assert len(figs) >= 3                                          # two DAG figures and the player
    html = [o["data"]["text/html"] for o in figs]
    assert all("speclab-offline-figure" in h for h in html)        # a self-contained copy beside each
    assert sum("DecompressionStream" in h for h in html) == 1      # plotly.js once per notebook
    assert not any(re.search(r"<script[^>]+src=", h) for h in html)  # no script fetched by a figure
    assert path.stat().st_size < 4 * 2**20                        # small enough to commit
    text = page.read_text()
    # nbconvert shows the copies (it has no plotly renderer) with their data: a strategy's output
    assert text.count('class="speclab-offline-figure"') == len(figs)
    assert "march 2024" in text and "four hundred five" in text and "a still of the player" in text
    assert not re.search(r"<script[^>]+src=\"https?://[^\"]*(plot\.ly|plotly|jsdelivr|unpkg)", text)


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing")
def test_the_converted_page_draws_every_figure_with_the_network_off(executed):
    sync_api = pytest.importorskip("playwright.sync_api")
    _, _, page_file = executed
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            blocked = []
            page.route("http*://**", lambda route: (blocked.append(route.request.url), route.abort()))
            page.goto(page_file.as_uri())
            n = page.locator(".speclab-offline-figure").count()
            page.wait_for_function(f"() => document.querySelectorAll('.speclab-offline-figure .main-svg').length >= {n}",
                                   timeout=60_000)
            assert n >= 3
            assert page.locator(".speclab-offline-figure .main-svg").count() >= n
            # what the page tried to fetch is nbconvert's own (require.js, MathJax), never a figure's
            assert not any(re.search(r"plot\.ly|plotly|jsdelivr|unpkg", u) for u in blocked), blocked
        finally:
            browser.close()
