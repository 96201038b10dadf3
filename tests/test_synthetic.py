"""Synthetic acceptance: the engine's real round at a chosen per-depth acceptance profile.

On the toy zoo (code-target, fp32, greedy): the output is ar's token for token at every profile; the
verify's own per-depth acceptance (metrics.per_position, which reads the verdicts, not the drafter's
plan) reproduces the profile; each judged depth is a decision record whose pass / fail the verify
confirms; the profile's figure is in the view spec and the export; bad input gets one line.
"""
from __future__ import annotations

import pytest

import speclab
from speclab import metrics
from speclab.figures.synthetic import asked_profile, synthetic_figure
from speclab.figures.views import view_of

PROMPT = "def add(a, b):"
NEW = 120


@pytest.fixture(scope="module")
def ar_ids():
    return speclab.generate("code-target", PROMPT, "ar", max_new_tokens=NEW, record=None).ids


@pytest.mark.parametrize("params", [dict(profile=[0.9, 0.7, 0.5]), dict(profile="1/1"),
                                    dict(alpha=0.0, k=2)])
def test_identical_to_ar_and_the_verify_gives_the_profile(ar_ids, params):
    r = speclab.generate("code-target", PROMPT, "synthetic", max_new_tokens=NEW, record="light", **params)
    assert r.ids == ar_ids
    asked = asked_profile(r.trace)          # the depths the run ever judged (a rate of 0 ends at depth 1)
    full = params["profile"] if "profile" in params else [params["alpha"]] * params["k"]
    full = [float(x) for x in full.split("/")] if isinstance(full, str) else full
    assert asked == full[:len(asked)] and asked
    k = len(asked)
    _, given, _ = metrics.per_position(r.trace.rounds)
    reached = [sum(1 for rnd in r.trace.rounds for d in rnd.decisions if d.at == i + 1) for i in range(k)]
    for a, g, n in zip(asked, given, reached):
        # balanced draws: the share kept is a rounded to the nearest round of those that reached it
        assert abs(g - a) <= 0.5 / n + 1e-9, (asked, given, reached)
    # every judged depth is one record; its pass / fail is what the verify did
    for rnd in r.trace.rounds:
        mine = [d for d in rnd.decisions if d.policy == "synthetic"]
        if not mine:
            continue
        assert [d.output for d in mine] == ["pass"] * len(rnd.accepted) + ["fail"] * (len(mine) - len(rnd.accepted))
        assert all(d.threshold == asked[d.at - 1] for d in mine)
    # tau follows from the profile (metrics.tree_tau), up to the run's last rounds and the rounding
    assert r.trace.totals.tau == pytest.approx(metrics.tree_tau(asked), abs=0.15)


def test_the_profile_figure_is_in_the_view_spec_and_the_export(tmp_path):
    from speclab.export import to_html
    r = speclab.generate("code-target", PROMPT, "synthetic", max_new_tokens=48, record="full", profile=[0.8, 0.5])
    assert "acceptance profile" in [f.name for f in view_of(r.trace).summary]
    fig = synthetic_figure(r.trace, 2)
    assert list(fig.data[0].y) == [0.8, 0.5] and len(fig.data) == 3           # asked, whole run, rounds 1-3
    page = to_html(r.trace, tmp_path / "s.html").read_text()
    assert "acceptance profile" in page
    other = speclab.generate("code-target", PROMPT, "oracle", max_new_tokens=16, record="full")
    assert "acceptance profile" not in [f.name for f in view_of(other.trace).summary]


@pytest.mark.parametrize("kw, says", [
    (dict(temperature=0.7), "greedy only"),
    (dict(profile=[0.5, 1.5]), "must lie in"),
    (dict(profile=[0.5, 0.5], k=3), "2 rates but k=3"),
    (dict(profile="a/b"), "as numbers"),
    (dict(alpha=2), "alpha must be a rate"),
])
def test_bad_input_gets_one_line(kw, says):
    with pytest.raises(ValueError, match=says) as e:
        speclab.generate("code-target", PROMPT, "synthetic", max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_the_explorers_run_it_puts_a_measured_point_on_the_figure():
    """The alpha / k / c explorer's "run it": synthetic at the sliders' alpha and k beside ar, timed in
    turn; the point lands on the figure at that alpha (its speed is the bench's business, not a test's)."""
    from speclab.widgets.costmodel import CostModelExplorer
    e = CostModelExplorer(None, target="code-target", prompt=PROMPT, max_new_tokens=32, repeats=1)
    e.alpha.value, e.k.value = 0.5, 3
    pt = e.run_it()
    assert pt["identical"] and pt["k"] == 3 and pt["profile"] == [0.5, 0.5, 0.5]
    assert pt["measured"] > 0 and pt["c"] > 0 and pt["expected"] == pytest.approx(pt["tau"] / pt["c"], rel=0.2)
    marks = e.fig.data[-3]                  # before the sliders' curve and point
    assert list(marks.x) == [0.5] and list(marks.y) == [pt["measured"]]
    assert "measured" in e.run_text.value and not e.run_button.disabled
    with pytest.raises(ValueError, match="needs a model and a prompt"):
        CostModelExplorer(None).run_it()
