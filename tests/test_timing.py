"""Timing you can trust: the statistics and the verdict on given numbers, and the interleaved order
of real decodes."""
from __future__ import annotations

import pytest

from speclab.bench import timing


def test_cell_is_median_with_min_max_and_quartiles():
    c = timing.cell([0.30, 0.10, 0.20, 0.50, 0.40])
    assert (c.median, c.lo, c.hi, c.n) == (0.30, 0.10, 0.50, 5)
    assert (c.q1, c.q3) == pytest.approx((0.20, 0.40))
    assert c.text("{:.2f}", " s") == "0.30 s (0.10-0.50)"
    assert timing.cell([2.0]).text("{:.1f}") == "2.0"          # one run: no spread to show
    with pytest.raises(ValueError, match="at least one run"):
        timing.cell([])


def test_speedup_is_median_of_per_repeat_ratios():
    # ar 1.0, 2.0, 1.0 s; the method 0.5, 1.0, 0.8 s -> ratios 2.0, 2.0, 1.25: median 2.0, not the
    # ratio of median walls (1.0 / 0.8 = 1.25)
    up = timing.speedup([1.0, 2.0, 1.0], [0.5, 1.0, 0.8])
    assert up.ratios.values == [2.0, 2.0, 1.25]
    assert up.median == 2.0 and (up.ratios.lo, up.ratios.hi) == (1.25, 2.0)
    with pytest.raises(ValueError, match="pair them by repeat"):
        timing.speedup([1.0, 2.0], [1.0])


def test_verdict_reliable_when_ratios_agree_and_the_machine_is_quiet():
    ok, why = timing.verdict([1.50, 1.52, 1.48, 1.55, 1.51], busy=0.05)
    assert ok and why == []
    up = timing.speedup([1.0] * 3, [0.5, 0.5, 0.5], busy=0.0)
    assert up.reliable and up.text() == "2.00x (2.00-2.00)"


def test_verdict_names_each_reason():
    ok, why = timing.verdict([0.95, 1.0, 1.05])
    assert not ok and why == ["the spread crosses 1.0 (0.95x-1.05x)"]      # 5% either side: they agree
    ok, why = timing.verdict([2.0, 2.0, 2.5])
    assert not ok and why == ["the runs disagree by more than 10% (up to 25% from the median)"]
    ok, why = timing.verdict([2.0, 2.0, 2.0], busy=0.5)
    assert not ok and why == ["the machine was busy (other processes used 50% of the CPUs)"]
    ok, why = timing.verdict([3.6])
    assert not ok and why == ["one run: no spread to judge"]
    ok, why = timing.verdict([0.7, 1.0, 1.4], busy=0.3)
    assert not ok and len(why) == 3 and why[0].startswith("the spread crosses 1.0")
    up = timing.speedup([1.0, 1.0, 1.0], [1.2, 1.0, 0.8])
    assert up.text().startswith("1.00x (0.83-1.25) unreliable: the spread crosses 1.0")


def test_median_index_picks_the_lower_middle_run():
    assert timing.median_index([0.3, 0.1, 0.2]) == 2
    assert timing.median_index([0.4, 0.1, 0.3, 0.2]) == 3        # sorted 0.1 0.2 | 0.3 0.4: 0.2


def test_interleave_runs_methods_in_turn_with_real_decodes():
    import speclab
    calls = []

    def job(method):
        def run():
            calls.append(method)
            return speclab.run("code-target", "def add(a, b):", method, draft="code-draft" if method == "draft-model"
                               else None, max_new_tokens=4, record="light").trace
        return run
    m = timing.interleave({"ar": job("ar"), "draft-model": job("draft-model"), "prompt-lookup": job("prompt-lookup")},
                          3, wall=lambda t: t.totals.wall_s)
    assert calls == ["ar", "draft-model", "prompt-lookup"] * 3 == m.order
    assert all(len(m.walls[n]) == 3 and all(w > 0 for w in m.walls[n]) for n in m.walls)
    assert m.walls["ar"] == [t.totals.wall_s for t in m.results["ar"]]
    med = m.median_result("draft-model")
    assert med.totals.wall_s == m.cell("draft-model").median
    up = m.speedup("draft-model", "ar")
    assert up.ratios.n == 3 and up.median == pytest.approx(sorted(
        a / b for a, b in zip(m.walls["ar"], m.walls["draft-model"]))[1])


