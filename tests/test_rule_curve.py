"""The rule sweep's reading of a sampled bench: a rule's settings in the order of the parameter it
sweeps (its default placed by value), the markdown table, and one line per rule in the figure."""
from speclab.bench.rule_curve import figure, points, table


def row(method, tau, tv=None, nll=1.0, d2=0.5, prompt_set="chat"):
    return dict(method=method, prompt_set=prompt_set, tau=tau, tv_per_step=tv, nll=nll, distinct_2=d2)


ROWS = [row("ar", 1.0, 0.0, nll=0.9, d2=0.7),
        row("draft-model[k=4]", 1.7, 0.0),
        row("draft-model[k=4;rule=lantern;rule.delta=0.4]", 2.4, 0.13),
        row("draft-model[k=4;rule=lantern]", 2.0, 0.08),
        row("draft-model[k=4;rule=lantern;rule.delta=0.05]", 1.9, 0.05),
        row("draft-model[k=4;rule=judge;rule.judge=/x;rule.threshold=0.2]", 2.1),
        row("draft-model[k=4;rule=judge;rule.judge=/x]", 1.8)]


def test_a_default_row_sits_at_its_value_and_says_it_is_the_default():
    lantern = sorted((p for p in points(ROWS) if p["rule"] == "lantern"), key=lambda p: p["key"])
    assert [p["setting"] for p in lantern] == ["delta=0.05", "delta=0.1 (default)", "delta=0.4"]
    assert [p["tau"] for p in lantern] == [1.9, 2.0, 2.4]
    judge = sorted((p for p in points(ROWS) if p["rule"] == "judge"), key=lambda p: p["key"])
    # the probe's directory is not a setting; the probe's own threshold (None) sorts after any number
    assert [p["setting"] for p in judge] == ["threshold=0.2", "threshold=None (default)"]
    assert not [p for p in points(ROWS) if p["rule"] == "exact"][0]["setting"]


def test_the_table_has_a_row_per_setting_beside_ars_quality():
    t = table(ROWS).splitlines()
    assert len(t) == 2 + 6 and all(" (0.900) " in line for line in t[2:])
    assert t[2].startswith("| chat | exact | default | 1.70 | 0.000 |")


def test_the_figure_draws_a_line_per_rule_and_judge_only_against_nll():
    fig = figure(ROWS)
    tv = [t for t in fig.data if t.xaxis == "x"]
    nll = [t for t in fig.data if t.xaxis == "x2"]
    assert sorted(t.name for t in tv) == ["exact", "lantern"]          # judge has no induced law: no TV
    assert sorted(t.name for t in nll) == ["exact", "judge", "lantern"]
    line = next(t for t in tv if t.name == "lantern")
    assert list(line.x) == [0.05, 0.08, 0.13] and list(line.text) == ["delta=0.05", "delta=0.1*", "delta=0.4"]
