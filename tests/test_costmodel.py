"""The cost model (speclab.metrics): expected tau for chains and trees, the cost ratio, break-even,
the two alphas; its figure's data; and the bench's rows that carry it with the speed-up's spread."""
from __future__ import annotations

import json

import pytest

from speclab import metrics
from speclab.trace import DraftNode, Round, Totals, Trace


def test_expected_tau_of_a_chain():
    assert metrics.expected_tau(0.0, 4) == 1.0                       # nothing accepted: the target's token
    assert metrics.expected_tau(1.0, 4) == 5.0                       # all k accepted plus the bonus
    assert metrics.expected_tau(0.5, 2) == pytest.approx(1.75)       # 1 + 0.5 + 0.25
    assert metrics.expected_tau(0.08, 4) == pytest.approx((1 - 0.08 ** 5) / 0.92)
    assert round(metrics.expected_tau(0.08, 4), 2) == 1.09
    with pytest.raises(ValueError, match="alpha must be in"):
        metrics.expected_tau(1.5, 4)


def test_tree_tau_from_per_depth_acceptance():
    assert metrics.tree_tau([]) == 1.0
    assert metrics.tree_tau([0.5, 0.5]) == pytest.approx(metrics.expected_tau(0.5, 2))
    assert metrics.tree_tau([0.8, 0.5, 0.25]) == pytest.approx(1 + 0.8 + 0.4 + 0.1)


def test_speedup_and_break_even():
    assert metrics.expected_speedup(1.09, 1.52) == pytest.approx(0.7171, abs=1e-4)
    assert metrics.break_even(4, 1.0) == 0.0                     # a round as cheap as a step: any draft pays
    assert metrics.break_even(4, 5.0) is None                    # c >= k + 1: nothing can pay
    a = metrics.break_even(4, 1.52)
    assert metrics.expected_tau(a, 4) == pytest.approx(1.52, abs=1e-6)
    assert metrics.break_even(2, 1.75) == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(ValueError, match="cost ratio must be > 0"):
        metrics.expected_speedup(1.0, 0.0)


def _chain_round(k, accepted, draft_s, verify_s):
    nodes = [DraftNode(i, i - 1, 10 + i, i + 1, q=0.5,
                       decision="accepted" if i < accepted else "rejected" if i == accepted else "not reached")
             for i in range(k)]
    return Round(nodes=nodes, accepted=list(range(accepted)), path_tokens=[10 + i for i in range(accepted)],
                 emitted=99, kept=accepted + 1, drafted=k, draft_s=draft_s, verify_s=verify_s)


def _trace(rounds, wall, method="draft-model"):
    new = sum(r.kept for r in rounds)
    return Trace(engine="speculative", method=method, prompt_ids=[1], output_ids=[5] * new,
                 totals=Totals(wall_s=wall, target_forwards=len(rounds), new_tokens=new,
                               drafted=sum(r.drafted for r in rounds), accepted=sum(len(r.accepted) for r in rounds)),
                 rounds=rounds)


def test_cost_model_of_a_run_against_its_ar_reference():
    # prefill rounds first (left out), then 4 chain rounds of k 4 accepting 0, 1, 4, 0 tokens
    spec = _trace([_chain_round(4, 0, 0.0, 0.5)] + [_chain_round(4, a, 0.010, 0.020) for a in (0, 1, 4, 0)], 0.62)
    ar = _trace([Round(emitted=1, kept=1, verify_s=0.5)] + [Round(emitted=1, kept=1, verify_s=0.020)] * 9, 0.68, "ar")
    m = metrics.cost_model(spec, ar)
    assert m["k"] == 4 and m["chain"]
    assert m["alpha"] == 5 / 16                                  # speclab's: accepted / drafted
    assert m["token_alpha"] == 5 / 8                             # the papers': judged 1 + 2 + 4 + 1
    assert m["c"] == pytest.approx(0.030 / 0.020)
    assert m["expected_tau"] == pytest.approx(metrics.expected_tau(5 / 8, 4))
    assert m["expected_speedup"] == pytest.approx(metrics.expected_tau(5 / 8, 4) / 1.5)
    assert m["measured_tau"] == pytest.approx(9 / 4) and m["measured_speedup"] == pytest.approx(0.68 / 0.62)
    assert metrics.expected_tau(m["break_even"], 4) == pytest.approx(1.5, abs=1e-6)
    line = metrics.reason_line(m, 0.72)
    assert line == (f"per-token alpha 0.62 at k 4: expected tau {m['expected_tau']:.2f}, round cost 1.50 ar steps: "
                    f"{m['expected_speedup']:.2f}x (measured 0.72x)")


