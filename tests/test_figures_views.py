"""Every view of a recorded real-model run shows token text, never an id; the lossless picture's
numbers; the attention mask view against the masks the models really use."""
from __future__ import annotations

import json
import re

import pytest
import torch

import speclab
from speclab import figures as F
from speclab.figures.distributions import distributions, lossless_parts
from speclab.figures.mask import block_mask, mask_dict, mask_figure, tree_mask
from speclab.figures.race import race_html, race_lanes
from speclab.trace import ACCEPTED, REJECTED, DraftNode, Round, Sampling, Totals, Trace

ID_LABEL = re.compile(r"(<|&lt;|\\u003c)\d+(>|&gt;|\\u003e)")     # "<2382>" as a view would show an unknown id
PROMPT = "What is the capital of France?"


def no_ids(obj, where: str) -> None:
    text = obj if isinstance(obj, str) else json.dumps(obj.to_plotly_json() if hasattr(obj, "to_plotly_json") else obj)
    found = ID_LABEL.search(text)
    assert found is None, f"{where} shows a token id {found.group()} instead of its text"


@pytest.fixture(scope="module")
def real_runs():
    """smollm2-135m with its draft, sampled (p, q and the residual recorded), and smollm2-dllm."""
    spec = speclab.run("smollm2-135m", PROMPT, "draft-model", max_new_tokens=8, record="full", temperature=0.8,
                       seed=0, chat=True).trace
    dllm = speclab.run("smollm2-dllm", PROMPT, "dllm-threshold", max_new_tokens=16, record="full", chat=True).trace
    return spec, dllm


def test_every_view_of_a_real_run_shows_token_text_never_an_id(real_runs):
    spec, dllm = real_runs
    # the token table holds every recorded candidate, so the check below is about the views
    for tr in (spec, dllm):
        assert tr.mentioned_ids() <= set(tr.token_text)
    assert any(n.p_topk for r in spec.rounds for n in r.nodes)        # record="full" really recorded top-k
    for i in range(len(spec.rounds)):
        for name, fig in (("step", F.step_figure(spec, i)), ("tree", F.draft_tree(spec, i)),
                          ("strip", F.token_strip(spec, i)), ("round strip", F.round_strip(spec, i)),
                          ("mask", mask_figure(spec, i)), ("distributions", distributions(spec, i)),
                          ("distributions at T = 0.3", distributions(spec, i, temperature=0.3))):
            if fig is not None:
                no_ids(fig, f"round {i + 1}'s {name}")
        no_ids(F.detail_html(spec, i), f"round {i + 1}'s detail")
    for name, fig in (("summary", F.acceptance_summary(spec)), ("timing", F.timing(spec))):
        no_ids(fig, name)
    no_ids(json.dumps(race_lanes([spec, spec])), "the race")
    for i in range(len(dllm.denoise)):
        for name, fig in (("canvas", F.step_figure(dllm, i)), ("order", F.decoding_order(dllm, i)),
                          ("bands", F.confidence_bands(dllm, i)), ("mask", mask_figure(dllm, i))):
            no_ids(fig, f"step {i + 1}'s {name}")
        no_ids(F.detail_html(dllm, i), f"step {i + 1}'s detail")


def test_the_id_check_catches_an_unknown_token():
    tr = Trace(engine="speculative", method="hand", prompt_ids=[1], output_ids=[2], token_text={1: "a"},
               rounds=[Round(emitted=2, emitted_kind="target", kept=1)], totals=Totals(target_forwards=1, new_tokens=1))
    with pytest.raises(AssertionError, match="token id"):
        no_ids(F.step_figure(tr, 0), "a trace with no text for token 2")


# -- why sampling is lossless, as a picture --------------------------------------------------------
def lossless_trace(p_topk, q_topk, decision=REJECTED, temperature=1.0) -> Trace:
    node = DraftNode(0, -1, 10, 1, q=q_topk[0][1], p=dict((int(t), v) for t, v in p_topk).get(10, 0.0),
                     decision=decision, u=0.9, rule="speculative", p_topk=p_topk, q_topk=q_topk)
    r = Round(nodes=[node], emitted=11, emitted_kind="correction", kept=1, drafted=1)
    text = {1: "The", 10: " cat", 11: " dog", 12: " fox"}
    return Trace(engine="speculative", method="hand", sampling=Sampling(temperature=temperature), record="full",
                 prompt_ids=[1], output_ids=[11], token_text=text, rounds=[r],
                 totals=Totals(target_forwards=1, new_tokens=1, drafted=1))


