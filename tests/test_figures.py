"""Figures: their data (which nodes, which colours, which hover text) on traces of real runs."""
from __future__ import annotations

import pytest

import speclab
from speclab import figures as F
from speclab.figures import colors
from speclab.figures._util import num
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED, Trace, replay

DECISION_TRACES = {ACCEPTED: 3, REJECTED: 4, NOT_REACHED: 5}   # draft_tree's documented trace order
PROMPT = "def parse(line):\n    "


@pytest.fixture(scope="module")
def runs(target, draft):
    """Real runs: sampled chain (u drawn, all three decisions possible), greedy tree, AR, light."""
    gen = lambda method, **kw: speclab.generate(target, PROMPT, method=method, max_new_tokens=12, **kw).trace
    return dict(
        sampled=gen("draft-model", draft=draft, k=3, temperature=1.0, seed=1, record="full"),
        tree=gen("recycling", width=2, k=4, record="full"),
        ar=gen("ar", record="light"),
        bare=gen("prompt-lookup", record=None),
    )


@pytest.fixture(scope="module")
def dag_trace():
    from pathlib import Path
    from speclab.decoding.dag import run_dag
    from speclab.models.dag import load_dag
    model = load_dag(Path(speclab.__file__).parent / "zoo" / "numwords-dat")
    return run_dag(model, "4071", strategy="all", record="full", seed=0)


def points(t) -> int:
    return sum(x is not None for x in (t.x or []))


def test_tree_has_one_point_per_drafted_node_coloured_by_decision(runs):
    for name in ("sampled", "tree", "ar"):
        tr = runs[name]
        for k, r in enumerate(tr.rounds):
            fig = F.draft_tree(tr, k)
            assert sum(points(fig.data[i]) for i in DECISION_TRACES.values()) == len(r.nodes) == r.drafted
            by_id = {n.id: n for n in r.nodes}
            for decision, i in DECISION_TRACES.items():
                t = fig.data[i]
                assert t.marker.color == colors.DECISION[decision]
                for (nid, p, q, u), hover in zip(t.customdata or [], t.hovertext or []):
                    n = by_id[nid]
                    assert n.decision == decision
                    assert f"p={num(n.p)}" in hover and f"q={num(n.q)}" in hover and f"u={num(n.u)}" in hover


def test_sampled_run_shows_draws_and_rules(runs):
    tr = runs["sampled"]
    nodes = [n for r in tr.rounds for n in r.nodes]
    tried = [n for n in nodes if n.decision != NOT_REACHED]
    assert tried and all(n.u is not None and n.rule == "spec-sampling" for n in tried)
    hovers = [h for k in range(len(tr.rounds)) for i in DECISION_TRACES.values()
              for h in (F.draft_tree(tr, k).data[i].hovertext or [])]
    assert all("u=—" not in h for h in hovers if "not reached" not in h)
    assert any("p top-k" in h and "q top-k" in h for h in hovers)      # record="full"


def test_accepted_path_is_highlighted_up_to_the_emitted_token(runs):
    for name in ("sampled", "tree"):
        tr = runs[name]
        for k, r in enumerate(tr.rounds):
            fig = F.draft_tree(tr, k)
            path, emitted = fig.data[1], fig.data[6]
            assert path.line.width > fig.data[0].line.width
            assert path.x.count(None) == len(r.accepted) + 1      # root -> ... -> emitted, one segment each
            assert emitted.x[0] == len(r.accepted) + 1            # the emitted token sits after the path
            acc = fig.data[3]
            on_path = [s for (nid, *_), s in zip(acc.customdata or [], acc.marker.size or []) if nid in r.accepted]
            assert len(on_path) == len(r.accepted) and all(s == max(acc.marker.size) for s in on_path)


def test_tree_labels_sibling_try_order(runs):
    tr = runs["tree"]
    branching = 0
    for k, r in enumerate(tr.rounds):
        kids = {}
        for n in r.nodes:
            kids.setdefault(n.parent, []).append(n)
        expect = sorted(f"try {n.try_order + 1}" for n in r.nodes
                        if n.try_order is not None and len(kids[n.parent]) > 1)
        labels = F.draft_tree(tr, k).data[7].text or ()
        assert sorted(labels) == expect
        branching += any(len(v) > 1 for v in kids.values())
    assert branching, "recycling with width=2 should draft trees once its matrix is filled"


