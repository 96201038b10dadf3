"""The diffusion report's measures on the toy zoo: forward rows count a batched verify's canvases,
content stops at the end of text, the AR target's NLL is its own log-likelihood, and the sweep plot
draws every policy."""
from __future__ import annotations

import json

import pytest
import torch

import speclab
from speclab.bench import dllm_curve as C
from speclab.bench import dllm_eval as D


def test_content_length_stops_at_the_end_of_text():
    assert D.content_length([5, 6, 2, 9, 9], 2) == 3 and D.content_length([5, 6], 2) == 2
    assert D.content_length([5, 6], None) == 2


def test_forward_rows_count_each_verified_canvas(one_thread):
    model, tok = speclab.load("code-dllm")
    r = speclab.run((model, tok), "def add(a, b):", "dllm-freedave", gen_length=16, block_length=8, record="light")
    verified = [st.info["drafts"] for st in r.trace.denoise if st.info.get("verified_forward")]
    assert verified, "FreeDave verified no batch: the test would prove nothing"
    assert D.forward_rows(r.trace) == r.trace.totals.target_forwards + sum(k - 1 for k in verified)
    one = speclab.run((model, tok), "def add(a, b):", "dllm-lowconf", gen_length=16, block_length=8, record="light")
    assert D.forward_rows(one.trace) == one.trace.totals.target_forwards


def test_target_nll_is_the_models_own_log_likelihood(one_thread):
    model, tok = speclab.load("code-target")
    prompt, answer = [5, 17, 30], [40, 41, 7]
    nll, n = D.target_nll(model, prompt, answer)
    with torch.no_grad():
        ids = torch.tensor([prompt + answer])
        logp = model(ids).logits[0].float().log_softmax(-1)
    want = -sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(answer))
    assert n == 3 and abs(nll - want) < 1e-4


def test_report_rows_and_sweep_plot(one_thread):
    seen = []
    rows = D.report("code-dllm", "code-target", ["code-complete"], 2, gen_length=16, block_length=8,
                    policies="dllm-threshold", sweep=(0.5, 0.9),
                    on_row=lambda r: seen.append(len(r["code-complete"])))["code-complete"]
    assert seen == list(range(1, len(rows) + 1))              # after every row, ar's last
    by = {r["policy"]: r for r in rows}
    assert by["one per step"]["positions_equal"] == 1.0 and by["one per step"]["content_per_row"] <= 1.0
    assert "threshold 0.5 (sweep)" in by and by["ar on code-target"]["method"] == "ar"
    assert all(r["nll_per_token"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    fig = C.sweep_figure({"code-complete": rows})
    assert [round(x, 3) for x in fig.data[0].x] == [by[k]["positions_equal"] for k in (
        "threshold 0.5 (sweep)", "threshold 0.7", "threshold 0.9")]             # the sweep's line, by threshold
    md = D.report_markdown({"code-complete": rows}, "code-dllm", 2, 16, 8)
    assert md.count("\n|") == len(rows) + 2                      # the head, its rule, a row per policy

    kept = {"code-complete": [r for r in rows if r["policy"] in ("one per step", "threshold 0.9")]}
    again = D.report("code-dllm", "code-target", ["code-complete"], 2, gen_length=16, block_length=8,
                     policies="dllm-threshold", sweep=(0.5,), done=kept)["code-complete"]
    assert again[:2] == kept["code-complete"]                    # kept as they were, not run again
    assert [r["policy"] for r in again[2:]] == [r["policy"] for r in rows[2:]]      # the rest, in order


def row(policy, method, params, eq, per_row):
    return dict(policy=policy, method=method, params=params, positions_equal=eq, content_per_row=per_row)


def test_above_curve_reads_each_policy_against_the_threshold_sweep():
    rows = [row("threshold 0.9", "dllm-threshold", {"threshold": 0.9}, 0.9, 1.0),
            row("threshold 0.7", "dllm-threshold", {"threshold": 0.7}, 0.5, 1.5),
            row("factor 1.0", "dllm-threshold", {"factor": 1.0}, 0.6, 3.0),     # not a sweep point, not read
            row("over", "dllm-fastv2", {}, 0.7, 1.3),           # the curve gives 1.25 at 0.7
            row("under", "dllm-r2", {}, 0.7, 1.2),
            row("right", "dllm-freedave", {}, 1.0, 1.0),        # more agreement, as many tokens as 0.9
            row("right, fewer", "dllm-lowconf", {}, 1.0, 0.98),
            row("left", "dllm-ete", {}, 0.1, 2.5),              # less agreement than every threshold run
            row("ar on base", "ar", {}, None, 1.0)]
    assert C.threshold_curve(rows) == [(0.5, 1.5), (0.9, 1.0)]
    assert C.above_curve(rows) == ["over", "right"]
    assert C.above_curve(rows[2:]) == []                       # no curve to read against
    assert C.lift(rows)["over"] == pytest.approx(1.3 / 1.25) and "left" not in C.lift(rows)
    # the best point: above the curve on every set, the most lifted on average
    other = [r if r["policy"] != "over" else dict(r, content_per_row=1.26) for r in rows]    # barely over
    other = [r if r["policy"] != "right" else dict(r, content_per_row=1.2) for r in other]   # 1.2 over 1.0
    assert C.best_point({"a": rows, "b": other}) == ("dllm-freedave", {})
    with pytest.raises(ValueError, match="above dllm-threshold's curve on every"):
        C.best_point({"a": rows, "b": rows[:2]})


def test_merge_joins_reports_of_separate_sets(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    D.write_json({"chat": [row("x", "m", {}, 1.0, 1.0)]}, str(a))
    D.write_json({"code-edit": [row("y", "m", {}, 0.5, 2.0)]}, str(b))
    merged = D.merge([str(a), str(b)])
    assert list(merged) == ["chat", "code-edit"] and merged["code-edit"][0]["policy"] == "y"
    assert json.loads(a.read_text()) == {"chat": merged["chat"]}
    with pytest.raises(ValueError, match="more than one"):
        D.merge([str(a), str(a)])
    c = tmp_path / "c.json"                             # a set's policies split over two runs
    D.write_json({"chat": [row("z", "m", {}, 0.8, 1.2)]}, str(c))
    assert [r["policy"] for r in D.merge([str(a), str(c)])["chat"]] == ["x", "z"]
