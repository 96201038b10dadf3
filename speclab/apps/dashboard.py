"""The served dashboard: run a method on a prompt, step through its rounds (speculative), denoising
steps (diffusion) or strategies (DAG), compare methods, and open or save traces.
`panel serve speclab/apps/dashboard.py` or `speclab serve`.

Panels composed here: the parameter form (form.py), the trace viewer (viewer.py, stepping figures
in place like the Jupyter player), the Compare tab (compare.py), the lesson, and the run, upload
and save between them. One `Dashboard` per browser session holds everything that session sees
(widgets, the current trace, the last comparison, the suffix method's history of this session's
earlier requests); nothing about a run lives in module globals, so two users never see each
other's runs. Decodes go to the server's RunService (service.py: workers, a model's turn, the
queue, limits, process settings), awaited from an async callback so the page stays live, shows
its place in line and its estimated wait, then moves the progress bar while the model works.
Cancel (beside Run) drops the page's request from the queue or stops it at its next step, as a
closed page's requests are; a run stopped so, or by the server's time budget, says so in one line
and draws nothing. A figure that fails to draw says which, in one line (the traceback goes to the
server's log). Figures come from speclab.figures, exactly as in the notebook.

URL arguments prefill the form and can start a run, so a link reproduces a run (`speclab serve`
serves it at /, `panel serve speclab/apps/dashboard.py` at /dashboard):
    /?prompt=def%20f(x):&method=prompt-lookup&max_new_tokens=8&compare=ar,suffix&run=1
"""
from __future__ import annotations

import asyncio
import html
import inspect
import io
import logging
import time
import traceback

import panel as pn

from speclab.apps import guide, runs
from speclab.apps.categories import CategoriesPanel
from speclab.apps.compare import DIFFUSION_DEMO, ComparePanel, compare_start  # noqa: F401 (tests, scripts)
from speclab.apps.form import EXAMPLE_PROMPTS, Form
from speclab.apps.service import (Cancelled, RunService, Ticket, about, default_service, draw_turn, ordinal,
                                  waited)
from speclab.apps.viewer import Viewer
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.figures.views import lesson_of
from speclab.models.zoo import ModelLoadError
from speclab.trace import Trace, TraceError

pn.extension("plotly")

PROJECTOR_ZOOM = 1.4
PROJECTOR_FIGURE = 1.15     # the step figure's own scale in projector mode: strip and tree on one screen
# what the progress line says before the first token: a model's first run loads it (seconds), and
# every run reads its prompt first, so "0 of 64 tokens" would look like a hang
LOADING = "loading the model and reading the prompt (a model's first run loads it: a few seconds)"
log = logging.getLogger("speclab.apps")


