"""The dashboard's Compare tab: every chosen method of the form's family against that family's
baseline, timed interleaved (speclab.bench.timing), as a table, a chart, the cost model, the
alpha / k / c explorer and a race. Its runs go through the page's RunService as one request, each
decode of it taking the service's checkpoint as its progress, so the page's Cancel (or the time
budget, Limits.run_seconds for each of its decodes) stops it at its next round.
"""
from __future__ import annotations

import asyncio
import html

import panel as pn

from speclab.apps import runs
from speclab.apps.form import is_block_causal
from speclab.apps.service import Cancelled, checkpoint
from speclab.bench import timing
from speclab.decoding.registry import get_method, paired_draft
from speclab.figures.compare import compare_chart
from speclab.figures.costmodel import costmodel_explorer_figure, costmodel_figure
from speclab.figures.race import race_iframe
from speclab.models.zoo import ModelLoadError

# the diffusion demo: the report's best point (BENCHMARKS.md, smollm2-dllm; speclab.bench.dllm_curve.
# best_point): above dllm-threshold's curve on every prompt set, lifted most above it. Its registry
# defaults are that point, so the demo passes no parameters; on the toy masked-diffusion models
# (not block-diffusion LMs) FreeDave stands in.
DIFFUSION_DEMO, DIFFUSION_DEMO_MASKED = "dllm-fastv2", "dllm-freedave"
# the methods a comparison starts with, per family (the baseline always runs too): for speculative
# methods the two that win on the copy task the page opens with (prompt lookup and the EAGLE head:
# BENCHMARKS.md); for diffusion, the threshold policy beside the demo, so the first Compare shows the
# trade-off's best point
COMPARE_START = {"speculative": ("prompt-lookup", "eagle"), "diffusion": ("dllm-threshold", DIFFUSION_DEMO)}
# timed runs per method in a comparison, interleaved (ar, m1, m2, ar, ...): 5 keep a 43-token Compare
# of three methods on smollm2-135m within a few seconds and give a median and a spread to judge
COMPARE_REPEATS = 5
EXPLAIN = (
    "Runs every chosen method on the prompt and settings on the left, plus its family's baseline: `ar` "
    "(one target forward per token) for speculative methods, one-per-step denoising for diffusion "
    "policies. speed-up = the baseline's wall time / the method's, tau = new tokens / target forwards, "
    "alpha = the per-token acceptance rate the papers and the cost model use (accepted / judged draft "
    "tokens: a token after the first rejection in a round is never judged); drafts kept = accepted / "
    "drafted, every drafted token counted. Each method first runs once untimed, so model loading and "
    "warm-up are not in the timings; then the methods run in turn (ar, m1, m2, ar, m1, m2, ...) as many "
    "times as the slider says. Each cell is the median with its spread (min-max); a speed-up is the median "
    "of the per-turn ratios, marked unreliable (with the reason) when the runs disagree, the spread "
    "crosses 1.0 or other programs were using the CPUs. The table and the race show each method's median run.")


def compare_start(family: str, target: str) -> list[str]:
    """The methods a comparison of `family` starts with on `target`."""
    start = COMPARE_START.get(family, ())
    if family == "diffusion" and not is_block_causal(target):
        start = tuple(DIFFUSION_DEMO_MASKED if m == DIFFUSION_DEMO else m for m in start)
    # a feature head the zoo ships for another target only (eagle on the toy code-target) is left out
    return [m for m in start if not _head_missing(m, target)]


def _head_missing(method: str, target: str) -> bool:
    d = get_method(method).draft
    return d is not None and d.kind != "draft" and paired_draft(target, method) is None


