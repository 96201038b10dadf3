"""The notebook tour: its shape (badge, install cell, stripped outputs) and a full run of each.

The full runs execute every notebook once in a subprocess (a fresh kernel, as CI and a reader get:
`jupyter nbconvert --execute`, what nbmake does) and convert the saved copy to HTML, where every
figure must show offline. Run one by hand with:
.venv/bin/python -m pytest --nbmake notebooks/01_speculative_sampling.ipynb
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]


def test_the_tour_is_there():
    names = {p.name[:2] for p in NOTEBOOKS}
    assert {"01", "02", "03", "04", "05"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_how_to_run_install_cell_and_stripped_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    first, install = nb.cells[0], nb.cells[1]
    # no badge to a repository address the project does not have: the first cell says how to run it
    assert first.cell_type == "markdown" and "SPECLAB_SOURCE" in first.source and "colab-badge" not in first.source
    assert install.cell_type == "code" and install.source.startswith("#")
    # the same install cell everywhere: Colab-aware, never replacing a torch that is there (tests/test_wheel.py runs it)
    assert 'if importlib.util.find_spec("speclab") is None:' in install.source and "%pip install" in install.source
    assert "keep_figures()" in install.source               # every figure keeps an offline copy (nbconvert)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "commit notebooks with outputs stripped"
    # nbformat 4.5 cells carry ids (a missing one is a warning now, an error in later nbformat)
    ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]
    assert None not in ids and len(set(ids)) == len(ids), "give every cell a unique id"


def figure_outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "application/vnd.plotly.v1+json" in o.get("data", {})
            or "application/vnd.jupyter.widget-view+json" in o.get("data", {})]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_end_to_end_and_keeps_its_figures_offline(path, tmp_path):
    """One run per notebook in a fresh kernel (a subprocess, as CI and a reader get; widget state not
    stored), then nbconvert's HTML of the saved copy, not a second run: every figure and widget
    output carries its self-contained copy and the page shows them all, plotly.js inside the page,
    no figure script from a CDN, so the figures show with the network off."""
    from nbconvert import HTMLExporter
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "--ExecutePreprocessor.timeout=600", "--ExecutePreprocessor.store_widget_state=False",
                           "--output-dir", str(tmp_path), "--output", path.stem, str(path)],
                          cwd=path.parent, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    nb = nbformat.read(tmp_path / path.name, as_version=4)
    figs = figure_outputs(nb)
    assert figs, f"{path.name} shows no figure"
    bare = [i for i, o in enumerate(figs) if "speclab-offline-figure" not in o.get("data", {}).get("text/html", "")]
    assert not bare, f"{path.name}: figure outputs {bare} of {len(figs)} have no offline copy (keep_figures?)"
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert page.count('class="speclab-offline-figure"') >= len(figs)
    assert "DecompressionStream" in page                     # plotly.js carried in the page, once a kernel
    assert not re.search(r"<script[^>]+src=\"https?://[^\"]*(plot\.ly|plotly)", page)
