"""The Jupyter player: step through a run with Play and a slider; the figure updates in place.

    view = speclab.widgets.show(result)   # a Result, a Trace, or the path of a saved trace
    view.update(3)                        # what moving the slider to step 3 does (testable)

One `go.FigureWidget` (token strip over draft tree, the diffusion canvas, or the DAG) is created
once and updated in a `batch_update` per step, so the page never re-renders the whole figure. Under
it: a detail panel for the step and the whole run as a strip (tokens per round for speculative
runs, confidence bands for diffusion runs) whose "current" marker follows the step.
No model is needed: everything comes from the trace.
"""
from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

from speclab.figures import n_steps, run_strip, step_dict, step_label, step_title
from speclab.trace import Trace
from speclab.widgets.detail import detail_html

LAYOUT_KEYS = ("title", "annotations", "xaxis", "yaxis", "xaxis2", "yaxis2", "meta")


def as_trace(obj) -> Trace:
    """A Trace from a Trace, a Result (anything with .trace), a saved trace's path, or its dict."""
    if isinstance(obj, Trace):
        return obj
    if isinstance(getattr(obj, "trace", None), Trace):
        return obj.trace
    if isinstance(obj, (str, Path)):
        return Trace.load(obj)
    if isinstance(obj, dict):
        return Trace.from_dict(obj)
    raise TypeError(f"show() takes a Trace, a Result, a trace file path or a trace dict, got {type(obj).__name__}")


class Player(widgets.VBox):
    """Play + slider (its own readout off: `label` says "round 3 of 20", numbered like every title),
    the step figure, the detail panel and the summary strip."""

    def __init__(self, trace: Trace, interval_ms: int = 900):
        self.trace = trace
        n = n_steps(trace)
        if not n:
            raise ValueError("this trace has no steps to show")
        label = step_label(trace)
        self.play = widgets.Play(value=0, min=0, max=n - 1, interval=interval_ms, description="play")
        self.slider = widgets.IntSlider(value=0, min=0, max=n - 1, description=label, readout=False,
                                        layout=widgets.Layout(width="60%"))
        self.label = widgets.Label(step_title(trace, 0))
        widgets.jslink((self.play, "value"), (self.slider, "value"))   # in the browser, no kernel round trip
        self.figure = go.FigureWidget(step_dict(trace, 0))
        self.detail = widgets.HTML(detail_html(trace, 0))
        strip = run_strip(trace, 0)
        self.strip = go.FigureWidget(strip) if strip is not None else None
        self.step = 0
        self.slider.observe(lambda change: self.update(change["new"]), names="value")
        parts = [widgets.HBox([self.play, self.slider, self.label]), self.figure, self.detail]
        super().__init__(parts + ([self.strip] if self.strip is not None else []))

    def update(self, step: int) -> None:
        """Show `step`: the slider calls this; so can a test or a notebook cell."""
        d = step_dict(self.trace, step, static=False)     # None for traces no step changes
        with self.figure.batch_update():
            if len(d["data"]) == len(self.figure.data):
                for old, new in zip(self.figure.data, d["data"]):
                    if new is not None:
                        old.update({k: v for k, v in new.items() if k != "type"}, overwrite=True)
            else:   # never for the figures shipped here (fixed trace counts), kept for custom ones
                self.figure.data = []
                self.figure.add_traces(step_dict(self.trace, step)["data"])
            self.figure.layout.update({k: d["layout"][k] for k in LAYOUT_KEYS if k in d["layout"]})
        if self.strip is not None:
            with self.strip.batch_update():
                # the strip's "current" marker, wherever that figure puts it for this step
                mark = next(t for t in run_strip(self.trace, step).data if t.name == "current")
                self.strip.update_traces(dict(x=mark.x, y=mark.y), selector=dict(name="current"))
        self.detail.value = detail_html(self.trace, step)
        self.label.value = step_title(self.trace, step)
        self.step = step
        if self.slider.value != step:
            self.slider.value = step


def show(trace_or_result, interval_ms: int = 900) -> Player:
    """An ipywidgets view of a run: display it (last expression of a cell) to step through."""
    return Player(as_trace(trace_or_result), interval_ms)
