"""One Engine row per engine (decoding/engines.py): a fourth engine joins by one row, one method
row and one view, and is run, replayed, counted, benched beside ar and drawn step by step in the
Jupyter player, the dashboard's viewer and the export with no edit elsewhere; its run parameters are
checked by its row at the one door; and nothing outside the rows compares engine names."""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

import speclab
from speclab.decoding.engines import (DIFFUSION, ENGINES, SPECULATIVE, Engine, check_pairing, engine_for, engine_of,
                                      get_engine, registered_engine)
from speclab.decoding.registry import METHODS, Method, get_method, registered
from speclab.decoding.result import Result
from speclab.export import to_html
from speclab.figures import n_steps, step_label, step_title
from speclab.figures.summary import current
from speclab.figures.views import VIEWS, FigureSpec, View, added_view, step_view, view_of
from speclab.models.loading import as_model, encode_prompt, model_info, token_table
from speclab.trace import STEPS, Round, Sampling, Steps, Totals, Trace, TraceError, replay

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def add(a, b):\n    return"


# -- a toy fourth engine: greedy, one forward (no cache) and one step per token -------------------
@dataclass
class JacobiConfig:
    window: int = 1                     # a knob, so the method has a parameter to check


def run_jacobi(target, prompt, method: str, max_new_tokens: int = 6, record="light", seed=0, device=None,
               dtype="auto", draft=None, chat=False, temperature=0.0, progress=None, **params) -> Result:
    model, tok = as_model(target, device, dtype)
    ids = encode_prompt(tok, prompt, max_new_tokens, None)
    new, rounds, t0 = [], [], time.perf_counter()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            t = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            rounds.append(Round(emitted=t, emitted_kind="target", kept=1))
            new.append(t)
    totals = Totals(wall_s=time.perf_counter() - t0, target_forwards=len(new), new_tokens=len(new))
    trace = Trace(engine="jacobi", method=method, params=dict(params, max_new_tokens=max_new_tokens),
                  models={"target": model_info(model, "code-target")}, sampling=Sampling(0.0, None, None, seed),
                  record=record, prompt_ids=ids, output_ids=new, totals=totals, rounds=rounds)
    trace.token_text = token_table(tok, trace.mentioned_ids())
    return Result(text=tok.decode(new), ids=new, trace=trace)


JACOBI_STEPS = Steps(engine="jacobi", field="rounds", noun="token", rate="tokens per forward",
                     count=lambda t: len(t.rounds), replay=lambda t: [r.emitted for r in t.rounds])
JACOBI = Engine(name="jacobi", kind="causal", kind_is="a causal LM", decoders="jacobi",
                wrong_target="{method} decodes causal LMs, not {target} ({its}): decode it with {use}",
                run=run_jacobi, steps=JACOBI_STEPS)
JACOBI_METHOD = Method(name="jacobi", family="jacobi", engine="jacobi", guarantee="identical-to-ar",
                       summary="a toy: greedy, one forward per token", config=JacobiConfig, sampling=False)


def tokens_frame(trace: Trace, step: int = 0, static: bool = True) -> dict:
    toks = trace.output_ids[: step + 1]
    return dict(data=[dict(type="bar", x=list(range(len(toks))), y=[1] * len(toks),
                           text=[trace.text_of(t) for t in toks])],
                layout=dict(title=dict(text=step_title(trace, step)), height=300))


def forwards_figure(trace: Trace, step: int | None = None) -> go.Figure:
    """The whole run: one target forward per token, the current step marked."""
    n = len(trace.rounds)
    fig = go.Figure([go.Bar(x=list(range(1, n + 1)), y=[1] * n, name="forwards"), current(step, 1)])
    return fig.update_layout(title="target forwards per token", height=240)


JACOBI_VIEW = View("jacobi", step=(step_view("tokens", tokens_frame),),
                   summary=(FigureSpec("forwards", forwards_figure, height=260),))
VIEW_NAMES = [f.name for f in JACOBI_VIEW.step + JACOBI_VIEW.whole_run]          # ["tokens", "forwards"]


