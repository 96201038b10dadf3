"""The served dashboard: run a method on a prompt, step through its rounds (speculative), denoising
steps (diffusion) or strategies (DAG), compare methods, and open or save traces.
`panel serve speclab/apps/dashboard.py` or `speclab serve`.

Three parts: the parameter form (speclab/apps/form.py), the trace viewer (speclab/apps/viewer.py, stepping figures
in place like the Jupyter player) and, here, the runs between them (decode, compare, upload, save).
One `Dashboard` per browser session holds everything that session sees (widgets, the current
trace, the last comparison, the suffix method's history of this session's earlier requests);
nothing about a run lives in module globals, so two users never see each other's runs. Models are
shared by the process (`load_shared`), and decodes go through one worker thread (speclab/apps/runs.py says
why), awaited from an async callback so the page stays live and the progress bar moves while the
model works. Figures and the step detail table come from speclab.figures, exactly as in the notebook.

URL arguments prefill the form and can start a run, so a link reproduces a run (`speclab serve`
serves it at /, `panel serve speclab/apps/dashboard.py` at /dashboard):
    /?prompt=def%20f(x):&method=prompt-lookup&max_new_tokens=8&compare=ar,suffix&run=1
"""
from __future__ import annotations

import asyncio
import html
import io

import panel as pn

from speclab.apps import guide, runs
from speclab.apps.form import EXAMPLE_PROMPTS, Form, is_block_causal
from speclab.apps.lesson import lesson
from speclab.apps.viewer import Viewer
from speclab.bench import timing
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.figures.compare import compare_chart
from speclab.figures.costmodel import costmodel_explorer_figure, costmodel_figure
from speclab.figures.race import race_iframe
from speclab.models.zoo import ModelLoadError
from speclab.trace import Trace, TraceError

pn.extension("plotly")

PROJECTOR_ZOOM = 1.4
PROJECTOR_FIGURE = 1.15     # the step figure's own scale in projector mode: strip and tree on one screen
# what the progress line says before the first token: a model's first run loads it (seconds), and
# every run reads its prompt first, so "0 of 64 tokens" would look like a hang
LOADING = "loading the model and reading the prompt (a model's first run loads it: a few seconds)"
# the diffusion demo: the report's best point (BENCHMARKS.md, smollm2-dllm; speclab.bench.dllm_curve.
# best_point): above dllm-threshold's curve on every prompt set, lifted most above it. Its registry
# defaults are that point, so the demo passes no parameters; on the toy masked-diffusion models
# (not block-diffusion LMs) FreeDave stands in.
DIFFUSION_DEMO, DIFFUSION_DEMO_MASKED = "dllm-fastv2", "dllm-freedave"
# the methods a comparison starts with, per family (the baseline always runs too): for diffusion,
# the threshold policy beside the demo, so the first Compare shows the trade-off's best point
COMPARE_START = {"speculative": ("draft-model", "prompt-lookup"), "diffusion": ("dllm-threshold", DIFFUSION_DEMO)}


def compare_start(family: str, target: str) -> list[str]:
    """The methods a comparison of `family` starts with on `target`."""
    start = COMPARE_START.get(family, ())
    if family == "diffusion" and not is_block_causal(target):
        start = tuple(DIFFUSION_DEMO_MASKED if m == DIFFUSION_DEMO else m for m in start)
    return list(start)
# timed runs per method in a comparison, interleaved (ar, m1, m2, ar, ...): 5 keep a 43-token Compare
# of three methods on smollm2-135m within a few seconds and give a median and a spread to judge
COMPARE_REPEATS = 5