def test_token_strip_colours_every_token_by_origin(runs):
    for tr in runs.values():
        fig = F.token_strip(tr, 0, prompt_tail=5)
        cells = fig.data[0]
        n_prompt = min(5, len(tr.prompt_ids))
        origins = [o for _, o in cells.customdata]
        assert len(origins) == n_prompt + len(tr.output_ids)
        assert origins[:n_prompt] == ["prompt"] * n_prompt
        assert [c.token for c in F.cells(tr)] == replay(tr) == tr.output_ids
        assert list(cells.marker.color) == [colors.ORIGIN[o] for o in origins]
        accepted = sum(min(len(r.accepted), r.kept) for r in tr.rounds)
        assert origins.count("accepted") == accepted
        assert len(fig.data[1].x) == 6 * tr.rounds[0].kept       # the outline: one rectangle per token
    ar = F.token_strip(runs["ar"]).data[0].customdata
    assert {o for _, o in ar} == {"prompt", "target"}


def test_token_strip_starts_a_chat_prompt_at_the_users_turn(runs):
    """A chat template's system prompt stays out of the strip; the user's turn and the assistant's
    header stay in. The same run's trace with SmolLM2's template as its prompt."""
    import copy
    tr = copy.deepcopy(runs["ar"])
    words = ["<|im_start|>", "system", "\n", "You", " are", " a", " helpful", " AI", " assistant", "<|im_end|>", "\n",
             "<|im_start|>", "user", "\n", "Why", " is", " the", " sky", " blue", "?", "<|im_end|>", "\n",
             "<|im_start|>", "ass", "istant", "\n"]
    tr.prompt_ids = [10_000 + i for i in range(len(words))]
    tr.token_text.update({10_000 + i: w for i, w in enumerate(words)})
    cells = F.token_strip(tr).data[0]
    n_prompt = sum(o == "prompt" for _, o in cells.customdata)
    assert n_prompt == len(words) - 11                                  # from the user's <|im_start|> on
    assert list(cells.text[:2]) == ["<|im_start|>", "user"] and "system" not in cells.text[:n_prompt]
    assert F.tokens.prompt_start(tr, 5) == len(words) - 5       # a long question: the tail as before


def test_token_strip_hover_has_p_and_q_of_accepted_tokens(runs):
    tr = runs["sampled"]
    cells = F.cells(tr)
    hovers = F.token_strip(tr, prompt_tail=0).data[0].hovertext
    for c, h in zip(cells, hovers):
        if c.origin == "accepted":
            assert f"p={num(c.node.p)}" in h and f"q={num(c.node.q)}" in h and "rule: spec-sampling" in h
        else:
            assert c.origin in h


def test_light_and_bare_traces_still_render(runs):
    tr = runs["bare"]                                       # record=None: no per-node records
    for k, r in enumerate(tr.rounds):
        fig = F.draft_tree(tr, k)
        assert points(fig.data[3]) == len(r.accepted)       # the accepted path is all that is known
        if r.drafted and not r.nodes:
            assert "without per-node detail" in fig.layout.title.text
    F.step_figure(tr, -1)


def test_acceptance_summary_matches_the_rounds(runs):
    tr = runs["tree"]
    fig = F.acceptance_summary(tr)
    lengths = [len(r.accepted) for r in tr.rounds]
    assert list(fig.data[0].y) == lengths and list(fig.data[1].x) == lengths
    depths, cond, uncond = F.per_position(tr)
    drafted = [r for r in tr.rounds if r.drafted]
    assert uncond[0] == sum(len(r.accepted) >= 1 for r in drafted) / len(drafted)
    assert all(a >= b for a, b in zip(uncond, uncond[1:]))         # unconditional never rises
    assert all(c >= u for c, u in zip(cond, uncond)) and all(0 <= c <= 1 for c in cond)
    assert list(fig.data[2].y) == cond and list(fig.data[3].y) == uncond
    assert F.per_position(runs["ar"]) == ([], [], [])


