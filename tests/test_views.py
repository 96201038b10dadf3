"""One view spec per engine (speclab.figures.views), read by the Jupyter player, the dashboard and
the export: what each engine shows and at what size, the figures shown only where a trace recorded
their data (policy decisions, timing lanes, diffusion edits, several rules' verdicts), and a
method's own figure reaching all three front ends with no edit to any of them. Hand-built traces,
plus one toy run on the code zoo."""
from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import pytest

import speclab
from speclab import figures as F
from speclab.figures.compose import dag_dict, move_current, round_dict
from speclab.figures.decisions import decision_summary, decision_table
from speclab.figures.diffusion import canvas_dict
from speclab.figures.lanes import lanes_figure
from speclab.figures.tree import tree_parts
from speclab.figures.verdicts import rescued_figure
from speclab.figures.views import VIEWS, FigureSpec, add_figure, added_figure, remove_figure, view_of
from speclab.trace import (ACCEPTED, STEPS, MASK, NOT_REACHED, REJECTED, Decision, DenoiseStep, DraftNode, Edit, Lane,
                           Span, Totals, Trace)

from test_classroom import hand_trace    # tests/ is on the path, as for conftest

ROOT = Path(__file__).resolve().parents[1]


# -- hand-built traces ----------------------------------------------------------------------------
def spec_trace(method="hand-made", rounds=3, lanes=()) -> Trace:
    """`rounds` speculative rounds (test_classroom's): round 1 accepts one draft token and rejects
    the next, later rounds are plain target steps."""
    tr = hand_trace(method, rounds)
    tr.lanes = list(lanes)
    return tr


def dllm_trace(edits=True) -> Trace:
    """Four slots, three steps; step 2 re-masks slot 1 (committed at step 1), step 3 commits it again."""
    M = 99
    s1 = DenoiseStep(block=(0, 4), masked=[0, 1, 2, 3], top1=[10, 11, 12, 13], conf=[.9, .8, .3, .2],
                     margin=[.5, .4, .1, .1], committed=[0, 1], tokens=[10, 11, M, M])
    s2 = DenoiseStep(block=(0, 4), masked=[2, 3], top1=[12, 13], conf=[.9, .4], margin=[.6, .2],
                     committed=[2], tokens=[10, M, 12, M],
                     edits=[Edit(1, 11, MASK, "low confidence on a second look")] if edits else [])
    s3 = DenoiseStep(block=(0, 4), masked=[1, 3], top1=[14, 13], conf=[.9, .9], margin=[.7, .7],
                     committed=[1, 3], tokens=[10, 14, 12, 13])
    text = {1: "p", 10: "a", 11: "b", 12: "c", 13: "d", 14: "e", M: "<mask>"}
    return Trace(engine="diffusion", method="dllm-hand", params=dict(gen_length=4, block_length=4, mask_id=M),
                 prompt_ids=[1], output_ids=[10, 14, 12, 13], token_text=text,
                 totals=Totals(target_forwards=3, new_tokens=4), denoise=[s1, s2, s3])


def dag_trace() -> Trace:
    from speclab.trace import DagRun
    run = DagRun(num_vertices=3, emissions_topk=[[[5, 0.9]], [[6, 0.8]], [[7, 0.9]]],
                 links_topk=[[[1, 0.9]], [[2, 0.9]], []], pass_prob=[1, 1, 1],
                 paths={"greedy": [0, 1, 2], "viterbi": [0, 2]}, outputs={"greedy": [5, 6, 7], "viterbi": [5, 7]},
                 chosen="viterbi")
    return Trace(engine="dag", method="dag-all", prompt_ids=[1], output_ids=[5, 7],
                 token_text={1: "in", 5: "a", 6: "b", 7: "c"}, dag=run)


def names(specs) -> list[str]:
    return [f.name for f in specs]