class Dashboard:
    """Everything one session sees: the form (speclab/apps/form.py), the viewer (speclab/apps/viewer.py), and the
    runs between them, done here. `view` is the Panel layout; the methods are its callbacks, and
    tests call them directly (`run_now`, `open_upload`, `compare_now`, `show_step`)."""

    def __init__(self, upload_limit: int = runs.MAX_UPLOAD_BYTES):
        self.upload_limit = upload_limit
        self.compare_table: list[dict] = []
        self.history = SuffixHistory()      # this session's earlier requests, for suffix (never another's)
        self.viewer = Viewer()
        self.form = Form(runs.zoo_models())
        w = pn.widgets
        self.run_button = w.Button(name="Run", button_type="primary", css_classes=["speclab-run"])
        self.progress = w.Progress(name="progress", value=0, max=1, visible=False, bar_color="primary")
        self.queue_note = pn.pane.Markdown("", visible=False)
        self.alert = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["speclab-alert"])
        # -- compare: methods of the form's family, against that family's baseline --------------------
        self.compare_methods = w.MultiChoice(name="methods to compare", options=[])
        self._start: list[str] = []                 # the start _fit_compare chose last
        self._fit_compare()
        self.compare_repeats = w.IntSlider(name="timed runs per method (interleaved)", start=1, end=15,
                                           value=COMPARE_REPEATS, css_classes=["speclab-compare-repeats"])
        self.compare_timing = None          # the last comparison's timing.Interleaved
        # the cost model of each compared speculative method against ar (speclab.metrics.cost_model)
        self.compare_cost = pn.pane.Plotly(None, css_classes=["speclab-compare-costmodel"], sizing_mode="stretch_width",
                                           visible=False)
        # the alpha / k / c explorer (notebook 08's sliders as one figure), started at the first method's c
        self.compare_explorer = pn.pane.Plotly(None, css_classes=["speclab-compare-explorer"],
                                               sizing_mode="stretch_width", visible=False)
        self.compare_button = w.Button(name="Compare", button_type="primary", css_classes=["speclab-compare"])
        self.compare_out = pn.pane.HTML("", css_classes=["speclab-compare-out"])
        self.compare_chart = pn.pane.Plotly(None, css_classes=["speclab-compare-chart"], sizing_mode="stretch_width",
                                            visible=False)
        # the race: ar and each compared method typing their answers at the pace they ran
        self.race_out = pn.pane.HTML("", css_classes=["speclab-race"], sizing_mode="stretch_width")
        # -- traces in and out -------------------------------------------------------------------
        self.upload = w.FileInput(accept=".json", multiple=False, css_classes=["speclab-upload"])
        self.download = w.FileDownload(callback=self._download, filename="trace.json", label="Save trace (JSON)",
                                       disabled=True, button_type="default", css_classes=["speclab-download"])

        self.run_button.on_click(self._on_run)
        self.compare_button.on_click(self._on_compare)
        self.upload.param.watch(lambda e: self.open_upload(e.new, self.upload.filename), "value")
        self.projector = w.Toggle(name="projector: large text", value=False, width=170,
                                  css_classes=["speclab-projector"])
        # the guided lesson over the run on the page (speclab/apps/lesson.py): one sentence a step
        self.lesson_toggle = w.Toggle(name="lesson", value=False, width=90, css_classes=["speclab-lesson-toggle"])
        self.lesson_card = pn.pane.HTML("", css_classes=["speclab-lesson"], visible=False, sizing_mode="stretch_width",
                                        styles={"background": "#f4f8fb", "border-left": "4px solid #2a7fb8",
                                                "padding": "0.3em 0.8em", "font-size": "115%"})
        self.lesson_back = w.Button(name="< back", width=80, css_classes=["speclab-lesson-back"], visible=False)
        self.lesson_next = w.Button(name="next >", width=80, css_classes=["speclab-lesson-next"], visible=False)
        self.lesson_back.on_click(lambda e: self.lesson_move(-1))
        self.lesson_next.on_click(lambda e: self.lesson_move(1))
        self.lesson_steps: list | None = None
        self.lesson_at = 0
        self.view = self._layout()
        self.form.on_change = self._form_changed      # once the widgets it updates exist
        self.projector.param.watch(lambda e: self._presentation(e.new), "value")
        self.lesson_toggle.param.watch(lambda e: self.lesson_mode(e.new), "value")
        self.viewer.keys._on_move = self._key      # in lesson mode the keys move the lesson
        self.show_example()

    def show_example(self) -> Trace | None:
        """The recorded example run of the form's method and pair, when one ships: the page opens on
        a real run before any model is loaded."""
        f = self.form
        trace = guide.example(f.method.value, f.target.value, f.draft.value if f.draft.visible else None)
        if trace is None:
            return None
        self.show_trace(trace)
        self.viewer.status.object = ("<i>An example run, recorded on this model pair: step through it, or press "
                                     "Run to decode the prompt on the left live.</i><br>" + self.viewer.status.object)
        return trace

    @property
    def trace(self) -> Trace | None:
        return self.viewer.trace

    # -- layout -----------------------------------------------------------------------------------
    def _layout(self):
        form = self.form.column(self.run_button, self.progress, self.queue_note)
        compare = pn.Column(
            "Runs every chosen method on the prompt and settings on the left, plus its family's baseline: `ar` "
            "(one target forward per token) for speculative methods, one-per-step denoising for diffusion "
            "policies. speed-up = the baseline's wall time / the method's, tau = new tokens / target forwards, "
            "alpha = the per-token acceptance rate the papers and the cost model use (accepted / judged draft "
            "tokens: a token after the first rejection in a round is never judged); drafts kept = accepted / "
            "drafted, every drafted token counted. Each method first runs once untimed, so model loading and "
            "warm-up are not in the timings; then the methods run in turn (ar, m1, m2, ar, m1, m2, ...) as many "
            "times as the slider says. Each cell is the median with its spread (min-max); a speed-up is the median "
            "of the per-turn ratios, marked unreliable (with the reason) when the runs disagree, the spread "
            "crosses 1.0 or other programs were using the CPUs. The table and the race show each method's median run.",
            self.compare_methods, self.compare_repeats, self.compare_button, self.compare_out, self.compare_chart,
            self.compare_cost, self.compare_explorer, self.race_out)
        files = pn.Column("Open a trace saved by `speclab run --trace` or by this page:", self.upload,
                          self.download)
        self.tabs = pn.Tabs(("Step", self.viewer.step_column()), ("Summary", self.viewer.summary_column()),
                            ("Compare", compare), ("Traces", files), dynamic=False)
        self.guide_card = guide_card = pn.Card(pn.pane.Markdown(guide.GLOSSARY), title="Glossary", collapsed=True,
                             sizing_mode="stretch_width", css_classes=["speclab-glossary"])
        self.intro = pn.pane.Markdown(guide.INTRO[runs.engine(self.form.method.value)], css_classes=["speclab-intro"],
                                      sizing_mode="stretch_width")
        self.main = pn.Column(pn.Row(self.intro, pn.Column(self.projector, self.lesson_toggle)), guide_card,
                              self.alert, self.viewer.status,
                              pn.Row(self.lesson_back, self.lesson_card, self.lesson_next, sizing_mode="stretch_width"),
                              self.tabs, sizing_mode="stretch_width")
        return pn.Row(form, self.main, sizing_mode="stretch_width")

    def _presentation(self, on: bool) -> None:
        """Projector mode: everything right of the form drawn 1.4x larger (text, figures, tables).
        The introduction and the glossary step aside, so the step figure's draft tree stays above
        the fold of a projector's short screen rather than under 1.4x of reading matter."""
        with pn.io.hold():
            self.main.styles = {"zoom": str(PROJECTOR_ZOOM)} if on else {}
            self.intro.visible = self.guide_card.visible = not on
            self.viewer.keys_note.visible = not on
            # the status keeps two lines (a chat prompt's template would take eight; it scrolls): the
            # step figure's title repeats its numbers
            self.viewer.status.styles = {"max-height": "2.6em", "overflow-y": "auto"} if on else {}
            # the step figure at 1.15x: its token strip and tree together fit a projector's screen
            self.viewer.step_fig.styles = {"zoom": f"{PROJECTOR_FIGURE / PROJECTOR_ZOOM:.4f}"} if on else {}

    # -- the guided lesson -------------------------------------------------------------------------
    def _key(self, by) -> None:
        if self.lesson_toggle.value and self.lesson_steps:
            self.lesson_move(by)
        else:
            self.viewer.move(by)

    def lesson_mode(self, on: bool) -> list | None:
        """Lesson mode on: the lesson of the run on the page, at its first step; off: put away."""
        self.lesson_steps = lesson(self.trace) if on else None
        if on and self.lesson_steps is None:
            self.error("the lesson walks through a speculative run that drafted: choose a speculative method "
                       "(draft-model, prompt-lookup, eagle, ...) and press Run")
        with pn.io.hold():
            shown = bool(self.lesson_steps)
            self.lesson_card.visible = self.lesson_back.visible = self.lesson_next.visible = shown
            if shown:
                self.tabs.active = 0
                self.lesson_move("first")
        return self.lesson_steps

    def lesson_move(self, by) -> int:
        """One lesson step forward / back (1 / -1) or to the "first" / "last": the card's sentence and
        the player's round follow."""
        steps = self.lesson_steps
        if not steps:
            return 0
        at = {"first": 0, "last": len(steps) - 1}.get(by, self.lesson_at + (by if isinstance(by, int) else 0))
        self.lesson_at = at = min(max(at, 0), len(steps) - 1)
        step = steps[at]
        self.lesson_card.object = (f"<b>{html.escape(step.title)}</b> <small>({at + 1} of {len(steps)}; keys: "
                                   f"&larr; &rarr;)</small><br>{html.escape(step.text)}")
        self.lesson_back.disabled, self.lesson_next.disabled = at == 0, at == len(steps) - 1
        self.viewer.player.value = step.round
        return at

    def _fit_compare(self) -> None:
        """Offer the methods of the form's family (speculative or diffusion), two chosen to start."""
        family = runs.engine(self.form.method.value)
        options = [m for m in runs.method_names() if runs.engine(m) == family and family in runs.BASELINE]
        start = [m for m in compare_start(family, self.form.target.value or "") if m in options]
        # a new family, or a target that changes the start while the start is still chosen untouched
        if list(self.compare_methods.options) != options or list(self.compare_methods.value) == self._start:
            self.compare_methods.param.update(options=options, value=start)
        self._start = start

    def _form_changed(self) -> None:
        """Another method or target: the run on the page no longer matches the form."""
        self._fit_compare()
        self.intro.object = guide.INTRO[runs.engine(self.form.method.value)]
        # back on a pair and method with a recorded example, its prompt untouched: the example again
        # (rather than empty axes); otherwise the run on the page no longer matches the form
        if self.form.prompt.value in EXAMPLE_PROMPTS and self.show_example() is not None:
            pass
        elif self.viewer.trace is not None:
            self.viewer.clear("The form changed: press Run for a run with these settings.")
            self.download.disabled = True
        self.clear_error()

    # -- running ----------------------------------------------------------------------------------
    def job(self, method: str | None = None, progress=None, warmup: bool = False):
        """The decode the form describes, as a no-argument function for the worker. Raises
        ValueError now for what can be checked without a model (empty prompt, bad extras).
        warmup=True: a 2-token run that loads the models and runs their first forwards, with a
        history of its own (the session's suffix history never sees it)."""
        args = self.form.request(method, warmup)
        if "history" in runs.takes(args["method"]):
            args["history"] = SuffixHistory() if warmup else self.history
        return lambda: runs.run_one(progress=progress, **args)

    def run_now(self) -> Trace | None:
        """Run the form's decode in this thread (tests, notebooks) and show it."""
        try:
            trace = self.job()()
        except (ValueError, ModelLoadError, TraceError) as e:
            self.run_failed(e)
            return None
        self.show_trace(trace)
        return trace

    async def run_async(self) -> Trace | None:
        """What the Run button does: decode on the worker, keep the page live, move the bar."""
        done = [0]
        try:
            fn = self.job(progress=lambda n: done.__setitem__(0, done[0] + n))
        except ValueError as e:
            self.run_failed(e)
            return None
        self._busy(True, self.form.total())
        try:
            fut = asyncio.wrap_future(runs.submit(fn))
            while not fut.done():
                self._tick(done[0])
                await asyncio.wait([fut], timeout=0.25)
            trace = fut.result()
        except (ValueError, ModelLoadError, TraceError) as e:
            self.run_failed(e)
            return None
        except Exception as e:   # a bug, not bad input: still say so in the page and keep the session
            self.run_failed(f"the run failed unexpectedly: {type(e).__name__}: {e}")
            return None
        finally:
            self._busy(False)
        self.show_trace(trace)
        return trace

    async def _on_run(self, event=None):
        await self.run_async()

    def _busy(self, on: bool, total: int = 1) -> None:
        with pn.io.hold():
            self._set_busy(on, total)

    def _set_busy(self, on: bool, total: int) -> None:
        self.run_button.disabled = self.compare_button.disabled = on
        self.progress.visible = self.queue_note.visible = on
        self.progress.max, self.progress.value = max(total, 1), 0
        if on:
            self.queue_note.object = LOADING      # until the first token (a stale count would show)
            self.clear_error()

    def _tick(self, done: int) -> None:
        ahead = runs.queued()
        with pn.io.hold():
            self.progress.value = min(done, self.progress.max)
            # `ahead` counts runs not yet started, this one included while it waits
            self.queue_note.object = (f"queued: {ahead} run(s) waiting to start" if ahead and not done
                                      else LOADING if not done else f"{done} of {self.progress.max} tokens")

    # -- showing ----------------------------------------------------------------------------------
    def show_trace(self, trace: Trace) -> None:
        """Put a trace (a fresh run or an upload) on the page: status, player, figures."""
        # one batch: sent piecemeal from an async callback, Panel 1.9 lost some of these updates
        # (the detail and the step figure stayed empty while the status arrived)
        with pn.io.hold():
            try:
                self.viewer.show(trace)
            except ValueError as e:     # a trace of an engine with no step view, or with no steps
                self.error(e)
                return
            self.clear_error()
            self.download.disabled = False
            self.download.filename = runs.default_path(trace).name
        if self.lesson_toggle.value:                # the lesson follows the run on the page
            self.lesson_mode(True)

    def show_step(self, step: int) -> None:
        self.viewer.show_step(step)

    def run_failed(self, e) -> None:
        """A run the form asked for failed: say why, and take the previous run off the page so it
        is not read as this run's result (a failed upload leaves the page as it was)."""
        with pn.io.hold():
            self.viewer.clear("No run: the last one failed (the message above says why).")
            self.download.disabled = True
            self.error(e)

    def clear_error(self) -> None:
        # emptied as well as hidden, so what the page holds is what the user sees
        with pn.io.hold():
            self.alert.visible = False
            self.alert.object = ""

    def error(self, e) -> None:
        with pn.io.hold():
            self.alert.object = html.escape(str(e))
            self.alert.visible = True

    # -- compare ----------------------------------------------------------------------------------
    def compare_job(self):
        """The comparison as a no-argument function for the worker -> (traces, the ar trace, errors).
        `ar` (plain decoding, one target forward per token) always runs: it is the speed-up's
        reference and, when greedy, the lossless check's. Every method first runs once untimed, so
        no timing includes loading models or the first forwards; then the methods run interleaved,
        `compare_repeats` times each (speclab.bench.timing), and the result is a timing.Interleaved.
        A method with a history (suffix) starts every timed run from the session's history as it
        was, so no run drafts from an earlier run's answer to this same prompt."""
        family = runs.engine(self.form.method.value)
        if family not in runs.BASELINE:
            raise ValueError("a DAG decodes in one forward: choose dag-all in the form and press Run, and the Step "
                             "tab shows every strategy's path and output side by side")
        base, ref = runs.BASELINE[family]
        chosen = [m for m in self.compare_methods.value if runs.engine(m) == family and m != base]
        if not chosen:
            raise ValueError(f"choose at least one method to compare with {ref}")
        order = [base, *chosen]
        jobs = {m: self._timed_job(m) for m in order}            # checks every method's extras now
        warm = [self.job(m, warmup=True) for m in order]
        repeats = int(self.compare_repeats.value)

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
        return work

    def _timed_job(self, method: str):
        """One timed run of a comparison, recording nothing beyond its rounds' counts and times
        (recording is for the run shown, not for timing); a method with a history gets a copy of
        the session's."""
        args = dict(self.form.request(method), record=None)
        if "history" in runs.takes(method):
            return lambda: runs.run_one(**dict(args, history=runs.copy_history(self.history)))
        return lambda: runs.run_one(**args)

    def compare_now(self) -> list[dict]:
        try:
            result = self.compare_job()()
        except (ValueError, ModelLoadError) as e:
            self.error(e)
            return []
        return self._show_compare(*result)

    async def _on_compare(self, event=None):
        try:
            work = self.compare_job()
        except ValueError as e:
            self.error(e)
            return
        self._busy(True, 1)
        base = runs.BASELINE.get(runs.engine(self.form.method.value), ("ar",))[0]
        self.queue_note.object = (f"running {base} and {', '.join(self.compare_methods.value)}: each once untimed, "
                                  f"then {self.compare_repeats.value} timed runs each, interleaved")
        try:
            result = await asyncio.wrap_future(runs.submit(work))
        except Exception as e:
            self.error(f"the comparison failed unexpectedly: {type(e).__name__}: {e}")
            return
        finally:
            self._busy(False)
        self._show_compare(*result)

    def _show_compare(self, traces, reference, errors, measured=None) -> list[dict]:
        with pn.io.hold():
            return self._fill_compare(traces, reference, errors, measured)

    def _fill_compare(self, traces, reference, errors, measured=None) -> list[dict]:
        family = runs.engine(self.form.method.value)
        base, ref = runs.BASELINE.get(family, ("ar", "ar"))
        self.compare_timing = measured
        spread = runs.compare_speedups(measured, base) if measured is not None and reference is not None else None
        self.compare_table = runs.compare_rows(traces, reference, ref, measured, base)
        self.compare_out.object = runs.rows_html(self.compare_table) if traces else ""
        chart = compare_chart(traces, reference, ref, spread) if traces else None
        self.compare_chart.object, self.compare_chart.visible = chart, chart is not None
        models = runs.cost_models(traces, reference, spread) if ref == "ar" and reference is not None else {}
        self.compare_cost.object = costmodel_figure(models) if models else None
        first = next(iter(models.values()), None)
        self.compare_explorer.object = costmodel_explorer_figure(first) if first is not None else None
        self.compare_explorer.visible = first is not None
        self.compare_cost.visible = bool(models)
        lanes = [t for t in [reference, *traces.values()] if t is not None and t.rounds]
        self.race_out.object = race_iframe(lanes) if len(lanes) > 1 else ""
        if errors:
            self.error("; ".join(f"{m}: {e}" for m, e in errors.items()))
        else:
            self.clear_error()
        return self.compare_table

    # -- traces in and out -------------------------------------------------------------------------
    def open_upload(self, data: bytes | None, filename: str | None = None) -> Trace | None:
        if data is None:
            return None
        try:
            trace = runs.trace_from_upload(data, filename, self.upload_limit)
        except TraceError as e:
            self.error(e)
            return None
        self.show_trace(trace)
        self.tabs.active = 0
        return trace

    def _download(self):
        return io.BytesIO(runs.trace_json(self.trace)) if self.trace is not None else None

    # -- URL arguments -----------------------------------------------------------------------------
    def apply_args(self, args: dict[str, list[bytes]]) -> bool:
        """Prefill from ?prompt=&method=&target=&draft=&k=&max_new_tokens=&temperature=&seed=
        &compare=m1,m2&repeats=N (timed runs per method); True when ?run=1 asks for a run on load."""
        get = {k: v[0].decode("utf-8", "replace") for k, v in args.items() if v}
        try:
            self.form.apply_args(get)
            if "compare" in get:
                self.compare_methods.value = [m for m in get["compare"].split(",") if m]
            if "repeats" in get:
                self.compare_repeats.value = min(max(int(get["repeats"]), self.compare_repeats.start),
                                                 self.compare_repeats.end)
        except (ValueError, TypeError) as e:
            self.error(f"could not use the URL arguments: {e}")
            return False
        return get.get("run") == "1"


def app():
    """A fresh dashboard for one session (what `panel serve` and `speclab serve` call)."""
    dash = Dashboard()
    if pn.state.curdoc is not None and pn.state.session_args and dash.apply_args(pn.state.session_args):
        pn.state.onload(dash._on_run)
    return dash.view


if pn.state.served:
    app().servable(title="speclab dashboard")
