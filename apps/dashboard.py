"""The served dashboard: run a method on a prompt, step through its rounds (speculative), denoising
steps (diffusion) or strategies (DAG), compare methods, and open or save traces.
`panel serve apps/dashboard.py` or `speclab serve`.

One `Dashboard` per browser session holds everything that session sees (widgets, the current
trace, the last comparison, the suffix method's history of this session's earlier requests);
nothing about a run lives in module globals, so two users never see each other's runs. Models are
shared by the process (`load_shared`), and decodes go through one worker thread (apps/runs.py says
why), awaited from an async callback so the page stays live and the progress bar moves while the
model works. Figures come from speclab.figures, the step detail
table from speclab.widgets, exactly as in the notebook.

URL arguments prefill the form and can start a run, so a link reproduces a run (`speclab serve`
serves it at /, `panel serve apps/dashboard.py` at /dashboard):
    /?prompt=def%20f(x):&method=prompt-lookup&max_new_tokens=8&compare=ar,suffix&run=1
"""
from __future__ import annotations

import asyncio
import html
import io
import json
import os

import panel as pn

from speclab.apps import runs
from speclab.apps.status import player_css, status_html
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.figures.distributions import distributions
from speclab.figures.race import race_iframe
from speclab.figures import (acceptance_summary, confidence_bands, decoding_order, round_strip, step_figure,
                             step_label, step_title, timing)
from speclab.metrics import n_steps
from speclab.models.zoo import ModelLoadError
from speclab.trace import Trace, TraceError
from speclab.widgets.detail import detail_html

pn.extension("plotly")

DEFAULT_PROMPT = "def parse(line):"
CHAT_PROMPT = "Explain in a few sentences why the sky is blue."
# the pair the page opens on: the real model and its trained draft when installed, else the toy zoo;
# SPECLAB_DASHBOARD_TARGET=code-target (the tests set it) keeps the page on the tiny models
REAL_PAIR, TOY_PAIR = ("smollm2-135m", "smollm2-draft"), ("code-target", "code-draft")
DAG_PROMPTS = {"dates-dat": "2024-03-05", "numwords-dat": "305"}
DLLM_PROMPTS = {"digits-dllm": "SUM 27=", "code-dllm": "def add(a, b):", "smollm2-dllm": CHAT_PROMPT}
# models whose example prompt is a user message in their chat template
CHAT_MODELS = {*REAL_PAIR, "smollm2-dllm"}
# the diffusion model the page switches to: the block-diffusion SmolLM2 beside the real pair
REAL_DLLM, TOY_DLLM = "smollm2-dllm", "code-dllm"
EXAMPLE_PROMPTS = {DEFAULT_PROMPT, CHAT_PROMPT, "2024-03-05", *DAG_PROMPTS.values(), *DLLM_PROMPTS.values()}
SUMMARY = {"speculative": (round_strip, acceptance_summary, timing),   # Summary tab figures by engine
           "diffusion": (confidence_bands, decoding_order)}
SUMMARY_HEIGHTS = (260, 380, 300)
# what each of the player's nine buttons does ({} is the step's name: round, step, strategy)


def _config(model: str, key: str) -> int:
    cfg = runs.ZOO_DIR / model / "config.json"
    return json.loads(cfg.read_text()).get(key, 0) if cfg.exists() else 0


def _layers(model: str) -> int:
    return _config(model, "num_hidden_layers")