class Dashboard:
    """Everything one session sees: the form (form.py), the viewer (viewer.py), the Compare tab
    (compare.py), and the runs between them. `view` is the Panel layout; the methods are its
    callbacks, and tests call them directly (`run_now`, `open_upload`, `compare_now`, `show_step`).
    service: the server's RunService (default: the process's)."""

    def __init__(self, upload_limit: int = runs.MAX_UPLOAD_BYTES, service: RunService | None = None):
        self.upload_limit = upload_limit
        self.service = service or default_service()
        self.ticket: Ticket | None = None   # this session's request in the service, while it waits or runs
        self.history = SuffixHistory()      # this session's earlier requests, for suffix (never another's)
        self.viewer = Viewer()
        self.form = Form(runs.zoo_models())
        w = pn.widgets
        self.run_button = w.Button(name="Run", button_type="primary", css_classes=["speclab-run"])
        # stops this page's request, queued or running (Run's and Compare's); enabled while one is
        self.cancel_button = w.Button(name="Cancel", button_type="warning", disabled=True, width=90,
                                      css_classes=["speclab-cancel"])
        self.progress = w.Progress(name="progress", value=0, max=1, visible=False, bar_color="primary")
        self.queue_note = pn.pane.Markdown("", visible=False, css_classes=["speclab-queue"])
        # the request's first place in line and when (while it waits), then what the page says of its wait
        self._line: tuple[int, float] | str | None = None
        self.alert = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["speclab-alert"])
        # -- compare: methods of the form's family, against that family's baseline (compare.py) ----
        self.compare = c = ComparePanel(self)
        self.compare_methods, self.compare_repeats, self.compare_button = c.methods, c.repeats, c.button
        self.compare_out, self.compare_chart, self.race_out = c.out, c.chart, c.race
        self.compare_cost, self.compare_explorer = c.cost, c.explorer
        # -- traces in and out -------------------------------------------------------------------
        self.upload = w.FileInput(accept=".json", multiple=False, css_classes=["speclab-upload"])
        self.download = w.FileDownload(callback=self._download, filename="trace.json", label="Save trace (JSON)",
                                       disabled=True, button_type="default", css_classes=["speclab-download"])

        self.run_button.on_click(self._on_run)
        self.cancel_button.on_click(lambda e: self.cancel())
        self.upload.param.watch(lambda e: self.open_upload(e.new, self.upload.filename), "value")
        self.projector = w.Toggle(name="projector: large text", value=False, width=170,
                                  css_classes=["speclab-projector"])
        # the guided lesson over the run on the page (its engine View's: speclab/figures/lessons.py)
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
        a real run before any model is loaded, and so does every method chosen later. A feature head
        the zoo ships for another target only (falcon, flexdraft: the toy code-target) moves the form
        to that target, where the method runs, and opens on its example there."""
        f = self.form
        trace = guide.example(f.method.value, f.target.value, f.draft.value if f.draft.visible else None)
        if trace is None and f.draft.visible and f.draft.disabled and f.draft.value.startswith("no "):
            for target in guide.example_targets(f.method.value):
                if target in f.target.options:
                    f.target.value = target           # fits the form (its head, its prompt), then back here
                    return self.trace if self.trace is not None and self.trace.method == f.method.value else None
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
        form = self.form.column(pn.Row(self.run_button, self.cancel_button), self.progress, self.queue_note)
        compare = self.compare.column()
        files = pn.Column("Open a trace saved by `speclab run --trace` or by this page:", self.upload,
                          self.download)
        # which tasks speculation helps: the category bench's newest JSON (apps/categories.py)
        self.categories = CategoriesPanel()
        self.tabs = pn.Tabs(("Step", self.viewer.step_column()), ("Summary", self.viewer.summary_column()),
                            ("Compare", compare), ("Categories", self.categories.column()), ("Traces", files),
                            dynamic=False)
        self.guide_card = guide_card = pn.Card(pn.pane.Markdown(guide.GLOSSARY), title="Glossary", collapsed=True,
                             sizing_mode="stretch_width", css_classes=["speclab-glossary"])
        self.intro = pn.pane.Markdown(guide.intro(self.form.method.value), css_classes=["speclab-intro"],
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
        self.lesson_steps = lesson_of(self.trace) if on else None
        if on and self.lesson_steps is None:
            self.error("this run has no lesson to walk: a speculative run that drafted, a diffusion run or a DAG "
                       "run has one; choose such a method (prompt-lookup, eagle, dllm-threshold, ...) and press Run")
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

    def _form_changed(self) -> None:
        """Another method or target: the run on the page no longer matches the form."""
        self.compare.fit()
        self.intro.object = guide.intro(self.form.method.value)
        # back on a pair and method with a recorded example, its prompt untouched: the example again
        # (rather than empty axes); otherwise the run on the page no longer matches the form
        if self.form.prompt.value in EXAMPLE_PROMPTS and self.show_example() is not None:
            pass
        elif self.viewer.trace is not None:
            self.viewer.clear("The form changed: press Run for a run with these settings.")
            self.download.disabled = True
        self.clear_error()

    # -- running ----------------------------------------------------------------------------------
    def request(self, method: str | None = None, warmup: bool = False) -> dict:
        """runs.run_one's keywords for the decode the form describes, with this session's suffix
        history. Raises ValueError now for what can be checked without a model (empty prompt, bad
        extras, past the service's limits). warmup=True: a 2-token run that loads the models and
        runs their first forwards, with a history of its own (the session's never sees it)."""
        args = self.form.request(method, warmup)
        self.service.limits.check(args)
        if "history" in runs.takes(args["method"]):
            args["history"] = SuffixHistory() if warmup else self.history
        return args

    def job(self, method: str | None = None, progress=None, warmup: bool = False):
        """The decode the form describes, as a no-argument function (a comparison's warm-ups)."""
        args = self.request(method, warmup)
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
        """What the Run button does: the decode goes to the service, the page stays live, shows its
        place in line, then moves the bar."""
        done = [0]
        try:
            args = self.request()
        except ValueError as e:
            self.run_failed(e)
            return None
        try:
            ticket = self.service.submit_run(args, progress=lambda n: done.__setitem__(0, done[0] + n), owner=self)
            trace = await self.wait(ticket, self.form.total(), done=done)
        except asyncio.CancelledError:            # the page went away: nothing to show
            return None
        except Cancelled as e:                    # Cancel, or past the time budget: one line, nothing drawn
            self.run_stopped(self.stopped_line(e, done[0], self.form.total()))
            return None
        except (ValueError, ModelLoadError, TraceError) as e:
            self.run_failed(e)
            return None
        except Exception as e:   # a bug, not bad input: still say so in the page and keep the session
            self.run_failed(f"the run failed unexpectedly: {type(e).__name__}: {e}")
            return None
        async with draw_turn():
            self.show_trace(trace)
        return trace

    async def wait(self, ticket: Ticket, total: int, note: str | None = None, done=None):
        """Await a request of this session: the page shows its place in line and estimated wait
        while it waits, then `note` or the tokens done (`done[0]`) while it runs. -> its result (or
        raises its error; Cancelled where Cancel dropped it from the queue or stopped it)."""
        self.ticket = ticket
        self._busy(True, total)
        try:
            fut = asyncio.wrap_future(ticket.future)
            while not fut.done():
                place = self.service.position(ticket)
                if note is not None and not place:
                    with pn.io.hold():
                        self.queue_note.object = note
                else:
                    self._tick(done[0] if done else 0, place, self.service.wait_s(ticket) if place else None)
                # a running request moves its bar 4 times a second; a waiting one looks once a second
                # (thirty pages in line each waking 4 times a second keep the server's one loop busy)
                await asyncio.wait([fut], timeout=1.0 if place else 0.25)
            if ticket.future.cancelled():               # dropped from the queue before it started
                raise Cancelled("cancelled")
            return fut.result()
        finally:
            self.ticket = None
            self._busy(False)

    def cancel(self) -> bool:
        """Cancel: this page's request leaves the queue, or stops at its next step. False: none."""
        return self.ticket is not None and self.service.cancel(self.ticket)

    @staticmethod
    def stopped_line(e: Cancelled, done: int = 0, total: int = 0, what: str = "the run", button: str = "Run") -> str:
        """The one line a page shows for a request Cancel or a budget stopped."""
        if e.budget is not None:
            return str(e)
        where = f" after {done} of {total} tokens" if done else ""
        return f"cancelled: {what} stopped{where} at your request; nothing is drawn. Press {button} to start again."

    def run_stopped(self, line: str) -> None:
        """A run stopped before its end: the line, and nothing of it (or of the run before) drawn."""
        with pn.io.hold():
            self.viewer.clear("No run: the last one was stopped (the line above says why).")
            self.download.disabled = True
            self.error(line, kind="warning")

    def close(self) -> int:
        """The page went away (its session ended): drop its queued requests and stop its running
        one. -> how many."""
        return self.service.cancel_owner(self)

    async def _on_run(self, event=None):
        await self.run_async()

    def _busy(self, on: bool, total: int = 1) -> None:
        with pn.io.hold():
            self._set_busy(on, total)

    def _set_busy(self, on: bool, total: int) -> None:
        self.run_button.disabled = self.compare_button.disabled = on
        self.cancel_button.disabled = not on
        self.progress.visible = self.queue_note.visible = on
        self.progress.max, self.progress.value = max(total, 1), 0
        self._line = None                   # this request has not waited in line (yet)
        if on:
            self.queue_note.object = LOADING      # until the first token (a stale count would show)
            self.clear_error()

    def _tick(self, done: int, place: int | None = None, wait_s: float | None = None) -> None:
        """place: the request's place in the service's queue (1 = next to start; 0 or None: running);
        wait_s: its estimated wait (None: no run has finished here yet to time)."""
        with pn.io.hold():
            self.progress.value = min(done, self.progress.max)
            if place:
                load = self.service.load()
                self._line = self._line or (place, time.monotonic())
                self.queue_note.object = (f"{ordinal(place)} in line, {about(wait_s)}: {load['running']} run(s) "
                                          f"going on {load['workers']} worker(s); Cancel leaves the queue")
            else:   # running: the line keeps the page's place in the queue, so a page that missed the
                # waiting line (a busy browser, a wait shorter than one update) is still told it
                if not isinstance(self._line, str):     # its first running update: the wait ends
                    self._line = waited(self._line)
                now = f"{done} of {self.progress.max} tokens" if done else LOADING
                self.queue_note.object = f"{now}; {self._line}"

    # -- showing ----------------------------------------------------------------------------------
    def show_trace(self, trace: Trace) -> None:
        """Put a trace (a fresh run or an upload) on the page: status, player, figures."""
        # one batch: sent piecemeal from an async callback, Panel 1.9 lost some of these updates
        # (the detail and the step figure stayed empty while the status arrived)
        with pn.io.hold():
            if self.viewer.view is None:
                # a session's first trace: Viewer.show moves the temperature slider before it has a
                # view, and the slider's watcher steps a view that is not there yet (AttributeError)
                self.viewer.dist_temp.value = trace.sampling.temperature or 1.0
            try:
                self.viewer.show(trace)
            except ValueError as e:     # a trace of an engine with no step view, or with no steps
                if self.viewer.trace is trace:           # failed mid-draw: nothing half-drawn
                    self.viewer.clear("No run shown: a figure failed to draw (the line above says which).")
                self.error(e)
                return
            except Exception as e:      # a figure's bug: one line naming it here, its traceback in the log
                name = failing_figure(trace, e)
                log.error("drawing a %s trace failed in %s", trace.method, name or "the viewer", exc_info=e)
                self.viewer.clear("No run shown: a figure failed to draw (the line above says which).")
                self.download.disabled = True
                why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                self.error(f"the figure {name!r} failed to draw this {trace.method} run ({why}); the server's log has "
                           "the traceback" if name else
                           f"drawing this {trace.method} run failed ({why}); the server's log has the traceback")
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

    def error(self, e, kind: str = "danger") -> None:
        """One line in the alert: an error ("danger"), or a run stopped ("warning")."""
        with pn.io.hold():
            self.alert.alert_type = kind
            self.alert.object = html.escape(str(e))
            self.alert.visible = True

    # -- compare (compare.py) ----------------------------------------------------------------------
    def compare_now(self) -> list[dict]:
        return self.compare.now()

    @property
    def compare_table(self) -> list[dict]:
        return self.compare.table

    @property
    def compare_timing(self):
        return self.compare.timing

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


def failing_figure(trace: Trace, e: BaseException) -> str | None:
    """The name of the figure of `trace`'s view whose function raised `e` (read off its traceback),
    else the innermost speclab.figures function it went through, else None."""
    from speclab.figures import view_of
    codes = {frame.f_code for frame, _ in traceback.walk_tb(e.__traceback__)}
    try:
        view = view_of(trace)
        specs = [*view.step, *([view.run_strip] if view.run_strip else []), *view.summary]
    except Exception:
        specs = []
    for spec in specs:
        for fn in (spec.fn, spec.frame):
            code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
            if code in codes:
                return spec.name
    inner = [frame for frame, _ in traceback.walk_tb(e.__traceback__) if ".figures." in frame.f_globals.get("__name__", "")]
    return f"{inner[-1].f_globals['__name__']}.{inner[-1].f_code.co_name}" if inner else None


def app(service: RunService | None = None, on_session=None):
    """A fresh dashboard for one session (what `panel serve` and `speclab serve` call), on the
    server's service; its queued requests are cancelled when the session ends. on_session(dash):
    called with each new session's Dashboard (tests drive served sessions through it)."""
    dash = Dashboard(service=service)
    if pn.state.curdoc is not None:
        pn.state.on_session_destroyed(lambda context: dash.close())
        if pn.state.session_args and dash.apply_args(pn.state.session_args):
            pn.state.onload(dash._on_run)
    if on_session is not None:
        on_session(dash)
    return dash.view


if pn.state.served:
    app().servable(title="speclab dashboard")