def test_p_is_drawn_as_min_p_q_stacked_with_the_residual_beside_the_accept_probability():
    p = [[11, 0.5], [10, 0.3], [12, 0.2]]
    q = [[10, 0.6], [11, 0.4]]
    fig = distributions(lossless_trace(p, q), 0)
    kept, added, accept = fig.data[3], fig.data[4], fig.data[5]
    # bars in the order of max(p, q): cat (q 0.6), dog (p 0.5), fox (p 0.2)
    assert list(kept.x) == [" cat ◀ drafted".replace(" ", "·", 1), "·dog", "·fox"]
    assert kept.y == pytest.approx([0.3, 0.4, 0.0])             # min(p, q)
    assert added.y == pytest.approx([0.0, 0.1, 0.2])            # max(0, p - q)
    assert list(added.base) == pytest.approx(list(kept.y))      # stacked on min(p, q) ...
    assert [k + a for k, a in zip(kept.y, added.y)] == pytest.approx([0.3, 0.5, 0.2])   # ... to p exactly
    assert accept.y == pytest.approx([0.5, 1.0, 1.0])           # min(1, p/q); q(fox) = 0: never drafted
    assert fig.data[2].y == pytest.approx([0.0, 1 / 3, 2 / 3])  # the residual, renormalised
    assert "min(1, 0.3 / 0.6) = 0.5" in fig.layout.title.text
    assert lossless_parts({1: 0.2}, {1: 0.8}, [1]) == {"kept": [0.2], "added": [0.0], "accept": [0.25]}


def test_a_greedy_run_says_greedy_not_t_equals_1():
    from speclab.apps.status import status_html
    tr = lossless_trace([[10, 0.7], [11, 0.3]], [[10, 0.9], [11, 0.1]], decision=ACCEPTED, temperature=0.0)
    fig = distributions(tr, 0, temperature=0.5)
    assert "ran greedy" in fig.layout.title.text and "ran at T = 1" not in fig.layout.title.text
    assert "greedy" in status_html(tr) and "T = 1" not in status_html(tr)
    assert "sampled at T = 0.8" in status_html(lossless_trace([[10, 1.0]], [[10, 1.0]], temperature=0.8))


# -- the attention mask ----------------------------------------------------------------------------
def test_tree_mask_equals_the_verify_mask_the_model_uses():
    from speclab.models.geometry import tree_depths_and_visibility
    parents = [-1, 0, 0, -1, 3, 1]
    mine = tree_mask(parents)
    _, vis = tree_depths_and_visibility(parents, 1, 0)        # x0 then the nodes, nothing cached
    assert vis.tolist() == mine
    assert mine[2] == [True, True, True, False, False, False, False]        # node 1 sees x0, node 0, itself
    assert mine[6][2] and not mine[6][3]                                    # node 5 sees node 1, not its sibling 2


def test_block_mask_equals_the_block_diffusion_mask():
    from speclab.models.geometry import block_visible
    G, B = 8, 4
    pos = torch.arange(G)
    blk, grp = pos // B, torch.zeros(G, dtype=torch.long)
    # one noisy canvas sees its own block; earlier blocks as the clean cache does
    own = block_visible(pos, blk, grp, pos, blk, grp).tolist()
    prefix = block_visible(pos, blk, grp, pos, blk, -torch.ones(G, dtype=torch.long)).tolist()
    model = [[a or b for a, b in zip(r1, r2)] for r1, r2 in zip(own, prefix)]
    assert block_mask(G, B) == model
    assert block_mask(3, 3, causal=False) == [[True] * 3] * 3