# -- (a) the spec of each engine ------------------------------------------------------------------
def test_speculative_view_names_its_figures_and_sizes_side_by_side():
    v = VIEWS["speculative"]
    assert v.main.name == "round" and STEPS["speculative"].rate == "tau"
    assert names(v.step) == ["round", "step detail", "decisions", "p and q", "attention mask"]
    assert [f.slug for f in v.step if f.folded] == ["mask"] and [f.kind for f in v.step][1] == "html"
    assert (v.run_strip.name, v.run_strip.height) == ("tokens per round", 260)
    sized = {f.name: f.height for f in v.summary}
    assert sized["acceptance"] == 380 and sized["timing"] == 300 and sized["cost model"] == 380
    tr = spec_trace()
    shown = view_of(tr)       # nothing but rounds recorded: no decisions, lanes or verdicts figures
    assert names(shown.step) == ["round", "step detail", "attention mask"]      # no p / q: recorded "light"
    assert names(shown.whole_run) == ["tokens per round", "acceptance", "timing", "cost model"]  # no explorer:
    # this run has no cost model (nothing drafted)
    assert F.step_dict(tr, 1) == round_dict(tr, 1)


def test_diffusion_and_dag_views():
    d = VIEWS["diffusion"]
    assert d.main.name == "canvas" and "attention mask" in names(d.step) and STEPS["diffusion"].rate == "tokens per forward"
    assert d.run_strip.name == "confidence bands" and d.run_strip.height is None   # sized by the figure
    tr = dllm_trace()
    assert names(view_of(tr).whole_run) == ["confidence bands", "decoding order"]
    fig = d.run_strip.draw(tr, 0)
    assert d.run_strip.pane_height(fig) == fig.layout.height + 20
    g = VIEWS["dag"]
    assert "attention mask" not in names(g.step) and g.run_strip is None and F.run_strip(dag_trace()) is None
    assert names(view_of(dag_trace()).step) == ["strategies", "step detail"] and view_of(dag_trace()).whole_run == ()
    assert F.step_dict(dag_trace(), 1) == dag_dict(dag_trace(), 1)
    with pytest.raises(ValueError, match="no view for the 'other' engine"):
        view_of(Trace(engine="other", method="x"))


def test_go_to_step_is_where_every_control_lands():
    tr = spec_trace(rounds=4)
    assert F.go_to_step(tr, 1, 1) == 2 and F.go_to_step(tr, 3, 1) == 3 and F.go_to_step(tr, 0, -1) == 0
    assert F.go_to_step(tr, 2, "first") == 0 and F.go_to_step(tr, 0, "last") == 3
    assert F.go_to_step(tr, 9) == 3 and F.step_title(tr, F.go_to_step(tr, 9)) == "round 4 of 4"


def test_a_method_figure_applies_to_that_method_only_and_is_undone():
    spec = FigureSpec("kept", lambda trace, step: go.Figure(), height=200)
    with added_figure("hand-made", spec):
        assert "kept" in names(view_of(spec_trace()).summary)
        assert "kept" not in names(view_of(spec_trace(method="other")).summary)
        with pytest.raises(ValueError, match="already has a figure named 'kept'"):
            add_figure("hand-made", spec)
    assert "kept" not in names(view_of(spec_trace()).summary)
    remove_figure("hand-made", "never added")                  # nothing to undo: no error
    with pytest.raises(ValueError, match="where must be one of"):
        FigureSpec("bad", spec.fn, where="sidebar")


def test_the_dashboard_sizes_panes_by_the_spec():
    pytest.importorskip("panel")
    from speclab.apps.viewer import Viewer
    v = Viewer()
    v.show(spec_trace())
    assert [p.height for p in v.summary_figs if p.visible] == [260, 380, 300]   # no cost model for this run
    v.show(dllm_trace())
    assert [p.height for p in v.summary_figs] == [p.object.layout.height + 20 for p in v.summary_figs]
    assert v.mask_toggle.visible
    v.show(dag_trace())
    assert not v.summary_figs and v.summary_note.visible and not v.mask_toggle.visible