def test_a_fourth_engine_is_one_row_one_method_and_one_view(target, tmp_path):
    with registered_engine(JACOBI), registered(JACOBI_METHOD), added_view(JACOBI_VIEW):
        r = speclab.run(target, PROMPT, "jacobi", max_new_tokens=6, window=2)
        ar = speclab.run(target, PROMPT, "ar", max_new_tokens=6)
        assert r.ids == ar.ids and r.trace.params["window"] == 2      # greedy: the same tokens as ar
        assert engine_of(r.trace) is JACOBI and r.trace.steps_row() is JACOBI_STEPS
        assert replay(r.trace) == r.ids and n_steps(r.trace) == 6
        assert step_label(r.trace) == "token" and step_title(r.trace, 2) == "token 3 of 6"
        assert r.trace.totals.tau == 1.0 and r.stats["new_tokens"] == 6
        # its traces load (checked) and replay with no model, and export with their own view
        back = Trace.load(r.trace.save(tmp_path / "j.json"))
        assert replay(back) == r.ids and view_of(back).main.name == "tokens"
        page = to_html(back, tmp_path / "j.html").read_text()
        assert "tokens per forward 1.00" in page and "token 1 of 6" in page
        # what the engine does not take is refused in one line by the one door
        with pytest.raises(ValueError, match="no verify"):
            speclab.run(target, PROMPT, "jacobi", rule="typical")
        with pytest.raises(ValueError, match="one prompt at a time"):
            speclab.run(target, [PROMPT, PROMPT], "jacobi")
        with pytest.raises(ValueError, match="jacobi decodes causal LMs, not digits-dllm"):
            speclab.run("digits-dllm", PROMPT, "jacobi")
        with pytest.raises(ValueError, match="does not take"):
            JACOBI.check(JACOBI_METHOD, {"windows": 3})
    assert "jacobi" not in ENGINES and "jacobi" not in STEPS and "jacobi" not in METHODS and "jacobi" not in VIEWS
    with pytest.raises(TraceError, match="engine is 'jacobi', not one of speculative, diffusion, dag"):
        Trace.load(tmp_path / "j.json")


def test_a_fourth_engine_is_benched_beside_ar(target):
    """The bench runs the toy engine's method beside ar with no engine named in the bench: the
    baseline, the verify columns and the step counts come from the rows."""
    from speclab.bench.runner import bench, parse_methods
    with registered_engine(JACOBI), registered(JACOBI_METHOD), added_view(JACOBI_VIEW):
        res = bench(target, None, parse_methods("jacobi[window=2]"), "code-complete", max_new_tokens=6, limit=2,
                    progress=False, keep_traces=True)
        alone = speclab.run(target, res["traces"]["ar"][0].prompt_ids, "jacobi", max_new_tokens=6).ids
        traces = res["traces"]["jacobi[window=2]"]
        assert [replay(t) for t in traces] == [t.output_ids for t in res["traces"]["ar"]]
        steps = sum(n_steps(t) for t in traces)                 # counted by its Steps row
    rows = {r["method"]: r for r in res["rows"]}
    assert res["baseline"] == "ar" and list(rows) == ["ar", "jacobi[window=2]"]     # the causal row's baseline
    j, ar = rows["jacobi[window=2]"], rows["ar"]
    assert j["tokens_per_s"] > 0 and ar["tokens_per_s"] > 0 and j["speedup_vs_ar"] > 0
    assert j["identical_rate"] == 1.0 and j["guarantee"] == "identical-to-ar"      # greedy: ar's tokens
    assert j["new_tokens"] == 12 and j["target_forwards"] == 12 and j["tau"] == 1.0
    assert j["alpha"] is None and j["draft_s"] is None and "cost_model" not in j   # its steps verify nothing
    assert [t.engine for t in traces] == ["jacobi", "jacobi"] and traces[0].params["window"] == 2
    assert traces[0].output_ids == alone == res["traces"]["ar"][0].output_ids
    # the step columns: counted as the traces' Steps rows count them, named as they name them
    assert (j["steps"], j["step"], j["rate"]) == (steps, "token", "tokens per forward") and steps == 12
    assert ar["step"] == "round" and ar["steps"] == sum(n_steps(t) for t in res["traces"]["ar"])


