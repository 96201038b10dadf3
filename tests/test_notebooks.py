"""The notebook tour: its shape (badge, install cell, stripped outputs) and a full run of each.

The full runs execute every notebook with nbmake in a subprocess (a fresh kernel, as CI and a
reader get), so `make test` covers `pytest --nbmake notebooks/` with no extra Makefile line.
Run one by hand with: .venv/bin/python -m pytest --nbmake notebooks/01_speculative_sampling.ipynb
"""
from __future__ import annotations

import json
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
    assert "try:\n    import speclab\nexcept ImportError:" in install.source and "%pip install" in install.source
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "commit notebooks with outputs stripped"
    # nbformat 4.5 cells carry ids (a missing one is a warning now, an error in later nbformat)
    ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]
    assert None not in ids and len(set(ids)) == len(ids), "give every cell a unique id"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_end_to_end(path):
    done = subprocess.run([sys.executable, "-m", "pytest", "--nbmake", "-q", "-p", "no:cacheprovider", str(path)],
                          cwd=path.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
