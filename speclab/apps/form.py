"""The dashboard's parameter form: which method, which models, what prompt, and the method's knobs.

The knobs are one declarative table (`KNOBS`): the widget each registry parameter is shown with.
Which knobs a method shows, and the values they take when the method is chosen, come from the
registry (`takes`, `method_defaults`), where each method's defaults live once (a drafter's own
constructor), so the form always shows the value that runs; its other parameters are offered as
the "other parameters" placeholder. Choosing another method or target fits the form to it: that
engine's models, that model's example prompt (only an untouched example prompt is swapped: a prompt
the user wrote stays), valid canvas lengths, the draft the run takes (a feature head shows the
zoo's head for the target, the one the run loads), the temperature (hidden, at 0, for a method
that decodes greedily only; the user's value comes back with a method that samples) and the
acceptance rule (speculative methods only: `exact`, the lossy rules any method takes, and a rule
built for the method's own drafts; each option says its guarantee).
"""
from __future__ import annotations

import json
import os

import panel as pn

from speclab.apps import guide, runs
from speclab.decoding.registry import get_method, method_defaults, paired_draft
from speclab.decoding.rules import rules
from speclab.params import check_bounds

# the method the page opens on: the one that wins most on the copy task the page opens with (prompt
# lookup drafts the prompt's own text: BENCHMARKS.md); the chat preset beside it shows the loss
DEFAULT_METHOD = "prompt-lookup"
DEFAULT_PROMPT = "def parse(line):"
CHAT_PROMPT = "Explain in two sentences why the sky is blue."
# the task the page opens on with the real pair: the answer copies most of the prompt, so drafts are
# right most of the time and speculation visibly wins (prompt lookup tau ~6, eagle ~2.7 on
# SmolLM2-135M); the chat question, a preset beside it, is where it loses on a CPU
COPY_PROMPT = ("Add a docstring to this function and print the whole function again:\n\n"
               "def area(width, height):\n    if width < 0 or height < 0:\n"
               "        raise ValueError('negative size')\n    return width * height")
# the pair the page opens on: the real model and its trained draft when installed, else the toy zoo;
# SPECLAB_DASHBOARD_TARGET=code-target (the tests set it) keeps the page on the tiny models
REAL_PAIR, TOY_PAIR = ("smollm2-135m", "smollm2-draft"), ("code-target", "code-draft")
DAG_PROMPTS = {"dates-dat": "2024-03-05", "numwords-dat": "305"}
# smollm2-dllm's prompt: a list it is sure of, so a step commits several slots (FreeDave about 1.8
# tokens per forward on it) where an open question commits about one
DLLM_PROMPTS = {"digits-dllm": "SUM 27=", "code-dllm": "def add(a, b):", "smollm2-dllm": "List the days of the week."}
# models whose example prompt is a user message in their chat template
CHAT_MODELS = {*REAL_PAIR, "smollm2-dllm"}
# the diffusion model the page switches to: the block-diffusion SmolLM2 beside the real pair
REAL_DLLM, TOY_DLLM = "smollm2-dllm", "code-dllm"
EXAMPLE_PROMPTS = {DEFAULT_PROMPT, CHAT_PROMPT, COPY_PROMPT, *DAG_PROMPTS.values(), *DLLM_PROMPTS.values()}


def default_pair(kinds: dict[str, list[str]]) -> tuple[str, str]:
    """(target, draft) the page opens on: the real pair where installed, else the toy zoo's;
    SPECLAB_DASHBOARD_TARGET names another target."""
    pair = REAL_PAIR if all(n in kinds["causal"] for n in REAL_PAIR) else TOY_PAIR
    if os.environ.get("SPECLAB_DASHBOARD_TARGET"):
        pair = (os.environ["SPECLAB_DASHBOARD_TARGET"], TOY_PAIR[1])
    return pair