# -- (b) a method's own figure reaches every front end --------------------------------------------
def test_a_method_registered_at_run_time_shows_its_own_figure_everywhere(target, tmp_path):
    """Done when: a toy speculative method and its figures, defined here, show in the Jupyter
    player, the dashboard's viewer and the static export, with no edit to speclab/widgets/, speclab/apps/ or
    speclab/export.py."""
    from speclab.decoding.registry import Method, registered
    from speclab.decoding.speculative import Drafter
    from speclab.decoding.tree import DraftTree
    from speclab.export import to_html
    from speclab.widgets import Player

    class RepeatDrafter(Drafter):
        """Drafts the `k` tokens that followed the last earlier occurrence of the last token."""
        name = "toy-views"

        def __init__(self, k: int = 3):
            super().__init__()
            self.k = k

        def propose(self, ctx):
            ids = ctx.ids
            for i in range(len(ids) - 2, -1, -1):
                if ids[i] == ids[-1]:
                    return DraftTree.chain(ids[i + 1:i + 1 + self.k], None, "toy-views")
            return DraftTree()

    def drafted_per_round(trace, step=None):            # a summary figure: "current" marks the step
        fig = go.Figure([go.Bar(x=list(range(1, len(trace.rounds) + 1)), y=[r.drafted for r in trace.rounds],
                                name="drafted")])
        fig.add_trace(F.summary.current(step, 4))
        return fig.update_layout(title="toy-views: drafted per round", height=240)

    def kept_this_round(trace, step):                    # a step figure: redrawn per step
        r = trace.rounds[step]
        return go.Figure([go.Bar(x=["kept"], y=[r.kept], name="kept")],
                         dict(title=f"toy-views: kept in round {step + 1}", height=200))

    method = Method(name="toy-views", family="model-free", engine="speculative", guarantee="identical-to-ar",
                    summary="a test's toy with its own figures", drafter=RepeatDrafter)
    summary = FigureSpec("drafted per round", drafted_per_round, "summary", height=250)
    step = FigureSpec("kept this round", kept_this_round, "step")
    with registered(method), added_figure("toy-views", summary), added_figure("toy-views", step):
        prompt = "def add(a, b):\n    return a + b\n\ndef sub(a, b):"
        trace = speclab.generate(target, prompt, "toy-views", max_new_tokens=8, k=2).trace
        assert trace.method == "toy-views" and len(trace.rounds) > 1

        player = Player(trace)                                           # speclab/widgets/player.py
        assert {"drafted per round", "kept this round"} <= set(player.figures)
        player.update(1)
        assert player.figures["kept this round"].layout.title.text == "toy-views: kept in round 2"
        assert list(next(t for t in player.figures["drafted per round"].data if t.name == "current").x) == [2, 2]

        pytest.importorskip("panel")
        from speclab.apps.viewer import Viewer
        viewer = Viewer()                                                # speclab/apps/viewer.py
        viewer.show(trace)
        panes = {spec.name: pane for pane, spec in viewer.shown}
        assert panes["drafted per round"].visible and panes["drafted per round"].height == 250
        assert panes["drafted per round"] in viewer.summary_figs and panes["kept this round"] in viewer.step_figs
        viewer.player.value = 1
        assert panes["kept this round"].object.layout.title.text == "toy-views: kept in round 2"

        page = to_html(trace, tmp_path / "toy.html").read_text(encoding="utf-8")   # speclab/export.py
        assert {"drafted per round", "kept this round"} <= set(re.findall(r'data-figure="([^"]+)"', page))
        assert "toy-views: drafted per round" in page

        ar = speclab.generate(target, prompt, "ar", max_new_tokens=2).trace
        assert "drafted per round" not in names(view_of(ar).whole_run)   # keyed by method
    assert "toy-views" not in F.views.METHOD_FIGURES
    for front_end in ("speclab/widgets/player.py", "speclab/apps/viewer.py", "speclab/apps/dashboard.py",
                      "speclab/export.py"):
        assert "toy-views" not in (ROOT / front_end).read_text()