class ComparePanel:
    """The Compare tab of one session. `page` is its Dashboard: the form, the session's suffix
    history, the service, the alert and the busy state it shares with the Run button."""

    def __init__(self, page):
        self.page = page
        w = pn.widgets
        self.table: list[dict] = []
        self.timing = None                  # the last comparison's timing.Interleaved
        self.methods = w.MultiChoice(name="methods to compare", options=[])
        self._start: list[str] = []         # the start fit() chose last
        self.repeats = w.IntSlider(name="timed runs per method (interleaved)", start=1, end=15,
                                   value=COMPARE_REPEATS, css_classes=["speclab-compare-repeats"])
        # the cost model of each compared speculative method against ar (speclab.metrics.cost_model)
        self.cost = pn.pane.Plotly(None, css_classes=["speclab-compare-costmodel"], sizing_mode="stretch_width",
                                   visible=False)
        # the alpha / k / c explorer (notebook 08's sliders as one figure), started at the first method's c
        self.explorer = pn.pane.Plotly(None, css_classes=["speclab-compare-explorer"], sizing_mode="stretch_width",
                                       visible=False)
        # "run it": synthetic (the real round at a chosen acceptance, speclab.bench.curve) at an alpha and
        # k beside ar on the form's target and prompt; each measured speed-up a point on the explorer
        self.run_alpha = w.FloatSlider(name="alpha to run", start=0.0, end=1.0, step=0.05, value=0.7,
                                       css_classes=["speclab-runit-alpha"])
        self.run_k = w.IntSlider(name="k to run", start=1, end=8, value=4, css_classes=["speclab-runit-k"])
        self.run_button = w.Button(name="run it", css_classes=["speclab-runit"])
        self.run_button.on_click(self._on_run_it)
        self.run_out = pn.pane.HTML("", css_classes=["speclab-runit-out"])
        self.points: list[dict] = []        # what "run it" measured, this session
        self._explored = None               # the cost model the explorer was drawn for
        self.button = w.Button(name="Compare", button_type="primary", css_classes=["speclab-compare"])
        self.out = pn.pane.HTML("", css_classes=["speclab-compare-out"])
        self.chart = pn.pane.Plotly(None, css_classes=["speclab-compare-chart"], sizing_mode="stretch_width",
                                    visible=False)
        # the race: ar and each compared method typing their answers at the pace they ran
        self.race = pn.pane.HTML("", css_classes=["speclab-race"], sizing_mode="stretch_width")
        self.button.on_click(self._on_compare)
        self.fit()

    def column(self) -> pn.Column:
        return pn.Column(EXPLAIN, self.methods, self.repeats, self.button, self.out, self.chart, self.cost,
                         self.explorer, pn.Row(self.run_alpha, self.run_k, self.run_button), self.run_out, self.race)

    def fit(self) -> None:
        """Offer the methods of the form's family (speculative or diffusion), two chosen to start."""
        form = self.page.form
        family = runs.engine(form.method.value)
        options = ([m for m in runs.method_names() if runs.same_engine(m, form.method.value)]
                   if family in runs.BASELINE else [])
        start = [m for m in compare_start(family, form.target.value or "") if m in options]
        # a new family, or a target that changes the start while the start is still chosen untouched
        if list(self.methods.options) != options or list(self.methods.value) == self._start:
            self.methods.param.update(options=options, value=start)
        self._start = start

    # -- the runs -----------------------------------------------------------------------------------
    def job(self):
        """The comparison as a no-argument function for a worker -> (traces, the baseline's trace,
        errors, timing). The baseline (`ar`, one target forward per token, for speculative methods)
        always runs: it is the speed-up's reference and, when greedy, the lossless check's. Every
        method first runs once untimed, so no timing includes loading models or the first forwards;
        then the methods run interleaved, `repeats` times each (speclab.bench.timing). A method with
        a history (suffix) starts every timed run from the session's history as it was, so no run
        drafts from an earlier run's answer to this same prompt. Raises ValueError now for what can
        be checked without a model (past the service's limits too)."""
        page = self.page
        family = runs.engine(page.form.method.value)
        if family not in runs.BASELINE and runs.is_dag(page.form.method.value):
            raise ValueError("a DAG decodes in one forward: choose dag-all in the form and press Run, and the Step "
                             "tab shows every strategy's path and output side by side")
        if family not in runs.BASELINE:
            raise ValueError(f"{page.form.method.value} has no family to race here: Compare times speculative methods "
                             "against ar and diffusion policies against one-per-step; press Run, and its step figures "
                             "show what it does")
        base, ref = runs.BASELINE[family]
        chosen = [m for m in self.methods.value if runs.same_engine(m, base) and m != base]
        if not chosen:
            raise ValueError(f"choose at least one method to compare with {ref}")
        order = [base, *chosen]
        jobs = {m: self._timed_job(m) for m in order}            # checks every method's extras now
        warm = [page.job(m, progress=checkpoint, warmup=True) for m in order]
        repeats = int(self.repeats.value)

        def work():
            for fn in warm:
                try:
                    fn()
                except (ValueError, ModelLoadError):
                    pass                                         # the timed runs below report it
            errors = {}
            measured = timing.interleave(jobs, repeats, wall=lambda t: t.totals.wall_s, errors=errors,
                                         catch=(ValueError, ModelLoadError))
            traces = {m: measured.median_result(m) for m in measured.results}
            return traces, traces.pop(base, None), errors, measured
        work.runs = len(order) * (repeats + 1)                 # its time budget: a run's for each decode
        return work

    def _timed_job(self, method: str):
        """One timed run of a comparison, recording nothing beyond its rounds' counts and times
        (recording is for the run shown, not for timing); a method with a history gets a copy of
        the session's. Its progress is the service's checkpoint: Cancel stops it at its next round."""
        page = self.page
        args = dict(page.form.request(method), record=None, progress=checkpoint)
        page.service.limits.check(args)                         # refused now, in one line, past a limit
        if "history" in runs.takes(method):
            return lambda: runs.run_one(**dict(args, history=runs.copy_history(page.history)))
        return lambda: runs.run_one(**args)

    def now(self) -> list[dict]:
        """Compare in this thread (tests, notebooks) and show it."""
        try:
            result = self.job()()
        except (ValueError, ModelLoadError) as e:
            self.page.error(e)
            return []
        return self.show(*result)

    async def _queued(self, make_job, note, what: str):
        """Build a job (ValueError: one line on the page), queue it on the page's service and wait
        for it with `note` showing; the result, or None when it failed or its page went away."""
        page = self.page
        try:
            work = make_job()
            models = runs.models_of(page.form.request())
        except ValueError as e:
            page.error(e)
            return None
        try:
            ticket = page.service.submit(work, models, owner=page, kind=(what, *models), runs=getattr(work, "runs", 1))
            return await page.wait(ticket, 1, note())
        except asyncio.CancelledError:
            return None
        except Cancelled as e:
            page.error(page.stopped_line(e, what=what, button="Compare" if what == "the comparison" else what),
                       kind="warning")
            return None
        except Exception as e:
            page.error(f"{what} failed unexpectedly: {type(e).__name__}: {e}")
            return None

    async def _on_compare(self, event=None):
        base = runs.BASELINE.get(runs.engine(self.page.form.method.value), ("ar",))[0]
        note = lambda: (f"running {base} and {', '.join(self.methods.value)}: each once untimed, "
                        f"then {self.repeats.value} timed runs each, interleaved")
        result = await self._queued(self.job, note, "the comparison")
        if result is not None:
            self.show(*result)

    # -- the results --------------------------------------------------------------------------------
    def show(self, traces, reference, errors, measured=None) -> list[dict]:
        with pn.io.hold():
            return self._fill(traces, reference, errors, measured)

    def _fill(self, traces, reference, errors, measured=None) -> list[dict]:
        family = runs.engine(self.page.form.method.value)
        base, ref = runs.BASELINE.get(family, ("ar", "ar"))
        self.timing = measured
        spread = runs.compare_speedups(measured, base) if measured is not None and reference is not None else None
        self.table = runs.compare_rows(traces, reference, ref, measured, base)
        note = runs.prefill_note(reference, measured, base) if ref == "ar" else ""
        self.out.object = ((f"<p class='speclab-prefill-note'>{html.escape(note, quote=False)}</p>" if note else "")
                           + runs.rows_html(self.table)) if traces else ""
        chart = compare_chart(traces, reference, ref, spread) if traces else None
        self.chart.object, self.chart.visible = chart, chart is not None
        models = runs.cost_models(traces, reference, spread) if ref == "ar" and reference is not None else {}
        self.cost.object = costmodel_figure(models) if models else None
        first = next(iter(models.values()), None)
        self._explored = first
        self._draw_explorer()
        self.cost.visible = bool(models)
        lanes = [t for t in [reference, *traces.values()] if t is not None and t.rounds]
        self.race.object = race_iframe(lanes) if len(lanes) > 1 else ""
        if errors:
            self.page.error("; ".join(f"{m}: {e}" for m, e in errors.items()))
        else:
            self.page.clear_error()
        return self.table

    # -- run it: a measured point on the explorer's curves ----------------------------------------
    def _draw_explorer(self) -> None:
        if self._explored is None and not self.points:
            self.explorer.object, self.explorer.visible = None, False
            return
        fig = costmodel_explorer_figure(self._explored)
        if self.points:
            fig.add_scatter(x=[p["alpha"] for p in self.points], y=[p["measured"] for p in self.points],
                            mode="markers", name="run it: measured", marker=dict(color="#d62728", size=12, symbol="x"),
                            customdata=[[p["k"], p["c"], p["expected"]] for p in self.points],
                            hovertemplate="alpha %{x:.2f}, k %{customdata[0]}: measured %{y:.2f}x (c %{customdata[1]:.2f}; "
                                          "the model expects %{customdata[2]:.2f}x)<extra></extra>")
        self.explorer.object, self.explorer.visible = fig, True

    def run_it_job(self):
        """synthetic at the chosen alpha and k beside ar on the form's target, prompt and length, as a
        no-argument function for a worker -> the measured point (speclab.bench.curve.measure_point)."""
        from speclab.bench.curve import measure_point
        form = self.page.form
        req = form.request("synthetic")
        args = dict(req, k=int(self.run_k.value))
        self.page.service.limits.check(args)
        alpha, k, repeats = float(self.run_alpha.value), int(self.run_k.value), int(self.repeats.value)
        work = lambda: measure_point(req["target"], req["prompt"], alpha=alpha, k=k, max_new_tokens=req["max_new_tokens"],
                                     repeats=repeats, chat=bool(req.get("chat")), progress=checkpoint)
        work.runs = 2 * repeats + 1                              # ar once untimed, then both in turn
        return work

    def add_point(self, pt: dict) -> None:
        self.points.append(pt)
        self._draw_explorer()
        lo, hi = pt["spread"]
        exp = f"{pt['expected']:.2f}x" if pt["expected"] is not None else "none"
        self.run_out.object = (f"alpha {pt['alpha']:.2f}, k {pt['k']}: measured <b>{pt['measured']:.2f}x</b> "
                               f"({lo:.2f}-{hi:.2f}x{'' if pt['reliable'] else ', unreliable: ' + '; '.join(pt['reasons'])}), "
                               f"tau {pt['tau']:.2f}, a round {pt['c']:.2f} ar steps: the cost model expects {exp}")

    def run_it_now(self) -> dict | None:
        """run it in this thread (tests, notebooks)."""
        try:
            pt = self.run_it_job()()
        except (ValueError, ModelLoadError) as e:
            self.page.error(e)
            return None
        self.add_point(pt)
        return pt

    async def _on_run_it(self, event=None):
        note = lambda: f"running ar and synthetic[alpha={self.run_alpha.value:.2f}; k={self.run_k.value}], interleaved"
        pt = await self._queued(self.run_it_job, note, "run it")
        if pt is not None:
            self.add_point(pt)