def test_interleave_collects_a_failing_method_and_keeps_the_others():
    errors = {}
    n = [0]

    def bad():
        n[0] += 1
        raise ValueError("k must be >= 1")
    m = timing.interleave({"ar": lambda: 1, "bad": bad}, 3, errors=errors)
    assert errors == {"bad": "k must be >= 1"} and n[0] == 1 and "bad" not in m.walls
    assert m.order == ["ar"] * 3
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        timing.interleave({"ar": lambda: 1}, 0)


def test_thresholds_move_the_verdict():
    # 25% from the median: unreliable at the default 10%, reliable when 30% is allowed
    assert not timing.verdict([2.0, 2.0, 2.5])[0]
    assert timing.verdict([2.0, 2.0, 2.5], max_disagree=0.30) == (True, [])
    ok, why = timing.verdict([2.0, 2.0, 2.05], max_disagree=0.02)
    assert not ok and why == ["the runs disagree by more than 2% (up to 2% from the median)"]
    assert timing.verdict([2.0, 2.0, 2.0], busy=0.5, max_busy=0.6) == (True, [])
    assert not timing.verdict([2.0, 2.0, 2.0], busy=0.3)[0]                 # over the default 25%
    assert timing.Thresholds() == timing.Thresholds(0.10, 0.25)
    with pytest.raises(ValueError, match="share above 0"):
        timing.Thresholds(max_disagree=0)
    with pytest.raises(ValueError, match="from 0 to 1"):
        timing.Thresholds(max_busy=1.5)


def test_bench_rows_are_judged_by_the_thresholds_given():
    # ar 1.0 s per pass; the method 0.5, 0.5, 0.4 s: ratios 2.0, 2.0, 2.5
    runs = {"ar": [[{"wall_s": 0.5}, {"wall_s": 0.5}]] * 3,
            "m": [[{"wall_s": 0.25}, {"wall_s": 0.25}]] * 2 + [[{"wall_s": 0.2}, {"wall_s": 0.2}]]}

    def judged(busy, thresholds=None):
        rows = [{}, {}]
        timing.annotate_bench_rows(rows, ["ar", "m"], runs, "ar", busy, thresholds)
        return rows[1]["timing"]
    assert judged(0.1) == "unreliable: the runs disagree by more than 10% (up to 25% from the median)"
    assert judged(0.1, timing.Thresholds(max_disagree=0.3)) == "reliable"
    assert judged(0.4, timing.Thresholds(max_disagree=0.3)).startswith("unreliable: the machine was busy")
    assert judged(0.4, timing.Thresholds(max_disagree=0.3, max_busy=0.5)) == "reliable"


def test_bench_flags_set_the_thresholds(tmp_path, capsys):
    import json

    from speclab.cli import main
    assert main(["bench", "--max-disagree", "-0.1"]) == 2
    assert "--max-disagree -0.1: give a share above 0" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    assert main(["bench", "--target", "code-target", "--methods", "ar,prompt-lookup", "--prompts", "code-edit",
                 "--limit", "1", "--max-new-tokens", "4", "--repeats", "2", "--max-disagree", "0.5",
                 "--max-busy", "1", "--json", str(out)]) == 0
    assert "unreliable where a repeat's ratio lies over 50% from the median or other processes used over 100%" \
        in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["verdict_thresholds"] == {"max_disagree": 0.5, "max_busy": 1.0}
    assert all("machine was busy" not in r["timing"] for r in res["rows"])