def test_calibration_counts_every_node_put_to_the_target(target, draft, heldout_prompts):
    """Per bin of the draft's q: the nodes whose parent was accepted (or the root), and the share of
    them accepted; every accepted node is counted once (greedy: a node is accepted only after its
    parent). The figure plots the non-empty bins at their mean q."""
    from speclab import metrics
    trs = [speclab.generate(target, p, "draft-model", draft=draft, k=4, max_new_tokens=32, record="light").trace
           for p in heldout_prompts[:3]]
    rounds = [r for t in trs for r in t.rounds]
    rows = metrics.calibration(rounds)
    tried = [n for r in rounds for n in r.nodes if n.parent == -1 or n.parent in r.accepted]
    assert sum(n for _, _, n, _ in rows) == len(tried) > 0
    assert sum(n * s for _, _, n, s in rows if n) == pytest.approx(sum(len(r.accepted) for r in rounds))
    for edge, q, n, share in rows:
        inside = [x for x in tried if min(int(x.q * 10), 9) == round(edge * 10)]
        assert n == len(inside) and (not n or edge <= q < edge + 0.1 + 1e-9)
    fig = F.calibration_figure(trs)
    assert list(fig.data[1].y) == [s for _, _, n, s in rows if n]
    with pytest.raises(ValueError, match="record"):
        F.calibration_figure(speclab.generate(target, "def f(x):", "draft-model", draft=draft, max_new_tokens=8,
                                              record=None).trace)


def test_timing_and_round_strip(runs):
    tr = runs["sampled"]
    t = F.timing(tr)
    assert sum(t.data[0].y) == pytest.approx(tr.totals.draft_s)
    assert sum(t.data[1].y) == pytest.approx(tr.totals.verify_s)
    s = F.round_strip(tr, 1)
    assert list(s.data[0].y) == [len(r.accepted) for r in tr.rounds] and list(s.data[2].x) == [2, 2]   # round 2


def test_figures_of_a_saved_trace_equal_the_live_ones(runs, tmp_path):
    tr = runs["tree"]
    loaded = Trace.load(tr.save(tmp_path / "run.json"))
    for k in range(len(tr.rounds)):
        assert F.step_figure(loaded, k).to_plotly_json() == F.step_figure(tr, k).to_plotly_json()


def test_step_is_checked(runs):
    tr = runs["ar"]
    with pytest.raises(ValueError, match="out of range"):
        F.draft_tree(tr, len(tr.rounds))
    assert F.step_figure(tr, -1).layout.meta["step"] == len(tr.rounds) - 1


def test_dag_figure_paths_links_and_emissions(dag_trace):
    run = dag_trace.dag
    names = list(run.paths)
    fig = F.dag_figure(dag_trace, names.index("viterbi"))
    n_links = len(F.dag.WIDTHS)
    strat = fig.data[n_links:n_links + len(names)]
    for name, t in zip(names, strat):
        assert t.line.color == colors.strategy_color(name)
        assert t.name.startswith(name) and t.x.count(None) == len(run.paths[name]) - 1
        assert (t.line.width == 4) == (name == "viterbi")
    verts = fig.data[-1]
    assert len(verts.x) == run.num_vertices
    top = dag_trace.text_of(run.emissions_topk[3][0][0])
    assert "emits:" in verts.hovertext[3] and top in verts.hovertext[3]
    # edge width by link probability: links with p >= 0.8 go to the widest bucket, one arc each
    strong = sum(1 for v, row in enumerate(run.links_topk) for u, p in row if p >= 0.8 and u > v)
    assert fig.data[n_links - 1].x.count(None) == strong and fig.data[n_links - 1].line.width == max(F.dag.WIDTHS)
    assert F.n_steps(dag_trace) == len(names)
    with pytest.raises(ValueError):
        F.dag_figure(Trace(engine="speculative", method="ar"))


def test_token_text_escaped_once(runs):
    """Quotes reach plotly as quotes (it would print `&quot;` literally); markup stays escaped."""
    from speclab.figures._util import tok
    tr = runs["tree"]
    tr.token_text[99999] = '"""<b>'
    assert tok(tr, 99999) == '"""&lt;b&gt;'
    del tr.token_text[99999]
