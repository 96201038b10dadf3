"""Each family's lesson (speclab/figures/lessons.py, declared by its engine's View) over real runs:
every step's sentence carries that run's numbers, and the player position it names holds what the
sentence says (a rejected node, a bonus, rescued tokens, siblings tried, an overlap, a stop, several
slots committed, a forced commit, an edit, a strategy's path). The offline handout steps it in
Chromium with the network off."""
from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

import speclab
from speclab.figures import step_names
from speclab.figures.lessons import NEWLINE
from speclab.figures.views import lesson_of
from speclab.trace import ACCEPTED, REJECTED, Trace

ROOT = Path(__file__).resolve().parent.parent


def example(prefix: str) -> Trace:
    return Trace.load(glob.glob(str(ROOT / f"speclab/apps/examples/{prefix}--*.json"))[0])


def by_shows(steps) -> dict:
    """The first step showing each thing."""
    out = {}
    for s in steps:
        if s.shows:
            out.setdefault(s.shows, s)
    return out


def test_speculative_lesson_lands_each_step_on_a_round_that_shows_it():
    t = example("eagle")
    steps = lesson_of(t)
    shows = by_shows(steps)
    assert [s.title for s in steps][0] == "1. Plain decoding" and steps[-1].title.endswith("its cost model")
    assert f"these {t.totals.new_tokens} new tokens" in steps[0].text and f"tau = {t.totals.tau:.2f}" in steps[-1].text
    r = t.rounds[shows["draft"].round]
    assert r.drafted and f"guessed {r.drafted} tokens" in shows["draft"].text
    rej = t.rounds[shows["rejected"].round]
    assert any(n.decision == REJECTED for n in rej.nodes)
    # on a round with an accepted prefix too, where the run has one (the old lesson landed on round 1)
    if any(rr.accepted and any(n.decision == REJECTED for n in rr.nodes) for rr in t.rounds):
        assert rej.accepted and f"{len(rej.accepted)} guess" in shows["rejected"].text
    b = t.rounds[shows["bonus"].round]
    assert b.emitted_kind == "bonus" and f"{len(b.tokens)} tokens for one target forward" in shows["bonus"].text
    assert all(0 <= s.round < len(t.rounds) for s in steps)
    assert not any("\\n" in s.text for s in steps)              # a newline shows as a symbol, not an escape


def test_multi_draft_lessons_show_several_candidates_tried_and_one_kept():
    for name in ("tree-rsd", "spectr"):
        t = example(name)
        step = by_shows(lesson_of(t)).get("siblings")
        if name == "spectr" and step is None:                     # k = 1 chain at a round: nothing to show
            continue
        r = t.rounds[step.round]
        tried = [n for n in r.nodes if n.try_order is not None]
        kids = {}
        for n in tried:
            kids.setdefault(n.parent, []).append(n)
        assert max(len(v) for v in kids.values()) >= 2, name
        kept = [n for n in tried if n.decision == ACCEPTED]
        assert (f"kept {t.text_of(kept[0].token)!r}".replace("\\n", NEWLINE) in step.text.replace('"', "'")
                if kept else "kept none" in step.text), step.text


def test_schedule_lessons_show_the_overlap_and_the_stop():
    pearl = example("pearl")
    step = by_shows(lesson_of(pearl))["overlap"]
    spans = [(lane.name, s) for lane in pearl.lanes for s in lane.spans]
    assert any(s.step == step.round for _, s in spans) and "ms of its work hidden" in step.text
    spp = example("specdec++")
    step = by_shows(lesson_of(spp))["stop"]
    d = next(d for d in spp.rounds[step.round].decisions if d.output == "stop")
    assert f"threshold {d.threshold:.2f}" in step.text and f"depth {d.at}" in step.text


def test_a_lossy_rule_lesson_shows_the_rescued_tokens(target, draft):
    """typical acceptance judged beside exact: the rescued step lands on a round where a node was
    accepted by the ruling rule and rejected by exact."""
    for seed in range(6):
        t = speclab.generate(target, "    def keys(self):\n        return", "draft-model", draft=draft, k=4,
                             rule="typical", temperature=1.0, seed=seed, max_new_tokens=32, record="light").trace
        step = by_shows(lesson_of(t)).get("rescued")
        if step is not None:
            break
    assert step is not None, "no rescued token in 6 seeded runs of typical acceptance"
    r = t.rounds[step.round]
    assert any(n.decision == ACCEPTED and REJECTED in n.verdicts.values() for n in r.nodes)
    assert "rule accepted" in step.text and "quality" in step.text


def test_diffusion_lesson_on_the_real_adapter_and_on_a_parallel_toy():
    t = example("dllm-llada21-edit")
    shows = by_shows(lesson_of(t))
    s = t.denoise[shows["committed"].round]
    assert f"committed {len(s.committed)} slots" in shows["committed"].text
    assert t.denoise[shows["forced"].round].info["forced"]
    assert t.denoise[shows["edited"].round].edits
    assert "tokens per forward" in lesson_of(t)[-1].text
    toy = speclab.run("digits-dllm", "SUM 27=", "dllm-threshold", gen_length=8).trace
    shows = by_shows(lesson_of(toy))
    s = toy.denoise[shows["committed"].round]
    assert len(s.committed) >= 2 and shows["committed"].title.endswith("Several slots at once")


def test_dag_lesson_walks_each_strategy_at_its_step():
    t = example("dag-all")
    steps = lesson_of(t)
    names = step_names(t)
    for s in steps:
        if s.shows == "path" and "strategy" in s.title:
            assert names[s.round] in s.title
    assert steps[-1].title.endswith("The answer") and t.dag.chosen in steps[-1].text
    assert f"{t.dag.num_vertices} vertices" in steps[0].text


def test_every_front_end_walks_the_same_lesson():
    pytest.importorskip("ipywidgets")
    from speclab.widgets import show
    t = example("dllm-llada21-edit")
    player = show(t)
    assert [s.title for s in player.lesson] == [s.title for s in lesson_of(t)]
    player.lesson_move(2)
    assert player.step == lesson_of(t)[2].round and "3 of" in player.lesson_text.value


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_the_exported_handout_steps_through_the_lesson_offline(tmp_path):
    """The export carries the lesson: with the network off, next / Page Down say each step and move
    the step figure's slider to the step it names."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from speclab.export import to_html
    t = example("eagle")
    steps = lesson_of(t)
    out = to_html(t, tmp_path / "handout.html")
    active = "() => document.querySelector('.speclab-figure[data-steps] .plotly-graph-div').layout.sliders[0].active"
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
                                                   args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
                                                   offline=True)
        page, errors = ctx.new_page(), []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(out.as_uri())
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
            assert steps[0].title in page.inner_text(".speclab-lesson-text")
            for k in range(1, 4):
                if k == 2:
                    page.keyboard.press("PageDown")               # a presenter's clicker
                else:
                    page.click(".speclab-lesson-next")
                page.wait_for_function(f"() => document.body.dataset.lessonAt === '{k}'", timeout=10_000)
                assert steps[k].title in page.inner_text(".speclab-lesson-text")
                page.wait_for_function(f"() => ({active})() === {steps[k].round}", timeout=10_000)
            assert not errors, errors
        finally:
            ctx.close()
