"""The Jupyter player: step through a run with Play and a slider; the figure updates in place.

    view = speclab.widgets.show(result)   # a Result, a Trace, or the path of a saved trace
    view.update(3)                        # what moving the slider to step 3 does (testable)

What it shows is the trace's view spec (figures.views.view_of), every spec of it, the same set the
dashboard and the export show: the main step figure (token strip over draft tree, the diffusion
canvas, or the DAG), then the other step specs in order (the step's detail table, a policy's
decisions, p and q, a record's figure; the attention mask folded), the whole run as a strip (tokens
per round, confidence bands) and, folded, the summary figures (the cost model explorer and a
method's own included). Each figure is one `go.FigureWidget`, created once and moved in place per
step (`FigureSpec.follow`: redrawn in a `batch_update`, or only its "current" marker moved), so the
page never re-renders a whole figure; an "html" spec is an HTML widget whose text changes. No model
is needed: everything comes from the trace.
"""
from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

import html

from speclab.figures import go_to_step, n_steps, step_label, step_title, view_of
from speclab.figures.views import lesson_of
from speclab.figures.offline import keep_figures, offline_html
from speclab.trace import Trace, TraceError

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
    then every figure the trace's view spec (figures.views) gives it: the step figures, the detail
    panel, the run strip, and folded, the summary figures and the attention mask."""

    def __init__(self, trace: Trace, interval_ms: int = 900):
        self.trace = trace
        n = n_steps(trace)
        if not n:
            raise TraceError("this trace has no steps to show")
        self.view = view = view_of(trace)
        label = step_label(trace)
        self.play = widgets.Play(value=0, min=0, max=n - 1, interval=interval_ms, description="play")
        self.slider = widgets.IntSlider(value=0, min=0, max=n - 1, description=label, readout=False,
                                        layout=widgets.Layout(width="60%"))
        self.label = widgets.Label(step_title(trace, 0))
        widgets.jslink((self.play, "value"), (self.slider, "value"))   # in the browser, no kernel round trip
        # every spec drawn once, by its name; stepping moves each in place (spec.follow) or, an
        # "html" spec, sets its text
        self.specs = {f.name: f for f in view.step + view.whole_run}
        self.figures: dict[str, go.FigureWidget] = {}
        self.html: dict[str, widgets.HTML] = {}
        for spec in view.step:
            if spec.kind == "html":
                self.html[spec.name] = widgets.HTML(spec.draw(trace, 0))
            else:
                self.figures[spec.name] = self._widget(spec.at(trace, 0))
        for spec in view.whole_run:
            fig = spec.draw(trace, 0)
            if fig is not None:                 # a maker with nothing to draw for this run
                self.figures[spec.name] = self._widget(fig)
        self.figure = self.figures[view.main.name]
        self.strip = self.figures.get(view.run_strip.name) if view.run_strip is not None else None
        # the step's detail table and the attention mask, by their keys (None: this view has none)
        self.detail = next((self.html[f.name] for f in view.step if f.slug == "detail"), widgets.HTML(""))
        self.mask = next((self.figures[f.name] for f in view.step if f.slug == "mask"), None)
        self.step = 0
        self.slider.observe(lambda change: self.update(change["new"]), names="value")
        parts = [widgets.HBox([self.play, self.slider, self.label])]
        for spec in view.step:
            shown = self.html.get(spec.name) or self.figures[spec.name]
            parts.append(folded(shown, f"{spec.name} of this {label}") if spec.folded else shown)
        parts += [self.strip] if self.strip is not None else []
        # the run's lesson (its engine View's): back / next say each step and move the player to it
        self.lesson = lesson_of(trace) or []
        self.lesson_at = 0
        if self.lesson:
            self.lesson_text = widgets.HTML()
            back, nxt = widgets.Button(description="< back"), widgets.Button(description="next >")
            back.on_click(lambda _: self.lesson_move(-1))
            nxt.on_click(lambda _: self.lesson_move(1))
            self.lesson_buttons = (back, nxt)
            self.lesson_move(0, move=False)
            parts.insert(1, folded(widgets.VBox([widgets.HBox([back, nxt]), self.lesson_text]),
                                   f"lesson: {len(self.lesson)} steps over this run"))
        summary = [self.figures[f.name] for f in view.summary if f.name in self.figures]
        if summary:
            parts.append(folded(widgets.VBox(summary), "the whole run: " + ", ".join(f.name for f in view.summary
                                                                                      if f.name in self.figures)))
        super().__init__(parts)

    def lesson_move(self, by: int, move: bool = True) -> int:
        """One lesson step forward / back (1 / -1; 0: stay): its sentence shown, the player moved to
        the step it talks about."""
        self.lesson_at = at = min(max(self.lesson_at + by, 0), len(self.lesson) - 1)
        st = self.lesson[at]
        self.lesson_text.value = (f"<b>{html.escape(st.title)}</b> <small>({at + 1} of {len(self.lesson)})</small>"
                                  f"<br>{html.escape(st.text)}")
        self.lesson_buttons[0].disabled, self.lesson_buttons[1].disabled = at == 0, at == len(self.lesson) - 1
        if move:
            self.update(st.round)
        return at

    @property
    def shown(self) -> list[str]:
        """The names of the specs on the page, in order (what a test compares across front ends)."""
        return [f.name for f in self.view.step + self.view.whole_run if f.name in self.figures or f.name in self.html]

    @staticmethod
    def _widget(fig) -> go.FigureWidget:
        # a set width: unset, JupyterLab drew the widget at plotly's 700 px default and clipped long titles
        w = go.FigureWidget(fig)
        w.layout.width = WIDTH
        return w

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
        step = go_to_step(self.trace, step)
        for name, fig in self.figures.items():
            self.specs[name].follow(fig, self.trace, step)
        for name, w in self.html.items():
            w.value = self.specs[name].draw(self.trace, step)
        self.label.value = step_title(self.trace, step)
        self.step = step
        if self.slider.value != step:
            self.slider.value = step


def folded(child, title: str) -> widgets.Accordion:
    fold = widgets.Accordion(children=[child], selected_index=None)
    fold.set_title(0, title)
    return fold


def show(trace_or_result, interval_ms: int = 900) -> Player:
    """An ipywidgets view of a run: display it (last expression of a cell) to step through."""
    return Player(as_trace(trace_or_result), interval_ms)