def test_a_fourth_engine_is_drawn_step_by_step_in_every_front_end(target, tmp_path):
    """The player, the dashboard's viewer and the export show the toy engine's trace with its View's
    figures, and moving a step redraws the step figure and moves the summary's marker."""
    from speclab.widgets import show
    with registered_engine(JACOBI), registered(JACOBI_METHOD), added_view(JACOBI_VIEW):
        r = speclab.run(target, PROMPT, "jacobi", max_new_tokens=6)
        tokens = lambda fig: list(fig.data[0].x)
        marker = lambda fig: list(next(t for t in fig.data if t.name == "current").x)

        player = show(r)                                                  # speclab/widgets
        assert list(player.figures) == VIEW_NAMES and player.label.value == "token 1 of 6"
        assert tokens(player.figures["tokens"]) == [0] and marker(player.figures["forwards"]) == [1, 1]
        player.update(3)
        assert player.label.value == "token 4 of 6" and player.figures["tokens"].layout.title.text == "token 4 of 6"
        assert tokens(player.figures["tokens"]) == [0, 1, 2, 3] and marker(player.figures["forwards"]) == [4, 4]

        pytest.importorskip("panel")
        from speclab.apps.viewer import Viewer
        viewer = Viewer()                                                 # speclab/apps/viewer.py
        viewer.show(r.trace)
        panes = {spec.name: pane for pane, spec in viewer.shown}
        assert [viewer.view.main.name] + list(panes) == VIEW_NAMES and panes["forwards"].visible
        assert panes["forwards"] in viewer.summary_figs and panes["forwards"].height == 260
        assert tokens(viewer.step_fig.object) == [0] and "token 1 of 6" in viewer.step_text.object
        viewer.player.value = 5
        assert tokens(viewer.step_fig.object) == list(range(6)) and "token 6 of 6" in viewer.step_text.object
        assert viewer.step_fig.object.layout.title.text == "token 6 of 6" and marker(panes["forwards"].object) == [6, 6]

        page = to_html(r.trace, tmp_path / "j.html").read_text(encoding="utf-8")   # speclab/export.py
        assert re.findall(r'data-figure="([^"]+)"', page) == VIEW_NAMES
        assert re.findall(r'data-steps="(\d+)"', page) == ["6"]          # the step figure: one frame a step
        assert all(f"token {k} of 6" in page for k in range(1, 7)) and "target forwards per token" in page
    for front_end in ("speclab/widgets/player.py", "speclab/apps/viewer.py", "speclab/apps/dashboard.py",
                      "speclab/export.py", "speclab/bench/runner.py"):
        assert "jacobi" not in (ROOT / front_end).read_text()


def no_model(*_, **__):
    raise AssertionError("a model loaded before the error")


@pytest.mark.parametrize("method,target,params,msg", [
    ("jacobi", "code-target", dict(windows=3), r"method 'jacobi' does not take \['windows'\]; it takes \['window'\]"),
    ("jacobi", "code-target", dict(window="wide"), "window"),
    ("dag-viterbi", "numwords-dat", dict(beams=4), r"method 'dag-viterbi' does not take \['beams'\]"),
    ("dag-beam", "numwords-dat", dict(beam_size="four"), "beam_size"),
    ("dllm-threshold", "digits-dllm", dict(t_min=0.1), r"dllm-threshold does not take \['t_min'\]"),
])
def test_the_one_door_checks_run_parameters_with_the_row_before_any_model_loads(monkeypatch, method, target,
                                                                                  params, msg):
    """speclab.run calls the method's row's `check` on the keywords its door does not name itself:
    one line, before the door (the toy's loads its model first; so does the DAG's)."""
    import sys
    import speclab.api
    import speclab.decoding.dllm_run
    import speclab.decoding.spec_run
    for door in (speclab.api, speclab.decoding.spec_run, speclab.decoding.engines, speclab.decoding.dllm_run,
                 sys.modules[__name__]):
        monkeypatch.setattr(door, "as_model", no_model)
    with registered_engine(JACOBI), registered(JACOBI_METHOD):
        assert JACOBI.run_keywords >= {"max_new_tokens", "record", "seed", "dtype", "draft"}
        with pytest.raises(ValueError, match=msg) as e:
            speclab.run(target, "twenty one", method, max_new_tokens=4, **params)
    assert "\n" not in str(e.value)