# -- (c) the new records, drawn ------------------------------------------------------------------
def with_decisions() -> Trace:
    tr = spec_trace()
    tr.rounds[0].decisions = [Decision("stop-rule", {"p_accept": 0.81, "depth": 1}, 0.3, "go", at=1),
                              Decision("stop-rule", {"p_accept": 0.2, "depth": 2}, 0.3, "", at=2, note="stopped"),
                              Decision("length", {"tau_est": 1.5}, None, 4)]
    tr.rounds[2].decisions = [Decision("stop-rule", {"p_accept": 0.6, "depth": 1}, 0.3, "go", at=1),
                              Decision("length", {"tau_est": 1.1}, None, 2)]
    return tr


def test_decisions_step_table_lists_each_record_of_the_step():
    tr = with_decisions()
    assert names(view_of(tr).step) == ["round", "step detail", "decisions", "attention mask"]
    assert names(view_of(tr).summary)[-1] == "decisions over the run"
    cols = dict(zip(("policy", "at", "inputs", "threshold", "output", "note"),
                    map(list, decision_table(tr, 0).data[0].cells.values)))
    assert cols["policy"] == ["stop-rule", "stop-rule", "length"] and cols["at"] == [1, 2, ""]
    assert cols["inputs"][0] == "p_accept = 0.81<br>depth = 1" and cols["threshold"] == ["0.3", "0.3", "—"]
    assert cols["output"] == ["go", "", "4"] and cols["note"][1] == "stopped"
    empty = decision_table(tr, 1)
    assert list(empty.data[0].cells.values[0]) == [] and "none" in empty.layout.title.text
    assert empty.layout.height == decision_table(tr, 0).layout.height    # fixed over the run


def test_decision_summary_plots_input_against_threshold_or_the_numeric_output():
    fig = decision_summary(with_decisions(), 0)
    by = {t.name: t for t in fig.data}
    stop, thr, length = by["stop-rule: p_accept"], by["stop-rule: threshold"], by["length: output"]
    assert list(stop.x) == [1, 1, 3] and list(stop.y) == [0.81, 0.2, 0.6]      # the compared input, per round
    assert list(thr.y) == [0.3, 0.3, 0.3]
    assert list(length.x) == [1, 3] and list(length.y) == [4, 2]                # no threshold: the output
    marks = [t for t in fig.data if t.name == "current"]
    assert len(marks) == 2 and all(list(t.x) == [1, 1] for t in marks)
    move_current(fig, 2)
    assert all(list(t.x) == [3, 3] for t in marks)


def test_decisions_of_a_denoising_step():
    tr = dllm_trace()
    tr.denoise[1].decisions = [Decision("remask", {"conf": 0.35}, 0.5, [1], at=1)]
    assert "decisions" in names(view_of(tr).step)
    assert list(decision_table(tr, 1).data[0].cells.values[4]) == ["[1]"]


def with_lanes() -> Trace:
    return spec_trace(lanes=[Lane("drafter", [Span(0.0, 0.01, "draft", 0), Span(0.02, 0.03, "draft", 1)]),
                             Lane("target", [Span(0.005, 0.02, "verify", 0), Span(0.025, 0.04, "verify", 1),
                                             Span(0.04, 0.05, "verify", 2)])])


def test_lanes_are_a_gantt_row_each_with_the_current_step_outlined():
    tr = with_lanes()
    spec = next(f for f in view_of(tr).summary if f.name == "timing lanes")
    fig = lanes_figure(tr, 0)
    draft, verify, now = fig.data
    assert list(draft.y) == ["drafter", "drafter"] and list(draft.base) == [0.0, 0.02]
    assert list(verify.base) == [0.005, 0.025, 0.04] and verify.x[0] == pytest.approx(0.015)
    assert list(now.y) == ["drafter", "target"] and list(now.base) == [0.0, 0.005]
    spec.follow(fig, tr, 2)                                     # redrawn in place: the outline moves
    assert list(now.y) == ["target"] and list(now.base) == [0.04] and fig.data[2] is now
    assert list(fig.layout.yaxis.categoryarray) == ["target", "drafter"]       # first lane on top
    assert lanes_figure(tr).data[2].base == (None,)                              # the export: no step marked
    assert "timing lanes" not in names(view_of(spec_trace()).summary)