class Dashboard:
    """Everything one session sees. `view` is the Panel layout; the methods are its callbacks,
    and tests call them directly (`run_now`, `open_upload`, `compare_now`, `show_step`)."""

    def __init__(self, upload_limit: int = runs.MAX_UPLOAD_BYTES):
        self.upload_limit = upload_limit
        self.trace: Trace | None = None
        self.compare_table: list[dict] = []
        self.history = SuffixHistory()      # this session's earlier requests, for suffix (never another's)
        kinds = runs.zoo_models()
        self.kinds = kinds
        w = pn.widgets
        # -- the form ----------------------------------------------------------------------------
        self.method = w.Select(name="method", options=runs.method_names(), value="draft-model")
        pair = REAL_PAIR if all(n in kinds["causal"] for n in REAL_PAIR) else TOY_PAIR
        pair = (os.environ.get("SPECLAB_DASHBOARD_TARGET") or pair[0],
                pair[1] if not os.environ.get("SPECLAB_DASHBOARD_TARGET") else TOY_PAIR[1])
        self.default_target = pair[0]
        self.target = w.Select(name="target", options=kinds["causal"], value=_pick(kinds["causal"], pair[0]))
        self.draft = w.Select(name="draft", options=kinds["causal"], value=_pick(kinds["causal"], pair[1]))
        chat = self.target.value in CHAT_MODELS
        self.prompt = w.TextAreaInput(name="prompt", value=CHAT_PROMPT if chat else DEFAULT_PROMPT, height=80,
                                      css_classes=["speclab-prompt"])
        self.chat = w.Checkbox(name="chat: the prompt is a user message (the model's chat template)", value=chat)
        self.k = w.IntSlider(name="k (draft length)", start=1, end=16, value=4)
        # 0 means "off" (fixed draft length): a slider cannot hold None
        self.threshold = w.FloatSlider(name="threshold (0 = off)", start=0.0, end=0.95, step=0.05, value=0.0)
        self.exit_layer = w.Select(name="exit layer", options=["auto"])
        self.budget = w.IntSlider(name="node budget", start=2, end=32, value=10)
        self.gen_length = w.IntSlider(name="gen length (canvas slots)", start=8, end=128, step=8, value=32)
        self.block_length = w.Select(name="block length", options=blocks(32), value=32)
        self.max_new_tokens = w.IntSlider(name="max new tokens", start=1, end=128, value=24)
        self.temperature = w.FloatSlider(name="temperature", start=0.0, end=1.5, step=0.05, value=0.0)
        self.seed = w.IntInput(name="seed", value=0, start=0)
        self.extra = w.TextInput(name="other parameters (name=value, ...)", placeholder="schedule=heuristic")
        self.run_button = w.Button(name="Run", button_type="primary", css_classes=["speclab-run"])
        self.progress = w.Progress(name="progress", value=0, max=1, visible=False, bar_color="primary")
        self.queue_note = pn.pane.Markdown("", visible=False)
        self.alert = pn.pane.Alert("", alert_type="danger", visible=False, css_classes=["speclab-alert"])
        self.status = pn.pane.HTML("No run yet: choose a method and press Run, or open a saved trace.",
                                   css_classes=["speclab-status"])
        # -- the step view -----------------------------------------------------------------------
        # the player's own readout is off: it went stale when a new trace loaded, and counted from 0
        self.player = w.Player(name="", start=0, end=1, value=0, interval=900, loop_policy="once",
                               show_value=False, show_loop_controls=False, stylesheets=[player_css("round")],
                               css_classes=["speclab-player"])
        self.step_text = pn.pane.HTML("", css_classes=["speclab-step-text"])
        self.step_fig = pn.pane.Plotly(None, css_classes=["speclab-step"], sizing_mode="stretch_width")
        self.detail = pn.pane.HTML("", css_classes=["speclab-detail"])
        # p and q of the round's key draft node (record="full"), re-tempered on demand
        self.dist_fig = pn.pane.Plotly(None, css_classes=["speclab-dist"], sizing_mode="stretch_width", visible=False)
        self.dist_temp = w.FloatSlider(name="show p and q at temperature", start=0.1, end=2.0, step=0.05, value=1.0,
                                       visible=False, width=300)
        self.dist_temp.param.watch(lambda e: self._show_distributions(), "value")
        self.summary_figs = [pn.pane.Plotly(None, height=h, sizing_mode="stretch_width", visible=False)
                             for h in SUMMARY_HEIGHTS]
        self.summary_note = pn.pane.Markdown("Summary figures are for speculative and diffusion runs; the Step "
                                             "tab shows every strategy of a DAG run.", visible=False)
        self.summary = pn.Column(self.summary_note, *self.summary_figs)
        # -- compare -----------------------------------------------------------------------------
        spec = [m for m in runs.method_names() if runs.engine(m) == "speculative"]
        self.compare_methods = w.MultiChoice(name="methods to compare", options=spec,
                                             value=[m for m in ("draft-model", "prompt-lookup") if m in spec])
        self.compare_button = w.Button(name="Compare", button_type="primary", css_classes=["speclab-compare"])
        self.compare_out = pn.pane.HTML("", css_classes=["speclab-compare-out"])
        # the race: ar and each compared method typing their answers at the pace they ran
        self.race_out = pn.pane.HTML("", css_classes=["speclab-race"], sizing_mode="stretch_width")
        # -- traces in and out -------------------------------------------------------------------
        self.upload = w.FileInput(accept=".json", multiple=False, css_classes=["speclab-upload"])
        self.download = w.FileDownload(callback=self._download, filename="trace.json", label="Save trace (JSON)",
                                       disabled=True, button_type="default", css_classes=["speclab-download"])

        self.run_button.on_click(self._on_run)
        self.compare_button.on_click(self._on_compare)
        self.player.param.watch(lambda e: self.show_step(e.new), "value")
        self.upload.param.watch(lambda e: self.open_upload(e.new, self.upload.filename), "value")
        self.method.param.watch(lambda e: self._fit_form(), "value")
        self.target.param.watch(lambda e: self._fit_form(), "value")
        self.target.param.watch(lambda e: self._fit_target(e.old, e.new), "value")
        self.gen_length.param.watch(lambda e: self._fit_blocks(), "value")
        self._fit_form()
        self.view = self._layout()

    # -- layout -----------------------------------------------------------------------------------
    def _layout(self):
        form = pn.Column(
            "## speclab", self.method, self.target, self.draft, self.prompt, self.chat,
            self.k, self.threshold, self.exit_layer, self.budget, self.gen_length, self.block_length,
            self.max_new_tokens, self.temperature,
            self.seed, self.extra, self.run_button, self.progress, self.queue_note, width=330)
        step = pn.Column(pn.Row(self.player, self.step_text), self.step_fig, self.detail, self.dist_temp,
                         self.dist_fig)
        compare = pn.Column(
            "Runs every chosen method on the prompt and settings on the left, plus `ar` (one target forward "
            "per token) as the reference: speed-up = ar's wall time / the method's, tau = new tokens / target "
            "forwards, alpha = accepted / drafted draft tokens. Each method first runs once untimed, so model "
            "loading and warm-up are not in the timings.",
            self.compare_methods, self.compare_button, self.compare_out, self.race_out)
        files = pn.Column("Open a trace saved by `speclab run --trace` or by this page:", self.upload,
                          self.download)
        self.tabs = pn.Tabs(("Step", step), ("Summary", self.summary), ("Compare", compare),
                            ("Traces", files), dynamic=False)
        return pn.Row(form, pn.Column(self.alert, self.status, self.tabs, sizing_mode="stretch_width"),
                      sizing_mode="stretch_width")

    def _fit_form(self) -> None:
        """Show only the knobs the chosen method takes; DAG and diffusion methods get their models."""
        m = self.method.value
        engine, dag = runs.engine(m), runs.is_dag(m)
        models = self.kinds[runs.model_kind(m)]
        if list(self.target.options) != models:
            self.target.options = models
            real = self.default_target in REAL_PAIR
            self.target.value = _pick(models, (REAL_DLLM if real else TOY_DLLM) if engine == "diffusion"
                                      else self.default_target)
            self.prompt.value = self.example_prompt(self.target.value)
        takes = runs.takes(m)
        for name in runs.KNOBS:
            getattr(self, name).visible = name in takes
        self.draft.visible = runs.needs_draft(m)
        self.chat.visible = self._chat_visible()
        self._fit_threshold(engine)
        self.max_new_tokens.visible = engine == "speculative"       # diffusion: gen length instead
        self.seed.visible = self.extra.visible = not dag
        n = _layers(self.target.value) if engine == "speculative" and self.target.value else 0
        opts = ["auto"] + [str(i) for i in range(1, n)]
        if list(self.exit_layer.options) != opts:
            self.exit_layer.options, self.exit_layer.value = opts, "auto"
        if engine == "diffusion" and self.target.value:
            self._fit_canvas(_config(self.target.value, "max_position_embeddings"))

    def _chat_visible(self) -> bool:
        """Speculative methods: always (any causal LM may have a chat template); diffusion: chat models."""
        engine = runs.engine(self.method.value)
        return engine == "speculative" or (engine == "diffusion" and self.target.value in CHAT_MODELS)

    def _fit_threshold(self, engine: str) -> None:
        """Speculative methods: 0 means off (a fixed draft length). Diffusion policies always use a
        threshold: the slider shows the one that runs (0.9 by default), never 0."""
        if engine == "diffusion" and self.threshold.start == 0.0:
            self.threshold.param.update(name="threshold (commit p >= it)", start=0.05, value=0.9)
        elif engine != "diffusion" and self.threshold.start != 0.0:
            self.threshold.param.update(name="threshold (0 = off)", start=0.0, value=0.0)

    def _fit_canvas(self, context: int) -> None:
        """Gen lengths the diffusion target can hold: its context window less room for a short prompt."""
        end = min(128, max(8, (context - 8) // 8 * 8)) if context else 128
        if self.gen_length.end != end:
            self.gen_length.param.update(end=end, value=min(self.gen_length.value, end))

    def example_prompt(self, target: str | None) -> str:
        """The prompt the page offers a target under the chosen method."""
        m = self.method.value
        if runs.is_dag(m):
            return DAG_PROMPTS.get(target, "2024-03-05")
        if runs.engine(m) == "diffusion":
            return DLLM_PROMPTS.get(target, DEFAULT_PROMPT)
        return CHAT_PROMPT if target in CHAT_MODELS else DEFAULT_PROMPT

    def _fit_target(self, old: str | None, new: str | None) -> None:
        """A chat model gets a question in its chat template, each model its own example prompt (only
        an untouched example prompt is swapped; a prompt the user wrote stays)."""
        was, now = old in CHAT_MODELS, new in CHAT_MODELS
        if was != now:
            self.chat.value = now
        self.chat.visible = self._chat_visible()
        if self.prompt.value in EXAMPLE_PROMPTS:
            self.prompt.value = self.example_prompt(new)

    def _fit_blocks(self) -> None:
        """Block lengths must divide the gen length: offer only those, keeping the choice if it fits."""
        opts = blocks(self.gen_length.value)
        if list(self.block_length.options) != opts:
            keep = self.block_length.value
            self.block_length.options = opts
            self.block_length.value = keep if keep in opts else opts[-1]

    # -- running ----------------------------------------------------------------------------------
    def _knobs(self) -> dict:
        return dict(k=self.k.value, threshold=self.threshold.value or None, budget=self.budget.value,
                    exit_layer="auto" if self.exit_layer.value == "auto" else int(self.exit_layer.value),
                    gen_length=self.gen_length.value, block_length=int(self.block_length.value))

    def _total(self) -> int:
        """Tokens the progress bar counts to."""
        engine = runs.engine(self.method.value)
        return {"dag": 1, "diffusion": self.gen_length.value}.get(engine, self.max_new_tokens.value)

    def job(self, method: str | None = None, progress=None, warmup: bool = False):
        """The decode the form describes, as a no-argument function for the worker. Raises
        ValueError now for what can be checked without a model (empty prompt, bad extras).
        warmup=True: a 2-token run that loads the models and runs their first forwards, with a
        history of its own (the session's suffix history never sees it)."""
        method = method or self.method.value
        prompt = self.prompt.value
        if not prompt or not prompt.strip():
            raise ValueError("empty prompt: type some text to continue")
        kw = runs.method_kwargs(method, self._knobs(), self.extra.value if not runs.is_dag(method) else "")
        if "history" in runs.takes(method):
            kw["history"] = SuffixHistory() if warmup else self.history
        if runs.engine(method) != "dag" and self.chat.value and self.chat.visible:
            kw["chat"] = True
        args = dict(target=self.target.value, prompt=prompt, method=method, draft=self.draft.value,
                    max_new_tokens=min(2, self.max_new_tokens.value) if warmup else self.max_new_tokens.value,
                    temperature=self.temperature.value,
                    seed=self.seed.value or 0, progress=progress, **kw)
        return lambda: runs.run_one(**args)

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
        self._busy(True, self._total())
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
            self.clear_error()

    def _tick(self, done: int) -> None:
        ahead = runs.queued()
        with pn.io.hold():
            self.progress.value = min(done, self.progress.max)
            # `ahead` counts runs not yet started, this one included while it waits
            self.queue_note.object = (f"queued: {ahead} run(s) waiting to start" if ahead and not done
                                      else f"{done} of {self.progress.max} tokens")

    # -- showing ----------------------------------------------------------------------------------
    def show_trace(self, trace: Trace) -> None:
        """Put a trace (a fresh run or an upload) on the page: status, player, figures."""
        # one batch: sent piecemeal from an async callback, Panel 1.9 lost some of these updates
        # (the detail and the step figure stayed empty while the status arrived)
        with pn.io.hold():
            self._show_trace(trace)

    def _show_trace(self, trace: Trace) -> None:
        try:
            n = n_steps(trace)
        except ValueError as e:     # a trace of an engine with no step view
            self.error(e)
            return
        if n == 0:
            self.error("this trace has no steps to show (recorded with record=None and no rounds?)")
            return
        self.trace = trace
        self._step = 0
        self.dist_temp.value = trace.sampling.temperature or 1.0        # the temperature that ran
        self.clear_error()
        self.status.object = status_html(trace)
        self.download.disabled = False
        self.download.filename = runs.default_path(trace).name
        self.player.stylesheets = [player_css(step_label(trace))]
        # moving the player to 0 draws step 0 (step view, summary) through its watcher; if it is already at 0, here
        at_zero = self.player.value == 0
        self.player.param.update(start=0, end=max(n - 1, 1), value=0)
        if at_zero:
            self.show_step(0)

    def show_step(self, step: int) -> None:
        if self.trace is None:
            return
        step = min(int(step), n_steps(self.trace) - 1)
        with pn.io.hold():
            self.step_text.object = f"<b>{step_title(self.trace, step)}</b>"
            self.step_fig.object = step_figure(self.trace, step)
            self.detail.object = detail_html(self.trace, step)
            self._step = step
            self._show_distributions()
            self._show_summary(self.trace, step)

    def _show_distributions(self) -> None:
        """The p / q bars of the current round, when the trace recorded them."""
        trace, step = self.trace, getattr(self, "_step", 0)
        fig = None
        if trace is not None and trace.engine == "speculative" and trace.record == "full":
            fig = distributions(trace, step, temperature=self.dist_temp.value)
        with pn.io.hold():
            self.dist_fig.object, self.dist_fig.visible = fig, fig is not None
            self.dist_temp.visible = fig is not None

    def _show_summary(self, trace: Trace, step: int | None = None) -> None:
        """The Summary tab's figures, each marking `step` (the Step tab's current one)."""
        makers = SUMMARY.get(trace.engine, ())
        for i, pane in enumerate(self.summary_figs):
            fig = makers[i](trace, step) if i < len(makers) else None
            pane.visible, pane.object = fig is not None, fig
            # diffusion figures size themselves (the order map grows with the steps)
            pane.height = SUMMARY_HEIGHTS[i] if trace.engine != "diffusion" or fig is None else fig.layout.height + 20
        self.summary_note.visible = not makers

    def run_failed(self, e) -> None:
        """A run the form asked for failed: say why, and take the previous run off the page so it
        is not read as this run's result (a failed upload leaves the page as it was)."""
        with pn.io.hold():
            self.trace = None
            self.status.object = "No run: the last one failed (the message above says why)."
            self.step_text.object, self.step_fig.object, self.detail.object = "", None, ""
            self.dist_fig.object, self.dist_fig.visible, self.dist_temp.visible = None, False, False
            for pane in self.summary_figs:
                pane.visible, pane.object = False, None
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
        no timing includes loading models or the first forwards."""
        chosen = [m for m in self.compare_methods.value if runs.engine(m) == "speculative" and m != "ar"]
        if not chosen:
            raise ValueError("choose at least one method to compare with ar")
        order = ["ar", *chosen]
        jobs = {m: self.job(m) for m in order}                   # checks every method's extras now
        warm = [self.job(m, warmup=True) for m in order]

        def work():
            for fn in warm:
                try:
                    fn()
                except (ValueError, ModelLoadError):
                    pass                                         # the timed run below reports it
            traces, errors = {}, {}
            for m, fn in jobs.items():
                try:
                    traces[m] = fn()
                except (ValueError, ModelLoadError) as e:
                    errors[m] = str(e)
            return traces, traces.pop("ar", None), errors
        return work

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
        self.queue_note.object = f"running ar and {', '.join(self.compare_methods.value)} (each once untimed first)"
        try:
            result = await asyncio.wrap_future(runs.submit(work))
        except Exception as e:
            self.error(f"the comparison failed unexpectedly: {type(e).__name__}: {e}")
            return
        finally:
            self._busy(False)
        self._show_compare(*result)

    def _show_compare(self, traces, reference, errors) -> list[dict]:
        with pn.io.hold():
            return self._fill_compare(traces, reference, errors)

    def _fill_compare(self, traces, reference, errors) -> list[dict]:
        self.compare_table = runs.compare_rows(traces, reference)
        self.compare_out.object = runs.rows_html(self.compare_table) if traces else ""
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
        &compare=m1,m2; True when ?run=1 asks for a run on load."""
        get = {k: v[0].decode("utf-8", "replace") for k, v in args.items() if v}
        try:
            if "method" in get:
                self.method.value = get["method"]
            for name in ("target", "draft", "prompt", "extra"):
                if name in get:
                    getattr(self, name).value = get[name]
            for name, cast in (("k", int), ("max_new_tokens", int), ("seed", int), ("temperature", float),
                               ("budget", int), ("threshold", float), ("gen_length", int)):
                if name in get:
                    getattr(self, name).value = cast(get[name])
            if "block_length" in get:
                self.block_length.value = int(get["block_length"])
            if "compare" in get:
                self.compare_methods.value = [m for m in get["compare"].split(",") if m]
        except (ValueError, TypeError) as e:
            self.error(f"could not use the URL arguments: {e}")
            return False
        return get.get("run") == "1"


def blocks(gen_length: int) -> list[int]:
    """Block lengths that divide gen_length (the last one is a single block)."""
    return [b for b in range(1, gen_length + 1) if gen_length % b == 0 and (b >= 4 or b == gen_length)]


def _pick(options: list[str], preferred: str) -> str | None:
    return preferred if preferred in options else (options[0] if options else None)


def app():
    """A fresh dashboard for one session (what `panel serve` and `speclab serve` call)."""
    dash = Dashboard()
    if pn.state.curdoc is not None and pn.state.session_args and dash.apply_args(pn.state.session_args):
        pn.state.onload(dash._on_run)
    return dash.view


if pn.state.served:
    app().servable(title="speclab dashboard")
