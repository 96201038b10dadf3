"""The dashboard's trace viewer: a player over the steps of one trace, and every figure of the
trace's view spec, the Step tab's and the Summary tab's.

Which figures a trace gets, in which order, and each pane's height, is its view spec
(figures.views.view_of), the same set the Jupyter player and the export show: the main step figure,
the other step specs (the step's detail table, a policy's decisions, p and q, a record's figure,
the attention mask behind a checkbox: `folded`), the run strip and the summary figures. Like the
Jupyter player, it draws each figure once per trace and then moves it in place
(`FigureSpec.follow`): stepping sends what changed, not a new figure. A spec whose figure takes a
temperature (p and q: `tempered`) gets a slider that re-tempers it. Everything shown comes from the
trace; no model is needed.
"""
from __future__ import annotations

import html
import logging

import panel as pn

from speclab.apps.keys import StepKeys
from speclab.apps.status import player_css, status_html
from speclab.figures import go_to_step, n_steps, step_label, step_title, view_of
from speclab.figures.views import FigureSpec, View
from speclab.trace import Trace, TraceError

log = logging.getLogger("speclab.apps")
EMPTY = "No run yet: choose a method and press Run, or open a saved trace."


class Viewer:
    def __init__(self):
        w = pn.widgets
        self.trace: Trace | None = None
        self.step = 0
        self.status = pn.pane.HTML(EMPTY, css_classes=["speclab-status"])
        # the player's own readout is off: it went stale when a new trace loaded, and counted from 0
        self.player = w.Player(name="", start=0, end=1, value=0, interval=900, loop_policy="once",
                               show_value=False, show_loop_controls=False, stylesheets=[player_css("round")],
                               css_classes=["speclab-player"])
        self.step_text = pn.pane.HTML("", css_classes=["speclab-step-text"])
        # a figure that fails at a step (a damaged record, a method's own figure): named here, in one line
        self.step_error = pn.pane.HTML("", css_classes=["speclab-step-error"], visible=False,
                                       styles={"color": "#b00020"})
        # link_figure off: the viewer triggers one update per step itself, after moving the figure in
        # place; Panel then sends what changed (Panel's own per-edit messages lost the new titles)
        self.step_fig = pn.pane.Plotly(None, css_classes=["speclab-step"], sizing_mode="stretch_width",
                                       link_figure=False)
        # a tempered spec (p and q, recorded "full") is re-tempered on demand
        self.dist_temp = w.FloatSlider(name="show p and q at temperature", start=0.1, end=2.0, step=0.05, value=1.0,
                                       visible=False, width=300)
        self.dist_temp.param.watch(lambda e: self._retemper(), "value")
        # the trace's view spec (figures.views) says which figures it gets: panes made as needed, kept
        # for the next trace; `shown` pairs each pane in use with the spec that draws it
        self.view: View | None = None
        self.shown: list[tuple[pn.pane.PaneBase, FigureSpec]] = []
        self.step_figs: list[pn.pane.Plotly] = []       # step figures after the main one (decisions, ...)
        self.summary_figs: list[pn.pane.Plotly] = []    # the run strip and the summary figures
        self._pool: list[pn.pane.Plotly] = []
        self._html_pool: list[pn.pane.HTML] = []
        self._toggles: dict[str, pn.widgets.Checkbox] = {}   # a folded spec's "show" box, by its key
        self.step_more = pn.Column(sizing_mode="stretch_width")
        self.summary_note = pn.pane.Markdown("This run's view has no whole-run figures: the Step tab shows "
                                             "everything it recorded (a DAG run: every strategy).", visible=False)
        self.summary = pn.Column(self.summary_note, sizing_mode="stretch_width")
        self.player.param.watch(lambda e: self.show_step(e.new), "value")
        self.keys = StepKeys(self.move)             # arrow keys, Home / End
        self.keys_note = pn.pane.HTML("<small>keys: &larr; &rarr; step, Home / End: first / last</small>",
                                      css_classes=["speclab-keys-note"])

    # the panes of the specs every engine knows, by key (tests and the lesson read them): an empty,
    # hidden pane where this trace's view has none
    def _by_key(self, key: str):
        return next((pane for pane, spec in self.shown if spec.slug == key), None)

    @property
    def detail(self) -> pn.pane.HTML:
        return self._by_key("detail") or pn.pane.HTML("", visible=False)

    @property
    def dist_fig(self) -> pn.pane.Plotly:
        return self._by_key("dist") or pn.pane.Plotly(None, visible=False)

    @property
    def mask_fig(self) -> pn.pane.Plotly:
        return self._by_key("mask") or pn.pane.Plotly(None, visible=False)

    @property
    def mask_toggle(self) -> pn.widgets.Checkbox:
        box = self._toggles.get("mask")
        return box if box is not None and box.visible else pn.widgets.Checkbox(visible=False)

    def step_column(self) -> pn.Column:
        return pn.Column(pn.Row(self.player, self.step_text, self.keys_note), self.step_error, self.keys, self.step_fig,
                         self.dist_temp, self.step_more, sizing_mode="stretch_width")

    def move(self, by) -> None:
        """One step forward / back (by = 1 / -1), or to the "first" / "last" step: the keys call this."""
        if self.trace is not None:
            self.player.value = go_to_step(self.trace, self.player.value, by)

    def summary_column(self) -> pn.Column:
        return self.summary

    def _toggle(self, spec: FigureSpec, noun: str) -> pn.widgets.Checkbox:
        box = self._toggles.get(spec.slug)
        if box is None:
            box = pn.widgets.Checkbox(name="", value=False, css_classes=[f"speclab-{spec.slug}-toggle"])
            box.param.watch(lambda e: self.show_step(self.step), "value")
            self._toggles[spec.slug] = box
        box.name, box.visible = f"show the {spec.name} of this {noun}", True
        return box

    def _draw(self, trace: Trace, view: View) -> None:
        """A pane per spec of the view after the main step figure, drawn at step 0, sized by its spec."""
        figs = [f for f in view.step[1:] if f.kind == "figure"] + list(view.whole_run)
        htmls = [f for f in view.step[1:] if f.kind == "html"]
        while len(self._pool) < len(figs):
            self._pool.append(pn.pane.Plotly(None, sizing_mode="stretch_width", visible=False, link_figure=False))
        while len(self._html_pool) < len(htmls):
            self._html_pool.append(pn.pane.HTML("", sizing_mode="stretch_width"))
        by_spec = dict(zip([f.name for f in figs], self._pool)) | dict(zip([f.name for f in htmls], self._html_pool))
        self.shown = [(by_spec[f.name], f) for f in view.step[1:] + view.whole_run]
        for pane in self._pool[len(figs):]:
            pane.visible, pane.object = False, None
        for box in self._toggles.values():
            box.visible = False
        for pane, spec in self.shown:
            pane.css_classes = [f"speclab-{spec.slug}"]
            if spec.where == "step" and (spec.fresh or spec.kind == "html"):
                continue                        # drawn at each step (show_step)
            fig = spec.draw(trace, 0)
            pane.visible, pane.object = fig is not None, fig
            if fig is not None:
                pane.height = spec.pane_height(fig)
        k = len([f for f in view.step[1:] if f.kind == "figure"])
        self.step_figs, self.summary_figs = self._pool[:k], self._pool[k:len(figs)]
        noun = step_label(trace)
        step_items = []
        for spec in view.step[1:]:
            if spec.folded:
                step_items.append(self._toggle(spec, noun))
            step_items.append(by_spec[spec.name])
        # a pane that changes column leaves the old one first: Panel hands a pane's browser model to
        # the column that adds it and deletes it when the other column lets the pane go, so a pane
        # added before it is let go keeps no model, and the browser never sees it step (a run strip
        # of the Summary tab, reused as the decisions table under a diffusion canvas, would stay put)
        keep = lambda col, panes: [p for p in col.objects if any(p is q for q in panes)]
        self.step_more.objects = keep(self.step_more, step_items)
        self.summary.objects = keep(self.summary, [self.summary_note] + list(self.summary_figs))
        self.step_more.objects = step_items
        self.summary.objects = [self.summary_note] + list(self.summary_figs)
        self.summary_note.visible = not view.whole_run
        tempered = any(f.tempered for f in view.step)
        self.dist_temp.visible = tempered

    def show(self, trace: Trace) -> None:
        """Put a trace on the page at its first step. TraceError for a trace with nothing to step."""
        n = n_steps(trace)                  # ValueError for an engine with no step view
        if n == 0:
            raise TraceError("this trace has no steps to show (recorded with record=None and no rounds?)")
        with pn.io.hold():
            self.trace, self.step, self.view = trace, 0, None               # no stepping until drawn
            self.dist_temp.value = trace.sampling.temperature or 1.0        # the temperature that ran
            # a greedy run records p and q at T = 1: the slider says so rather than "1.0" alone
            self.dist_temp.name = ("show p and q at temperature" if trace.sampling.temperature
                                   else "show p and q at temperature (the run was greedy; recorded at T = 1)")
            self.status.object = status_html(trace)
            self.player.stylesheets = [player_css(step_label(trace))]
            self.view = view = view_of(trace)
            self.step_fig.object = view.main.draw(trace, 0)
            self._draw(trace, view)
            at_zero = self.player.value == 0
            self.player.param.update(start=0, end=max(n - 1, 1), value=0)
            if at_zero:                     # the watcher draws step 0 only when the value moves
                self.show_step(0)

    def _fresh(self, spec: FigureSpec, step: int):
        """A spec drawn anew at each step: its HTML, or its figure (re-tempered where it takes a
        temperature); None while folded and not asked for."""
        if spec.folded and not self._toggles[spec.slug].value:
            return None
        if spec.tempered:
            return spec.fn(self.trace, step, temperature=self.dist_temp.value)
        return spec.draw(self.trace, step)

    def show_step(self, step: int) -> None:
        if self.trace is None or self.view is None:
            return
        trace = self.trace
        step = go_to_step(trace, int(step))
        self.step = step
        failed = []
        with pn.io.hold():
            self.step_text.object = f"<b>{step_title(trace, step)}</b>"
            for pane, spec in [(self.step_fig, self.view.main)] + self.shown:   # each moved in place
                try:
                    self._step_pane(pane, spec, step)
                except Exception as e:      # one figure that cannot draw this step: said, the others shown
                    log.exception("figure %r failed at step %d", spec.name, step)
                    pane.visible = False
                    failed.append(f"{spec.name}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}")
            self.step_error.object = ("<b>not drawn at this step</b> (the other figures are): "
                                      + html.escape("; ".join(failed))) if failed else ""
            self.step_error.visible = bool(failed)

    def _step_pane(self, pane, spec: FigureSpec, step: int) -> None:
        if spec.where == "step" and (spec.fresh or spec.kind == "html"):
            obj = self._fresh(spec, step)
            pane.object, pane.visible = (obj if obj is not None else ("" if spec.kind == "html" else None),
                                         obj is not None)
            return
        if pane.object is None:                        # a maker with nothing to draw for this run
            return
        spec.follow(pane.object, self.trace, step)
        pane.visible = True
        pane.param.trigger("object")

    def _retemper(self) -> None:
        if self.trace is not None and self.view is not None:
            self.show_step(self.step)

    def clear(self, status: str = EMPTY) -> None:
        """Nothing on the page but `status` (a failed run, a changed form: no stale result)."""
        with pn.io.hold():
            self.trace = None
            self.status.object = status
            self.step_text.object, self.step_fig.object = "", None
            self.step_error.object, self.step_error.visible = "", False
            self.dist_temp.visible = False
            for pane in self._pool + self._html_pool:
                pane.visible, pane.object = False, None if pane in self._pool else ""
            for box in self._toggles.values():
                box.visible = False