def test_a_run_whose_rounds_were_not_timed_has_no_cost_model():
    """A peer's summary trace (vLLM's) has rounds but no seconds: there is no cost ratio to report."""
    spec = _trace([_chain_round(4, 0, 0.0, 0.0)] + [_chain_round(4, a, 0.0, 0.0) for a in (0, 1)], 0.62)
    ar = _trace([Round(emitted=1, kept=1, verify_s=0.5)] + [Round(emitted=1, kept=1, verify_s=0.020)] * 3, 0.68, "ar")
    assert metrics.cost_model(spec, ar) is None


def test_rounds_that_draft_nothing_count_one_token():
    # two drafting rounds accepting everything (k 2) and two that drafted nothing
    spec = _trace([Round(kept=1, verify_s=0.5)] + [_chain_round(2, 2, 0.01, 0.02)] * 2
                  + [Round(emitted=1, kept=1, verify_s=0.02)] * 2, 1.0)
    ar = _trace([Round(kept=1, verify_s=0.5), Round(kept=1, verify_s=0.02)], 1.0, "ar")
    m = metrics.cost_model(spec, ar)
    assert m["drafting_share"] == 0.5 and m["token_alpha"] == 1.0
    assert m["expected_tau"] == pytest.approx(0.5 * 1 + 0.5 * 3)
    assert m["c"] == pytest.approx((0.03 * 2 + 0.02 * 2) / 4 / 0.02)
    assert "(50% of rounds drafted)" in metrics.reason_line(m)


def test_cost_model_figure_data():
    from speclab.figures.costmodel import costmodel_figure
    m = {"k": 4, "c": 1.52, "token_alpha": 0.08, "alpha": 0.05, "expected_tau": 1.09, "expected_speedup": 0.717,
         "measured_speedup": 0.70, "break_even": metrics.break_even(4, 1.52), "drafting_share": 1.0}
    fig = costmodel_figure(m, label="draft-model")
    curve = next(d for d in fig.data if d.name.startswith("expected"))
    assert curve.x[0] == 0.0 and curve.x[-1] == 1.0
    assert curve.y[-1] == pytest.approx(5 / 1.52) and curve.y[0] == pytest.approx(1 / 1.52)
    point = next(d for d in fig.data if d.name.startswith("measured"))
    assert list(point.x) == [0.08] and list(point.y) == [0.70]
    expected = next(d for d in fig.data if d.name.startswith("model at"))
    assert list(expected.y) == [pytest.approx(0.717)]
    assert any(s.y0 == 1.0 and s.y1 == 1.0 for s in fig.layout.shapes)           # the break-even line
    assert any(s.x0 == pytest.approx(m["break_even"]) for s in fig.layout.shapes)


