"""The dashboard's Categories tab: which tasks speculation helps, from a category bench's JSON.

Nothing decodes here: a category bench takes minutes a method (speclab/bench/categories.py), so the
tab draws a saved one (`speclab bench --categories --json FILE`): the newest committed under
benchmarks/ when the page runs from a checkout, or any such file opened with the upload box. The
figure is speclab.figures.categories.category_figure; the table beside it is the bench's own.
"""
from __future__ import annotations

import json
from pathlib import Path

import panel as pn

from speclab.bench.categories import markdown
from speclab.figures.categories import category_figure

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
EXPLAIN = (
    "How much each method speeds decoding up depends on the task: drafts that copy from the prompt "
    "(prompt lookup, suffix) win where the answer repeats the prompt (extraction, summarising, code "
    "edits), a trained draft where the target is predictable. Each category is 8 hand-written prompts "
    "(speclab/prompts/category-*.jsonl); speed-up is against `ar` on the same category's prompts, tau = "
    "new tokens / target forwards, alpha = accepted / drafted tokens. Made by "
    "`speclab bench --categories --json FILE`; open another such file below.")


def newest_bench(folder: Path = BENCHMARKS) -> Path | None:
    """The newest committed category bench (its file name starts with its date), None outside a checkout."""
    found = sorted(folder.glob("*-categories*.json")) if folder.is_dir() else []
    return found[-1] if found else None


def rows_of(data: dict) -> list[dict]:
    """A bench JSON's category rows; ValueError in one line for one run without --categories."""
    if not isinstance(data, dict) or not data.get("categories"):
        raise ValueError("this JSON holds no category rows: make one with `speclab bench --categories --json FILE`")
    return data["categories"]


class CategoriesPanel:
    def __init__(self, path: Path | None = None):
        self.upload = pn.widgets.FileInput(accept=".json", multiple=False, css_classes=["speclab-categories-upload"])
        self.note = pn.pane.Markdown("", css_classes=["speclab-categories-note"], sizing_mode="stretch_width")
        self.chart = pn.pane.Plotly(None, css_classes=["speclab-categories-chart"], sizing_mode="stretch_width")
        self.table = pn.pane.Markdown("", css_classes=["speclab-categories-table"], sizing_mode="stretch_width")
        self.upload.param.watch(self._opened, "value")
        path = path or newest_bench()
        if path is None:
            self.note.object = "No category bench here: run `speclab bench --categories --json FILE` and open it."
        else:
            self.show(json.loads(Path(path).read_text()), Path(path).name)

    def show(self, data: dict, name: str) -> None:
        try:
            rows = rows_of(data)
            fig = category_figure(rows, data.get("baseline", "ar"))
        except (ValueError, KeyError, TypeError) as e:
            self.note.object = f"**{name}**: {e}"
            return
        self.chart.object = fig
        self.table.object = markdown(rows)
        self.note.object = (f"**{name}**: {data.get('prompts', '?')} prompts per category x "
                            f"{data.get('max_new_tokens', '?')} new tokens, {data.get('dtype', '?')}, "
                            f"temperature {data.get('temperature', 0)}. Cells: speed-up / tau / alpha.")

    def _opened(self, event) -> None:
        if not event.new:
            return
        name = self.upload.filename or "upload"
        try:
            data = json.loads(event.new)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            self.note.object = f"**{name}** is not JSON ({e})"
            return
        self.show(data, name)

    def column(self) -> pn.Column:
        return pn.Column(EXPLAIN, self.note, self.chart, self.table,
                         "Open another category bench (JSON):", self.upload, sizing_mode="stretch_width")