def blocks(gen_length: int) -> list[int]:
    """Block lengths that divide gen_length (the last one is a single block)."""
    return [b for b in range(1, gen_length + 1) if gen_length % b == 0 and (b >= 4 or b == gen_length)]


# registry parameter -> the widget that sets it. A knob shows when the chosen method takes it.
# threshold: for speculative methods 0 means off (a slider cannot hold None); diffusion policies
# always commit by a threshold, so there it starts above 0 (`_fit_threshold`).
KNOBS = {
    "k": lambda w: w.IntSlider(name="k (draft length)", start=1, end=16, value=4),
    "threshold": lambda w: w.FloatSlider(name="threshold (0 = off)", start=0.0, end=0.95, step=0.05, value=0.0),
    "exit_layer": lambda w: w.Select(name="exit layer", options=["auto"]),
    "budget": lambda w: w.IntSlider(name="node budget", start=2, end=32, value=10),
    "gen_length": lambda w: w.IntSlider(name="gen length (canvas slots)", start=8, end=128, step=8, value=32),
    "block_length": lambda w: w.Select(name="block length", options=blocks(32), value=32),
}


def _config(model: str, key: str) -> int:
    part = runs.zoo_path(model)
    return json.loads((part / "config.json").read_text()).get(key, 0) if part is not None else 0


def is_block_causal(model: str) -> bool:
    """A block-diffusion LM (its zoo config says speclab_block_causal), which block caches need."""
    return bool(_config(model, "speclab_block_causal"))


def _pick(options: list[str], preferred: str) -> str | None:
    return preferred if preferred in options else (options[0] if options else None)