def test_bench_reports_spread_verdict_and_cost_model(capsys, tmp_path):
    from speclab.cli import main
    out = tmp_path / "b.json"
    code = main(["bench", "--target", "code-target", "--draft", "code-draft", "--limit", "2", "--max-new-tokens", "12",
                 "--methods", "ar,draft-model[k=3]", "--prompts", "code-complete", "--repeats", "3",
                 "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "median over 3 repeat(s)" in text and "cost model: per-token alpha" in text
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    dm = rows["draft-model[k=3]"]
    assert len(dm["speedup_ratios"]) == 3 and dm["speedup_range"][0] <= dm["speedup_median"] <= dm["speedup_range"][1]
    assert dm["timing"] == "reliable" or dm["timing"].startswith("unreliable: ")
    m = dm["cost_model"]
    assert m["k"] == 3 and m["c"] > 0 and 0 <= m["token_alpha"] <= 1 and m["token_alpha"] >= m["alpha"]
    assert ("why_slower" in dm) == (dm["speedup_median"] < 1.0)
    assert rows["ar"]["speedup_median"] == 1.0 and "cost_model" not in rows["ar"]


def test_cost_model_of_a_run_alone_in_summary_and_export(tmp_path):
    from speclab.export import to_html
    from speclab.figures.costmodel import costmodel_summary, trace_model
    # a gated run: two plain rounds give the ar step in the run itself
    t = _trace([_chain_round(4, 0, 0.0, 0.5)] + [_chain_round(4, a, 0.010, 0.020) for a in (0, 1, 4)]
               + [Round(emitted=1, kept=1, verify_s=0.020)] * 2, 0.62)
    m = trace_model(t)
    assert m["c"] == pytest.approx((3 * 0.030 + 2 * 0.020) / 5 / 0.020) and m["k"] == 4
    fig = costmodel_summary(t)
    assert [d.name for d in fig.data][0].startswith("expected, draft-model: k 4")
    # every round drafted: c is unknown, so three round costs are drawn around the run's alpha
    alone = _trace([_chain_round(4, 0, 0.0, 0.5)] + [_chain_round(4, 2, 0.010, 0.020)] * 3, 0.3)
    assert trace_model(alone)["c"] is None
    names = [d.name for d in costmodel_summary(alone).data if d.name.startswith("expected")]
    assert names == ["expected, c = 1.0: k 4, c 1.00", "expected, c = 1.5: k 4, c 1.50", "expected, c = 2.0: k 4, c 2.00"]
    ar = _trace([Round(kept=1, verify_s=0.5), Round(kept=1, verify_s=0.02)], 1.0, "ar")
    assert costmodel_summary(ar) is None                          # nothing drafted: no model to draw
    out = to_html(t, tmp_path / "run.html")
    assert "cost model: expected speed-up" in out.read_text()


def test_compare_draws_the_cost_model_of_each_method():
    pn = pytest.importorskip("panel")  # noqa: F841
    from speclab.apps.dashboard import Dashboard
    d = Dashboard()
    d.form.method.value, d.form.prompt.value, d.form.max_new_tokens.value = "draft-model", "def parse(line):", 12
    d.compare_methods.value = ["draft-model"]
    d.compare_repeats.value = 2
    rows = d.compare_now()
    dm = next(r for r in rows if r["method"] == "draft-model")
    fig = d.compare_cost.object
    assert d.compare_cost.visible and any(tr.name.startswith("expected, draft-model") for tr in fig.data)
    assert d.compare_explorer.visible and d.compare_explorer.object.layout.sliders
    # the cost model in words, faster or slower, its verdict the measured speed-up's
    assert dm["why"].startswith("the draft guessed right ") and "plain steps and yields" in dm["why"]
    up = float(dm["speed-up vs ar"][:-1])
    assert ("faster" if up >= 1.05 else "slower" if up <= 0.95 else "about as fast") in dm["why"]


def test_explorer_figure_moves_every_k_curve_with_the_c_slider():
    from speclab import metrics
    from speclab.figures.costmodel import SLIDER_CS, SLIDER_KS, costmodel_explorer_figure
    m = dict(k=4, c=2.1, token_alpha=0.5, expected_speedup=0.8, expected_tau=1.9, measured_speedup=0.7, break_even=0.6)
    fig = costmodel_explorer_figure(m)
    [slider] = fig.layout.sliders
    assert SLIDER_CS[slider.active] == 2.0                      # starts at the run's own c
    for step, c in zip(slider.steps, SLIDER_CS):
        ys, idx = step.args[0]["y"], step.args[2]
        assert [fig.data[i].name for i in idx] == [f"k {k} at the slider's c" for k in SLIDER_KS]
        for k, y in zip(SLIDER_KS, ys):                          # the curve at alpha 0.5 is tau(0.5, k) / c
            assert abs(y[50] - metrics.expected_speedup(metrics.expected_tau(0.5, k), c)) < 1e-9
    assert "break-even alpha k 1: none" in slider.steps[SLIDER_CS.index(2.0)].args[1]["title.text"]


def test_plain_reason_reads_the_model_in_words():
    from speclab.metrics import plain_reason
    m = dict(token_alpha=0.26, drafting_share=1.0, c=2.88, expected_tau=1.34, expected_speedup=0.47)
    line = plain_reason(m, 0.45)
    assert line == ("the draft guessed right 1 time in 4; a round costs as much as 2.9 plain steps and yields "
                    "1.3 tokens; so it is slower (0.47x expected, 0.45x measured)")
    m.update(token_alpha=0.84, drafting_share=0.5, expected_speedup=1.6)
    assert "5 times in 6 (it drafted in 50% of rounds)" in plain_reason(m) and "so it is faster" in plain_reason(m)
    assert "right almost every time;" in plain_reason(dict(m, token_alpha=0.96, drafting_share=1.0))


def test_sliders_redraw_the_curve_and_read_the_numbers_out():
    pytest.importorskip("ipywidgets")
    from speclab.widgets.costmodel import CostModelExplorer
    m = {"k": 4, "c": 1.52, "token_alpha": 0.08, "alpha": 0.05, "expected_tau": 1.09, "expected_speedup": 0.717,
         "measured_speedup": 0.70, "break_even": metrics.break_even(4, 1.52), "drafting_share": 1.0}
    x = CostModelExplorer(m)
    assert (x.alpha.value, x.k.value, x.c.value) == (0.08, 4, 1.52)      # the sliders start at the run
    assert x.text.value.startswith("alpha 0.08 at k 4: expected tau 1.09, round cost 1.52 ar steps: <b>0.72x</b>")
    x.alpha.value, x.k.value, x.c.value = 0.5, 2, 1.0
    curve, point = x.fig.data[-2], x.fig.data[-1]
    assert curve.y[-1] == pytest.approx(3.0) and list(point.x) == [0.5] and point.y[0] == pytest.approx(1.75)
    assert "<b>1.75x</b>" in x.text.value and "break-even alpha 0.00" in x.text.value
    x.c.value = 3.0
    assert "break-even alpha none" in x.text.value
    assert any(t.name == "measured, measured run" for t in x.fig.data)   # the run's point stays


def test_rounds_of_different_depths_are_each_credited_up_to_their_own_depth():
    # a lookup-like run: two rounds of depth 2 accepting both, one of depth 4 accepting 3
    spec = _trace([Round(kept=1, verify_s=0.5), _chain_round(2, 2, 0.0, 0.02), _chain_round(2, 2, 0.0, 0.02),
                   _chain_round(4, 3, 0.0, 0.02)], 1.0, "prompt-lookup")
    ar = _trace([Round(kept=1, verify_s=0.5), Round(kept=1, verify_s=0.02)], 1.0, "ar")
    m = metrics.cost_model(spec, ar)
    assert not m["chain"]
    _, cond, _ = metrics.per_position(spec.rounds[1:])
    assert cond == [1.0, 1.0, 1.0, 0.0]
    # depth-2 rounds: 1 + 1 + 1 = 3 tokens each; the depth-4 round: 1 + 1 + 1 + 1 + 0 = 4
    assert m["expected_tau"] == pytest.approx((3 + 3 + 4) / 3) == m["measured_tau"]
