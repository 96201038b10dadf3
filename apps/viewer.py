"""The dashboard's trace viewer: a player over the steps of one trace, the step figure, its detail
table, p and q of the step's key draft node, and the Summary tab's whole-run figures.

Like the Jupyter player (widgets/player.py), it draws each figure once per trace and then moves it
in place (`update_step`, `move_current` from speclab.figures): stepping sends what changed, not a
new figure. Everything shown comes from the trace; no model is needed.
"""
from __future__ import annotations

import panel as pn

from speclab.apps.keys import StepKeys
from speclab.apps.status import player_css, status_html
from speclab.figures import (acceptance_summary, confidence_bands, decoding_order, detail_html, move_current,
                             round_strip, step_figure, step_label, step_title, timing, update_step)
from speclab.figures.costmodel import costmodel_summary
from speclab.figures.distributions import distributions
from speclab.figures.mask import mask_figure
from speclab.metrics import n_steps
from speclab.trace import Trace

SUMMARY = {"speculative": (round_strip, acceptance_summary, timing, costmodel_summary),   # Summary tab figures by engine
           "diffusion": (confidence_bands, decoding_order)}
SUMMARY_HEIGHTS = (260, 380, 300, 380)
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
        self.summary_figs = [pn.pane.Plotly(None, height=h, sizing_mode="stretch_width", visible=False, link_figure=False)
                             for h in SUMMARY_HEIGHTS]
        self.summary_note = pn.pane.Markdown("Summary figures are for speculative and diffusion runs; the Step "
                                             "tab shows every strategy of a DAG run.", visible=False)
        self.player.param.watch(lambda e: self.show_step(e.new), "value")
        self.keys = StepKeys(self.move)             # arrow keys, Home / End
        self.keys_note = pn.pane.HTML("<small>keys: &larr; &rarr; step, Home / End: first / last</small>",
                                      css_classes=["speclab-keys-note"])

    def step_column(self) -> pn.Column:
        return pn.Column(pn.Row(self.player, self.step_text, self.keys_note), self.keys, self.step_fig, self.detail,
                         self.dist_temp, self.dist_fig, self.mask_toggle, self.mask_fig)

    def move(self, by) -> None:
        """One step forward / back (by = 1 / -1), or to the "first" / "last" step: the keys call this."""
        if self.trace is None:
            return
        last = n_steps(self.trace) - 1
        step = {"first": 0, "last": last}.get(by) if isinstance(by, str) else self.player.value + int(by)
        self.player.value = min(max(step, 0), last)

    def summary_column(self) -> pn.Column:
        return pn.Column(self.summary_note, *self.summary_figs)

    def show(self, trace: Trace) -> None:
        """Put a trace on the page at its first step. ValueError for a trace with nothing to step."""
        n = n_steps(trace)                  # ValueError for an engine with no step view
        if n == 0:
            raise ValueError("this trace has no steps to show (recorded with record=None and no rounds?)")
        with pn.io.hold():
            self.trace, self.step = trace, 0
            self.dist_temp.value = trace.sampling.temperature or 1.0        # the temperature that ran
            # a greedy run records p and q at T = 1: the slider says so rather than "1.0" alone
            self.dist_temp.name = ("show p and q at temperature" if trace.sampling.temperature
                                   else "show p and q at temperature (the run was greedy; recorded at T = 1)")
            self.status.object = status_html(trace)
            self.player.stylesheets = [player_css(step_label(trace))]
            self.step_fig.object = step_figure(trace, 0)
            makers = SUMMARY.get(trace.engine, ())
            for i, pane in enumerate(self.summary_figs):
                fig = makers[i](trace, 0) if i < len(makers) else None
                pane.visible, pane.object = fig is not None, fig
                # diffusion figures size themselves (the order map grows with the steps)
                pane.height = SUMMARY_HEIGHTS[i] if trace.engine != "diffusion" or fig is None else fig.layout.height + 20
            self.summary_note.visible = not makers
            at_zero = self.player.value == 0
            self.player.param.update(start=0, end=max(n - 1, 1), value=0)
            if at_zero:                     # the watcher draws step 0 only when the value moves
                self.show_step(0)

    def show_step(self, step: int) -> None:
        if self.trace is None:
            return
        trace = self.trace
        step = min(int(step), n_steps(trace) - 1)
        makers = SUMMARY.get(trace.engine, ())
        with pn.io.hold():
            self.step_text.object = f"<b>{step_title(trace, step)}</b>"
            update_step(self.step_fig.object, trace, step)
            self.step_fig.param.trigger("object")
            self.detail.object = detail_html(trace, step)
            self.step = step
            self._show_distributions()
            self._show_mask()
            for pane in self.summary_figs[:len(makers)]:       # the "current" markers follow the step
                if pane.object is None:                        # a maker with nothing to draw for this run
                    continue
                move_current(pane.object, step)
                pane.param.trigger("object")

    def _show_distributions(self) -> None:
        """The p / q bars of the current round, when the trace recorded them."""
        trace, fig = self.trace, None
        if trace is not None and trace.engine == "speculative" and trace.record == "full":
            fig = distributions(trace, self.step, temperature=self.dist_temp.value)
        with pn.io.hold():
            self.dist_fig.object, self.dist_fig.visible = fig, fig is not None
            self.dist_temp.visible = fig is not None

    def _show_mask(self) -> None:
        """The attention mask of the current step, while its checkbox is ticked (speculative and
        diffusion runs: a DAG decodes in one forward over its own graph)."""
        trace = self.trace
        has = trace is not None and trace.engine in ("speculative", "diffusion")
        with pn.io.hold():
            self.mask_toggle.visible = has
            fig = mask_figure(trace, self.step) if has and self.mask_toggle.value else None
            self.mask_fig.object, self.mask_fig.visible = fig, fig is not None

    def clear(self, status: str = EMPTY) -> None:
        """Nothing on the page but `status` (a failed run, a changed form: no stale result)."""
        with pn.io.hold():
            self.trace = None
            self.status.object = status
            self.step_text.object, self.step_fig.object, self.detail.object = "", None, ""
            self.dist_fig.object, self.dist_fig.visible, self.dist_temp.visible = None, False, False
            self.mask_fig.object, self.mask_fig.visible = None, False
            for pane in self.summary_figs:
                pane.visible, pane.object = False, None