class Form:
    """The widgets of the left column. `on_change()` is called after the method or target changed
    (the dashboard takes the now stale run off the page)."""

    def __init__(self, kinds: dict[str, list[str]], on_change=None):
        self.kinds, self.on_change = kinds, on_change
        w = pn.widgets
        self.method = w.Select(name="method", options=runs.method_names(), value=DEFAULT_METHOD,
                               css_classes=["speclab-method"])
        pair = default_pair(kinds)
        self.default_target = pair[0]
        self.target = w.Select(name="target", options=kinds["causal"], value=_pick(kinds["causal"], pair[0]),
                               css_classes=["speclab-target"])
        self.draft = w.Select(name="draft", options=kinds["causal"], value=_pick(kinds["causal"], pair[1]))
        # a diffusion model's line: the real adapter or a toy, and how parallel its examples commit
        self.model_note = pn.pane.Markdown("", visible=False, css_classes=["speclab-model-note"], width=320)
        self._draft_lm = self.draft.value             # the draft LM picked, kept while a head is shown
        self._temperature = 0.0                       # the user's temperature, kept while a method refuses one
        chat = self.target.value in CHAT_MODELS
        self.prompt = w.TextAreaInput(name="prompt", value=COPY_PROMPT if chat else DEFAULT_PROMPT, height=80,
                                      css_classes=["speclab-prompt"])
        self.chat = w.Checkbox(name="chat: the prompt is a user message (the model's chat template)", value=chat)
        # prompts that show the chosen method at its best (speclab/apps/guide.py)
        self.preset = w.Select(name="or try a preset prompt", options=["-"], value="-", css_classes=["speclab-preset"])
        self.preset.param.watch(lambda e: self._use_preset(e.new), "value")
        self.knobs = {name: make(w) for name, make in KNOBS.items()}
        for name, widget in self.knobs.items():
            setattr(self, name, widget)               # form.k, form.threshold, ... read like the other fields
        # long enough that the default chat answer ends (two sentences: about 55 tokens) rather than
        # stopping mid-sentence, short enough to keep a first run quick
        self.max_new_tokens = w.IntSlider(name="max new tokens", start=1, end=128, value=96)
        self.temperature = w.FloatSlider(name="temperature", start=0.0, end=1.5, step=0.05, value=0.0)
        # label -> rule name; the label says what the rule keeps
        self.rule = w.Select(name="acceptance rule", options={"exact (identical to ar)": "exact"}, value="exact",
                             css_classes=["speclab-rule"])
        self.seed = w.IntInput(name="seed", value=0, start=0)
        self.extra = w.TextInput(name="other parameters (name=value, ...)", placeholder="schedule=heuristic")
        self.method.param.watch(lambda e: self._changed(method=True), "value")
        self.target.param.watch(lambda e: self._fit_target(e.old, e.new), "value")
        self.gen_length.param.watch(lambda e: self._fit_blocks(), "value")
        self.fit(method_changed=True)

    def column(self, *below) -> pn.Column:
        return pn.Column("## speclab", self.method, self.target, self.model_note, self.draft, self.prompt, self.preset,
                         self.chat, *self.knobs.values(), self.max_new_tokens, self.temperature, self.rule, self.seed, self.extra,
                         *below, width=330)

    # -- fitting the form to the method and model ----------------------------------------------------
    def _changed(self, method: bool = False) -> None:
        self.fit(method_changed=method)
        if self.on_change is not None:
            self.on_change()

    def fit(self, method_changed: bool = False) -> None:
        """Show only the knobs the chosen method takes, at its defaults when the method changed;
        DAG and diffusion methods get their models."""
        m = self.method.value
        verify, canvas, dag = runs.verifies(m), runs.on_canvas(m), runs.is_dag(m)
        models = self.kinds[runs.model_kind(m)]
        if list(self.target.options) != models:
            self.target.options = models
            real = self.default_target in REAL_PAIR
            self.target.value = _pick(models, (REAL_DLLM if real else TOY_DLLM) if canvas
                                      else self.default_target)
            if self.prompt.value in EXAMPLE_PROMPTS or not self.prompt.value.strip():
                self.prompt.value = self.example_prompt(self.target.value)
        takes = self.knobs_of(m)
        for name, widget in self.knobs.items():
            widget.visible = name in takes
        self._fit_draft(m)
        self._fit_temperature(m, canvas)
        self._fit_rule(m, verify)
        self.chat.visible = self._chat_visible()
        note = guide.model_note(self.target.value) if canvas and self.target.value else ""
        self.model_note.object, self.model_note.visible = note, bool(note)
        self._fit_threshold(canvas)
        self.max_new_tokens.visible = verify                # a canvas: gen length instead
        self.seed.visible = self.extra.visible = not dag
        n = _config(self.target.value, "num_hidden_layers") if verify and self.target.value else 0
        opts = ["auto"] + [str(i) for i in range(1, n)]
        if list(self.exit_layer.options) != opts:
            self.exit_layer.options, self.exit_layer.value = opts, "auto"
        if canvas and self.target.value:
            self._fit_canvas(_config(self.target.value, "max_position_embeddings"))
        if method_changed and not dag:
            self._set_defaults(m, takes)
            others = {n: v for n, v in method_defaults(m).items() if n not in takes and n != "history"}
            self.extra.placeholder = ", ".join(f"{n}={v}" for n, v in others.items() if v is not None)[:120]
        labels = ["-"] + [label for label, _, _ in guide.presets(m)]
        if list(self.preset.options) != labels:
            self.preset.options, self.preset.value = labels, "-"
        self.preset.visible = len(labels) > 1

    def knobs_of(self, method: str) -> list[str]:
        """The knobs a method is shown with: the parameters it takes that a knob sets, less any whose
        default the knob cannot hold (dllm-ete's budget is a fraction, dllm-sched's k a schedule's
        steepness, ppd's budget "auto", not counts: they go in "other parameters")."""
        defaults = method_defaults(method) if not runs.is_dag(method) else {}
        return [n for n in runs.takes(method) if n in self.knobs
                and not (isinstance(self.knobs[n], pn.widgets.IntSlider) and isinstance(defaults.get(n), (float, str)))]

    def _fit_draft(self, method: str) -> None:
        """A draft LM is picked from the causal models; a feature head (EAGLE, Medusa) is not picked:
        the run loads the zoo's head for the target, so the picker shows that one, fixed."""
        d = get_method(method).draft
        self.draft.visible = d is not None
        if d is None:
            return
        if d.kind == "draft":
            models = self.kinds["causal"]
            if list(self.draft.options) != models:
                self.draft.param.update(options=models, value=_pick(models, self._draft_lm), disabled=False)
            return
        if not self.draft.disabled:
            self._draft_lm = self.draft.value
        head = paired_draft(self.target.value, method) if self.target.value else None
        shown = head or f"no {d.kind} head for {self.target.value}"
        self.draft.param.update(options=[shown], value=shown, disabled=True)

    def _fit_temperature(self, method: str, canvas: bool) -> None:
        """A method that decodes greedily only refuses a temperature (FreeDave, DiffusionGemma's own
        schedule) or ignores it (DAG strategies but sampling): the slider hides at 0 and the user's
        value comes back with a method that samples."""
        dgemma = canvas and _config(self.target.value or "", "model_type") == "diffusion_gemma"
        takes = get_method(method).sampling and not dgemma
        if takes and not self.temperature.visible:
            self.temperature.param.update(visible=True, value=self._temperature)
        elif not takes and self.temperature.visible:
            self._temperature = self.temperature.value
            self.temperature.param.update(visible=False, value=0.0)

    def _fit_rule(self, method: str, verify: bool) -> None:
        """The rules this method can run under, its own first; hidden where there is no verify."""
        if not verify:
            self.rule.visible = False
            return
        own = get_method(method).rule
        names = [own] + [r["name"] for r in rules() if r["name"] != own and (not r["only_for"] or method in r["only_for"])]
        info = {r["name"]: r for r in rules()}
        options = {f"{n} ({info[n]['guarantee'].replace('-', ' ')})": n for n in names}
        keep = self.rule.value if self.rule.value in names else own
        self.rule.param.update(options=options, value=keep, visible=True)

    def _use_preset(self, label: str) -> None:
        for name, prompt, chat in guide.presets(self.method.value):
            if name == label:
                self.prompt.value = prompt
                if self.chat.visible:
                    self.chat.value = chat

    def _set_defaults(self, method: str, takes: list[str]) -> None:
        """The knobs at the values the method runs with when left alone (None: keep the knob's value,
        except a speculative threshold, where None means off)."""
        defaults = method_defaults(method)
        for name in set(takes) & set(self.knobs):
            value, widget = defaults.get(name), self.knobs[name]
            if name == "threshold" and value is None and runs.verifies(method):
                value = 0.0
            if value is None:
                continue
            if name == "exit_layer":
                value = str(value) if str(value) in widget.options else "auto"
            elif isinstance(widget, pn.widgets.IntSlider):
                value = min(max(int(value), widget.start), widget.end)
            elif isinstance(widget, pn.widgets.FloatSlider):
                value = min(max(float(value), widget.start), widget.end)
            widget.value = value

    def _chat_visible(self) -> bool:
        """Speculative methods: always (any causal LM may have a chat template); diffusion: chat models."""
        m = self.method.value
        return runs.verifies(m) or (runs.on_canvas(m) and self.target.value in CHAT_MODELS)

    def _fit_threshold(self, canvas: bool) -> None:
        """Speculative methods: 0 means off (a fixed draft length). Diffusion policies always use a
        threshold: the slider shows the one that runs (0.9 by default), never 0."""
        if canvas and self.threshold.start == 0.0:
            self.threshold.param.update(name="threshold (commit p >= it)", start=0.05, value=0.9)
        elif not canvas and self.threshold.start != 0.0:
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
        if runs.on_canvas(m):
            return DLLM_PROMPTS.get(target, DEFAULT_PROMPT)
        return COPY_PROMPT if target in CHAT_MODELS else DEFAULT_PROMPT

    def _fit_target(self, old: str | None, new: str | None) -> None:
        """A chat model gets a question in its chat template, each model its own example prompt (only
        an untouched example prompt is swapped; a prompt the user wrote stays)."""
        was, now = old in CHAT_MODELS, new in CHAT_MODELS
        if was != now:
            self.chat.value = now
        if self.prompt.value in EXAMPLE_PROMPTS:
            self.prompt.value = self.example_prompt(new)
        self._changed()

    def _fit_blocks(self) -> None:
        """Block lengths must divide the gen length: offer only those, keeping the choice if it fits."""
        opts = blocks(self.gen_length.value)
        if list(self.block_length.options) != opts:
            keep = self.block_length.value
            self.block_length.options = opts
            self.block_length.value = keep if keep in opts else opts[-1]

    # -- what the form asks for ---------------------------------------------------------------------
    def knob_values(self) -> dict:
        return dict(k=self.k.value, threshold=self.threshold.value or None, budget=self.budget.value,
                    exit_layer="auto" if self.exit_layer.value == "auto" else int(self.exit_layer.value),
                    gen_length=self.gen_length.value, block_length=int(self.block_length.value))

    def total(self) -> int:
        """Tokens the progress bar counts to."""
        m = self.method.value
        return 1 if runs.is_dag(m) else self.gen_length.value if runs.on_canvas(m) else self.max_new_tokens.value

    def request(self, method: str | None = None, warmup: bool = False) -> dict:
        """Keyword arguments of runs.run_one for the decode the form describes (`method` in its
        place for a comparison). Raises ValueError for what can be checked without a model.
        warmup: a 2-token run that loads the models and runs their first forwards."""
        method = method or self.method.value
        prompt = self.prompt.value
        if not prompt or not prompt.strip():
            raise ValueError("empty prompt: type some text to continue")
        # a comparison's other method takes the knobs the form shows (k for draft-model and prompt
        # lookup alike), not hidden ones left at the widget's value (its node budget of 10 would
        # make eagle's tree twice its default): those keep the method's own defaults
        shown = set(self.knobs_of(self.method.value))
        knobs = {n: v for n, v in self.knob_values().items()
                 if n in self.knobs_of(method) and (method == self.method.value or n in shown)}
        kw = runs.method_kwargs(method, knobs, self.extra.value if not runs.is_dag(method) else "")
        check_bounds(method, {**kw, "max_new_tokens": self.max_new_tokens.value})    # the "other parameters" too
        if not runs.is_dag(method) and self.chat.value and self.chat.visible:
            kw["chat"] = True
        if runs.verifies(method) and method == self.method.value and self.rule.value != get_method(method).rule:
            kw["rule"] = self.rule.value                # a comparison's other methods run their own rule
        return dict(target=self.target.value, prompt=prompt, method=method, draft=self.draft.value,
                    max_new_tokens=min(2, self.max_new_tokens.value) if warmup else self.max_new_tokens.value,
                    temperature=self.temperature.value, seed=self.seed.value or 0, **kw)

    def apply_args(self, get: dict[str, str]) -> None:
        """Prefill from URL arguments (method first: choosing it resets the knobs to its defaults).
        ValueError, before any is set, for a number that is not one or is past its bound (params.BOUNDS:
        a link with k=1000 is refused, not run)."""
        numbers = {name: cast(get[name]) for name, cast in (
            ("k", int), ("max_new_tokens", int), ("seed", int), ("temperature", float), ("budget", int),
            ("threshold", float), ("gen_length", int), ("block_length", int)) if name in get}
        check_bounds("", numbers)
        if "method" in get:
            self.method.value = get["method"]
        for name in ("target", "draft", "prompt", "extra", "rule"):
            if name in get:
                getattr(self, name).value = get[name]
        for name, value in numbers.items():
            getattr(self, name).value = value