def test_the_rows_hold_what_each_engine_decides():
    assert [e.name for e in ENGINES.values()][:3] == ["speculative", "diffusion", "dag"]
    assert (SPECULATIVE.verify, SPECULATIVE.draft, SPECULATIVE.batch) == (True, True, True)
    assert not (DIFFUSION.verify or DIFFUSION.draft or DIFFUSION.batch)
    assert {e.name: (e.kind, e.noun, e.rate) for e in ENGINES.values()} == {
        "speculative": ("causal", "round", "tau"), "diffusion": ("diffusion", "step", "tokens per forward"),
        "dag": ("dag", "strategy", "tau"), "superposed": ("causal", "step", "tokens per forward")}
    assert {e.steps.field for e in ENGINES.values()} == {"rounds", "denoise", "dag"}
    # the bench's baseline on each engine's targets (a DAG names none: it is not benched)
    assert (SPECULATIVE.baseline(None), DIFFUSION.baseline(None), get_engine("dag").baseline) == ("ar", "dllm-lowconf", None)
    assert engine_for("code-dllm") is DIFFUSION and engine_for("code-target") is SPECULATIVE
    with pytest.raises(ValueError, match="unknown engine 'jacobi'"):
        get_engine("jacobi")
    with pytest.raises(ValueError, match="already registered"):
        with registered_engine(SPECULATIVE):
            pass
    # the diffusion row's check takes the noise canvas's knobs only where the sampler runs one
    DIFFUSION.check(get_method("dllm-entropy-bound"), {"entropy_bound": 0.2, "t_min": 0.1})
    with pytest.raises(ValueError, match="does not take"):
        DIFFUSION.check(get_method("dllm-threshold"), {"t_min": 0.1})
    with pytest.raises(ValueError, match="threshold"):
        DIFFUSION.check(get_method("dllm-threshold"), {"threshold": "high"})


def test_pairing_errors_come_from_the_rows():
    with pytest.raises(ValueError, match="numwords-dat is a DA-Transformer: decode it with a dag-\\* method"):
        check_pairing(SPECULATIVE, "ar", "numwords-dat")
    with pytest.raises(ValueError, match="takes no draft model: a masked-diffusion LM"):
        check_pairing(DIFFUSION, "dllm-threshold", "digits-dllm", draft="code-draft")
    check_pairing(SPECULATIVE, "dllm-draft", "code-target", draft="digits-dllm", draft_kind="dllm")


# -- no engine names compared outside the rows --------------------------------------------------------
ENGINE_COMPARISON = r"engine(\([^)]*\))?\s*(==|!=|not in|in) "
# the rows themselves, and the view spec's mapping from an engine to its views
ALLOWED = {"speclab/decoding/engines.py", "speclab/figures/views.py"}
ENGINE_FILES = ["speclab/decoding/speculative.py", "speclab/decoding/dllm_run.py", "speclab/decoding/diffusion.py",
                "speclab/decoding/dag.py", "speclab/decoding/batch.py", "speclab/api.py",
                "speclab/decoding/spec_run.py", "speclab/decoding/engines.py", "speclab/decoding/freedave.py"]


def grep(pattern: str, files) -> list[str]:
    out = subprocess.run(["git", "grep", "--untracked", "-nE", pattern, "--", *files], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.splitlines()


# what the bench would ask instead of the rows: a model's diffusion-ness, an engine's step field
BENCH_BY_ENGINE = r"is_dllm\(|\.denoise\b|\.dag\b|kind\s*[!=]=\s*\"(diffusion|dag)\""
BENCH_FILES = ["speclab/bench/runner.py", "speclab/bench/cli.py", "speclab/bench/timing.py",
               "speclab/bench/report.py", "speclab/bench/quality.py"]


def test_no_engine_name_is_compared_outside_the_rows():
    hits = [h for h in grep(ENGINE_COMPARISON, ["speclab/*.py"]) if h.split(":")[0] not in ALLOWED]   # apps too
    assert hits == []
    assert grep(BENCH_BY_ENGINE, BENCH_FILES) == []                    # the bench asks the rows too
    assert grep(BENCH_BY_ENGINE, ["speclab/bench/dllm_eval.py"])        # (a diffusion-only report may)
    assert grep(ENGINE_COMPARISON, ["speclab/figures/views.py"])        # the pattern does find one


def test_engine_files_read_declared_capabilities_not_hasattr():
    assert grep(r"hasattr\((policy|drafter)\b", ENGINE_FILES) == []
    assert all((ROOT / f).exists() for f in ENGINE_FILES)
    assert re.search(r"hasattr\((policy|drafter)\b", 'if hasattr(drafter, "x")')
