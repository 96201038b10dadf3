"""The Jupyter player: step through a run with Play and a slider; the figure updates in place.

    view = speclab.widgets.show(result)   # a Result, a Trace, or the path of a saved trace
    view.update(3)                        # what moving the slider to step 3 does (testable)

One `go.FigureWidget` (token strip over draft tree, the diffusion canvas, or the DAG) is created
once and updated in a `batch_update` per step, so the page never re-renders the whole figure. Under
it: a detail panel for the step, the whole run as a strip (tokens per round for speculative
runs, confidence bands for diffusion runs) whose "current" marker follows the step, and, folded,
the attention mask the step's forward used (figures.mask).
No model is needed: everything comes from the trace.
"""
from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

from speclab.figures import move_current, n_steps, run_strip, step_dict, step_label, step_title, update_step
from speclab.figures.compose import update_figure
from speclab.figures.detail import detail_html
from speclab.figures.mask import mask_dict
from speclab.figures.offline import keep_figures, offline_html
from speclab.trace import Trace

WIDTH = 960         # px: a JupyterLab output area at its default width


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
        # a set width: unset, JupyterLab drew the widget at plotly's 700 px default and clipped long titles
        self.figure = go.FigureWidget(step_dict(trace, 0))
        self.figure.layout.width = WIDTH
        self.detail = widgets.HTML(detail_html(trace, 0))
        strip = run_strip(trace, 0)
        self.strip = go.FigureWidget(strip) if strip is not None else None
        if self.strip is not None:
            self.strip.layout.width = WIDTH
        # the attention mask the step's forward used, folded away until asked for (not for a DAG)
        self.mask = None
        if trace.engine in ("speculative", "diffusion"):
            self.mask = go.FigureWidget(mask_dict(trace, 0))
            self.mask.layout.width = WIDTH
        self.step = 0
        self.slider.observe(lambda change: self.update(change["new"]), names="value")
        parts = [widgets.HBox([self.play, self.slider, self.label]), self.figure, self.detail]
        parts += [self.strip] if self.strip is not None else []
        if self.mask is not None:
            fold = widgets.Accordion(children=[self.mask], selected_index=None)
            fold.set_title(0, "attention mask of this step")
            parts.append(fold)
        super().__init__(parts)

    def _repr_mimebundle_(self, **kwargs):
        """The widget for Jupyter, and for nbconvert and notebook viewers (no widget runs there) a
        self-contained copy of the step figure, the detail and the strip at the current step."""
        bundle = super()._repr_mimebundle_(**kwargs)
        figs = [self.figure] + ([self.strip] if self.strip is not None else [])
        note = (f"{self.label.value}: a still of the player (run the notebook in Jupyter to step through "
                f"the {n_steps(self.trace)} steps)")
        bundle["text/html"] = offline_html(*figs[:1], note=note) + self.detail.value + offline_html(*figs[1:])
        return bundle

    def update(self, step: int) -> None:
        """Show `step`: the slider calls this; so can a test or a notebook cell."""
        update_step(self.figure, self.trace, step)
        if self.strip is not None:
            move_current(self.strip, step)
        if self.mask is not None:
            update_figure(self.mask, mask_dict(self.trace, step))
        self.detail.value = detail_html(self.trace, step)
        self.label.value = step_title(self.trace, step)
        self.step = step
        if self.slider.value != step:
            self.slider.value = step


def show(trace_or_result, interval_ms: int = 900) -> Player:
    """An ipywidgets view of a run: display it (last expression of a cell) to step through."""
    return Player(as_trace(trace_or_result), interval_ms)
