"""The dashboard's trace viewer: a player over the steps of one trace, the step figure, its detail
table, p and q of the step's key draft node, and the Summary tab's whole-run figures.

Which figures a trace gets, and each pane's height, is its view spec (figures.views.view_of, the
same the Jupyter player and the export read): the main step figure, any other step figures (a
policy's decisions, a method's own), the run strip and the summary figures. Like the Jupyter
player, it draws each figure once per trace and then moves it in place (`FigureSpec.follow`):
stepping sends what changed, not a new figure. Everything shown comes from the trace; no model is
needed.
"""
from __future__ import annotations

import panel as pn

from speclab.apps.keys import StepKeys
from speclab.apps.status import player_css, status_html
from speclab.figures import detail_html, go_to_step, n_steps, step_label, step_title, view_of
from speclab.figures.distributions import distributions
from speclab.figures.mask import mask_figure
from speclab.figures.views import FigureSpec, View
from speclab.trace import Trace, TraceError

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
        # link_figure off: the viewer triggers one update per step itself, after moving the figure in
        # place; Panel then sends what changed (Panel's own per-edit messages lost the new titles)
        self.step_fig = pn.pane.Plotly(None, css_classes=["speclab-step"], sizing_mode="stretch_width",
                                       link_figure=False)
        self.detail = pn.pane.HTML("", css_classes=["speclab-detail"])
        # p and q of the round's key draft node (record="full"), re-tempered on demand
        self.dist_fig = pn.pane.Plotly(None, css_classes=["speclab-dist"], sizing_mode="stretch_width", visible=False)
        self.dist_temp = w.FloatSlider(name="show p and q at temperature", start=0.1, end=2.0, step=0.05, value=1.0,
                                       visible=False, width=300)
        self.dist_temp.param.watch(lambda e: self._show_distributions(), "value")
        # the attention mask the step's forward used (tree mask of a verify, a diffusion step's block mask)
        self.mask_toggle = w.Checkbox(name="show the attention mask of this step", value=False,
                                      css_classes=["speclab-mask-toggle"])
        self.mask_fig = pn.pane.Plotly(None, css_classes=["speclab-mask"], sizing_mode="stretch_width",
                                       visible=False)
        self.mask_toggle.param.watch(lambda e: self._show_mask(), "value")
        # the trace's view spec (figures.views) says which figures it gets: panes made as needed, kept
        # for the next trace; `shown` pairs each pane in use with the spec that draws it
        self.view: View | None = None
        self.shown: list[tuple[pn.pane.Plotly, FigureSpec]] = []
        self.step_figs: list[pn.pane.Plotly] = []       # step figures after the main one (decisions, ...)
        self.summary_figs: list[pn.pane.Plotly] = []    # the run strip and the summary figures
        self._pool: list[pn.pane.Plotly] = []
        self.step_more = pn.Column(sizing_mode="stretch_width")
        self.summary_note = pn.pane.Markdown("Summary figures are for speculative and diffusion runs; the Step "
                                             "tab shows every strategy of a DAG run.", visible=False)
        self.summary = pn.Column(self.summary_note, sizing_mode="stretch_width")
        self.player.param.watch(lambda e: self.show_step(e.new), "value")
        self.keys = StepKeys(self.move)             # arrow keys, Home / End
        self.keys_note = pn.pane.HTML("<small>keys: &larr; &rarr; step, Home / End: first / last</small>",
                                      css_classes=["speclab-keys-note"])

    def step_column(self) -> pn.Column:
        return pn.Column(pn.Row(self.player, self.step_text, self.keys_note), self.keys, self.step_fig, self.detail,
                         self.step_more, self.dist_temp, self.dist_fig, self.mask_toggle, self.mask_fig)

    def move(self, by) -> None:
        """One step forward / back (by = 1 / -1), or to the "first" / "last" step: the keys call this."""
        if self.trace is not None:
            self.player.value = go_to_step(self.trace, self.player.value, by)

    def summary_column(self) -> pn.Column:
        return self.summary

    def _draw(self, trace: Trace, view: View) -> None:
        """A pane per figure of the view after the main step figure, drawn at step 0, sized by its spec."""
        specs = view.step[1:] + view.whole_run
        while len(self._pool) < len(specs):
            self._pool.append(pn.pane.Plotly(None, sizing_mode="stretch_width", visible=False, link_figure=False))
        self.shown = list(zip(self._pool, specs))
        for pane in self._pool[len(specs):]:
            pane.visible, pane.object = False, None
        for pane, spec in self.shown:
            fig = spec.draw(trace, 0)
            pane.visible, pane.object = fig is not None, fig
            if fig is not None:
                pane.height = spec.pane_height(fig)
        k = len(view.step) - 1
        self.step_figs, self.summary_figs = self._pool[:k], self._pool[k:len(specs)]
        # a pane that changes column leaves the old one first: Panel hands a pane's browser model to
        # the column that adds it and deletes it when the other column lets the pane go, so a pane
        # added before it is let go keeps no model, and the browser never sees it step (a run strip
        # of the Summary tab, reused as the decisions table under a diffusion canvas, would stay put)
        keep = lambda col, panes: [p for p in col.objects if any(p is q for q in panes)]
        self.step_more.objects = keep(self.step_more, self.step_figs)
        self.summary.objects = keep(self.summary, [self.summary_note] + list(self.summary_figs))
        self.step_more.objects = list(self.step_figs)
        self.summary.objects = [self.summary_note] + list(self.summary_figs)
        self.summary_note.visible = not view.whole_run

    def show(self, trace: Trace) -> None:
        """Put a trace on the page at its first step. TraceError for a trace with nothing to step."""
        n = n_steps(trace)                  # ValueError for an engine with no step view
        if n == 0:
            raise TraceError("this trace has no steps to show (recorded with record=None and no rounds?)")
        with pn.io.hold():
            self.trace, self.step = trace, 0
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

    def show_step(self, step: int) -> None:
        if self.trace is None:
            return
        trace = self.trace
        step = go_to_step(trace, int(step))
        with pn.io.hold():
            self.step_text.object = f"<b>{step_title(trace, step)}</b>"
            for pane, spec in [(self.step_fig, self.view.main)] + self.shown:   # each moved in place
                if pane.object is None:                        # a maker with nothing to draw for this run
                    continue
                spec.follow(pane.object, trace, step)
                pane.param.trigger("object")
            self.detail.object = detail_html(trace, step)
            self.step = step
            self._show_distributions()
            self._show_mask()

    def _show_distributions(self) -> None:
        """The p / q bars of the current round, when the trace recorded them (record="full")."""
        trace, fig = self.trace, None
        if trace is not None and trace.record == "full":
            fig = distributions(trace, self.step, temperature=self.dist_temp.value)
        with pn.io.hold():
            self.dist_fig.object, self.dist_fig.visible = fig, fig is not None
            self.dist_temp.visible = fig is not None

    def _show_mask(self) -> None:
        """The attention mask of the current step, while its checkbox is ticked (speculative and
        diffusion runs: a DAG decodes in one forward over its own graph)."""
        has = self.trace is not None and self.view.mask
        with pn.io.hold():
            self.mask_toggle.visible = has
            fig = mask_figure(self.trace, self.step) if has and self.mask_toggle.value else None
            self.mask_fig.object, self.mask_fig.visible = fig, fig is not None

    def clear(self, status: str = EMPTY) -> None:
        """Nothing on the page but `status` (a failed run, a changed form: no stale result)."""
        with pn.io.hold():
            self.trace = None
            self.status.object = status
            self.step_text.object, self.step_fig.object, self.detail.object = "", None, ""
            self.dist_fig.object, self.dist_fig.visible, self.dist_temp.visible = None, False, False
            self.mask_fig.object, self.mask_fig.visible = None, False
            for pane in self._pool:
                pane.visible, pane.object = False, None