def test_mask_figure_of_a_round_and_of_a_denoising_step(real_runs):
    spec, dllm = real_runs
    i = max(range(len(spec.rounds)), key=lambda k: len(spec.rounds[k].nodes))
    r = spec.rounds[i]
    d = mask_dict(spec, i)
    grid = d["data"][0]
    assert len(grid["z"]) == len(r.nodes) + 1 and all(row[0] == 2 for row in grid["z"])   # all see the context
    assert d["layout"]["xaxis"]["ticktext"][2:] == [f"{n.id}: {F._util.tok(spec, n.token)}" for n in sorted(r.nodes, key=lambda n: n.id)]
    sizes = {len(mask_dict(spec, k)["data"][0]["z"][0]) for k in range(len(spec.rounds))}
    assert len(sizes) == 1                                            # a fixed grid: players move it in place
    s = dllm.denoise[0]
    d = mask_dict(dllm, 0)
    G, B = dllm.params["gen_length"], dllm.params["block_length"]
    z = d["data"][0]["z"]
    assert len(z) == G and len(z[0]) == G + 1
    lo, hi = s.block
    for q in range(G):
        for k in range(G):
            assert (z[q][k + 1] == 0) == (k // B > q // B)               # later blocks hidden
        assert (z[q][0] == 1) == (not lo <= q < hi)                   # rows this step did not run: pale


def test_race_page_has_a_speed_control_and_a_forward_clock(real_runs):
    spec, _ = real_runs
    lanes = race_lanes([spec, spec])
    assert [e[3] for e in lanes[0]["events"]] == [k + 1 for k, r in enumerate(spec.rounds) if r.kept]
    assert lanes[0]["forwards"] == len(spec.rounds)
    page = race_html([spec, spec])
    assert 'id="speed"' in page and "target forward" in page


# -- what a class sees first -----------------------------------------------------------------------
def test_dag_vertex_labels_sit_on_the_axis_where_plotly_keeps_them_apart():
    from pathlib import Path
    from speclab.decoding.dag import run_dag
    from speclab.models.dag import load_dag
    tr = run_dag(load_dag(Path(speclab.__file__).parent / "zoo" / "numwords-dat"), "305", strategy="all",
                 record="full")
    fig = F.dag_figure(tr, 0)
    verts = fig.data[-1]
    assert verts.name == "vertices" and verts.mode == "markers" and verts.text is None   # no words on the arcs
    rows = tr.dag.emissions_topk
    assert list(fig.layout.xaxis.ticktext) == [F._util.tok(tr, row[0][0]) for row in rows]
    assert list(fig.layout.xaxis.tickvals) == list(range(tr.dag.num_vertices))
    assert fig.layout.xaxis.tickangle is None and fig.layout.xaxis.autotickangles   # plotly turns labels that would collide


def test_the_queue_line_says_loading_then_keeps_the_wait_while_tokens_come():
    from speclab.apps.dashboard import LOADING, Dashboard
    d = Dashboard()
    d._set_busy(True, 64)
    assert d.queue_note.object == LOADING and "loading the model" in LOADING
    d._tick(0)                                      # it never waited: the page says nobody was ahead
    assert d.queue_note.object == f"{LOADING}; nobody was ahead of you in line"
    d._tick(5)                                      # and keeps saying so while tokens come
    assert d.queue_note.object == "5 of 64 tokens; nobody was ahead of you in line"
    d._set_busy(True, 64)                           # a run that waited 2nd in line, then started
    d._tick(0, place=2)
    assert d.queue_note.object.startswith("2nd in line")
    d._tick(0, place=1)
    d._tick(0)                                      # running: its place at first and its wait stay said
    assert d.queue_note.object == f"{LOADING}; you waited 0 s in line, 2nd at first"
    d._tick(3)
    assert d.queue_note.object == "3 of 64 tokens; you waited 0 s in line, 2nd at first"


def test_a_diffusion_model_is_labelled_real_or_toy_with_its_examples_parallelism():
    """Beside the target picker on a diffusion method: the real block-diffusion adapter or a toy that
    sees the whole canvas, and the slots per forward its recorded examples commit (most parallel
    first), so a class knows which model and policy show many slots committed at once."""
    from speclab.apps import guide
    from speclab.apps.dashboard import Dashboard
    seen = guide.slots_per_forward("smollm2-dllm")
    top, value = next(iter(seen.items()))
    ex = speclab.Trace.load(guide.EXAMPLES / f"{top}--smollm2-dllm--none.json")
    assert value == ex.params["gen_length"] / ex.totals.target_forwards and value > 1.5 > min(seen.values())
    note = guide.model_note("smollm2-dllm")
    assert "the real SmolLM2-135M" in note and f"{top} {value:.1f}" in note
    assert "toy" in guide.model_note("code-dllm") and guide.model_note("code-target") == ""
    d = Dashboard()
    d.form.method.value = "dllm-threshold"
    assert d.form.model_note.visible and d.form.target.value in d.form.model_note.object
    d.form.method.value = "prompt-lookup"
    assert not d.form.model_note.visible


def test_projector_mode_moves_the_reading_matter_aside():
    from speclab.apps.dashboard import Dashboard
    d = Dashboard()
    d.projector.value = True
    assert d.main.styles == {"zoom": "1.4"} and not d.intro.visible and not d.guide_card.visible
    assert d.viewer.status.styles["max-height"] and float(d.viewer.step_fig.styles["zoom"]) * 1.4 == pytest.approx(1.15, abs=1e-3)
    d.projector.value = False
    assert d.main.styles == {} and d.intro.visible and d.guide_card.visible
    assert d.viewer.status.styles == {} and d.viewer.step_fig.styles == {}


def test_the_default_token_budget_ends_the_default_chat_answer():
    from speclab.apps.form import CHAT_PROMPT, Form
    from speclab.apps import runs
    budget = Form(runs.zoo_models()).max_new_tokens.value
    r = speclab.run("smollm2-135m", CHAT_PROMPT, "ar", max_new_tokens=budget, chat=True, record=None)
    assert r.text.endswith("<|im_end|>"), f"{budget} tokens cut the default answer: {r.text!r}"   # SmolLM2's end of turn
    assert budget <= 96                                           # and a first run stays quick


def test_the_default_diffusion_demo_commits_several_slots_per_forward():
    from speclab.apps.form import DLLM_PROMPTS
    r = speclab.run("smollm2-dllm", DLLM_PROMPTS["smollm2-dllm"], "dllm-freedave", gen_length=32, chat=True,
                    record="light")
    assert r.trace.totals.tau > 1.3                              # not one token per forward
    assert max(len(s.committed) for s in r.trace.denoise) >= 2