def test_edits_are_marked_on_the_canvas_of_their_step():
    tr = dllm_trace()
    plain = len(canvas_dict(dllm_trace(edits=False), 0)["data"])
    counts = {len(canvas_dict(tr, k)["data"]) for k in range(3)}
    assert counts == {plain + 1}                                # one trace more, at every step
    edits = canvas_dict(tr, 1)["data"][-1]
    assert edits["name"].startswith("edited") and edits["x"] == [1 + 0.32]
    assert "<b>b</b> &rarr; mask" in edits["hovertext"][0] and "second look" in edits["hovertext"][0]
    assert canvas_dict(tr, 0)["data"][-1]["x"] == [None]
    assert "edits: position 1 <code>b</code> &rarr; mask" in F.detail_html(tr, 1)
    assert speclab.trace.replay(tr) == tr.output_ids


def with_verdicts() -> Trace:
    tr = spec_trace()
    tr.rounds[0].nodes = [
        DraftNode(0, -1, 5, 1, q=0.9, p=0.8, decision=ACCEPTED, rule="typical",
                  verdicts={"exact": ACCEPTED, "typical": ACCEPTED}),
        DraftNode(1, 0, 6, 2, q=0.7, p=0.1, decision=ACCEPTED, rule="typical",
                  verdicts={"exact": REJECTED, "typical": ACCEPTED}),
        DraftNode(2, 1, 7, 3, q=0.5, p=0.1, decision=REJECTED, rule="typical",
                  verdicts={"exact": NOT_REACHED, "typical": REJECTED})]
    tr.rounds[0].accepted, tr.rounds[0].path_tokens = [0, 1], [5, 6]
    return tr


def test_a_rescued_node_is_ringed_and_its_disagreement_shown():
    tr = with_verdicts()
    data = tree_parts(tr, 0)["data"]
    ring = data[-1]
    assert ring["name"].startswith("rescued") and len(ring["x"]) == 1
    assert "exact: rejected, typical: accepted" in ring["hovertext"][0] and "rescued" in ring["hovertext"][0]
    rejected = next(t for t in data if t["name"] == "rejected")
    assert "exact: not reached" in rejected["hovertext"][0]         # a disagreement, not a rescue
    assert len(tree_parts(tr, 1)["data"]) == len(data)               # a fixed trace count over the run
    assert len(tree_parts(spec_trace(), 0)["data"]) == len(data) - 1  # no verdicts: no ring trace
    assert "1 token(s) rescued" in F.detail_html(tr, 0)


def test_rescued_tokens_are_counted_in_the_summary():
    tr = with_verdicts()
    assert "rescued tokens" in names(view_of(tr).summary)
    agreed, saved, _ = rescued_figure(tr, 0).data
    assert list(saved.y) == [1, 0, 0] and list(agreed.y) == [1, 0, 0]
    assert rescued_figure(tr).layout.title.text.startswith("1 draft tokens rescued by typical (rejected by exact)")


def test_a_figure_failing_at_one_step_is_named_on_the_page_and_the_others_step_on():
    """A step figure that cannot draw one step (a damaged record, a method's own figure) is named in
    one line above the player; the main figure still moves, and the next good step clears the line."""
    pytest.importorskip("panel")
    from speclab.apps.viewer import Viewer

    def fragile(trace, step):
        if step == 1:
            raise KeyError("no such record")
        return go.Figure(go.Bar(y=[step]), layout=dict(title=f"fine at {step}"))

    tr = spec_trace("fragile-method")
    with added_figure("fragile-method", FigureSpec("fragile", fragile, "step")):
        v = Viewer()
        v.show(tr)
        assert not v.step_error.visible
        v.player.value = 1
        assert v.step_error.visible and "fragile" in v.step_error.object and "no such record" in v.step_error.object
        assert v.step_fig.object.layout.meta["step"] == 1                   # the round itself moved on
        v.player.value = 2
        assert not v.step_error.visible
