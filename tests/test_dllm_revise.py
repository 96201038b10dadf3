"""Diffusion policies that revise or adapt: LLaDA 2.1's token editing (dllm-llada21-edit) rewrites
committed tokens and looks again at filled blocks; R²-dLLM (dllm-r2) pools confidence over
neighbours and finalises predictions that stopped changing. Edits are trace events that replay
honours; forwards counted are forwards run; every commit and edit is a Decision."""
import sys
from pathlib import Path

import pytest
import torch

import speclab
from speclab.decoding.diffusion import denoise
from speclab.decoding.dllm_policies import Choice, Threshold, View
from speclab.decoding.dllm_revise import R2, JointThreshold
from speclab.figures import colors
from speclab.figures.diffusion import canvas_dict, decoding_order
from speclab.models.dllm import BlockDenoiser, make_denoiser
from speclab.trace import MASK, Trace, replay

sys.path.insert(0, str(Path(__file__).parent))
from test_block_dllm import B, tiny  # noqa: E402  (a block-diffusion Llama from a config)

SUM_PROMPT = "SUM 31="
SEVEN, TWO = 7, 2                 # digits-dllm's ids of "7" and "2"


@pytest.fixture(scope="module")
def dig():
    return speclab.models.zoo.load_shared("digits-dllm")


def count_forwards(model):
    calls = []
    return calls, model.register_forward_hook(lambda *_: calls.append(1))


def changing_mind(model, first: int, later: int):
    """Make the model sure that generation slot 0 holds `first` at its first forward and `later` at
    every forward after it (digits-dllm does not shift: the row of slot 0 is the prompt's length)."""
    P, seen = 4, []

    def hook(_, __, out):
        out = out.clone()
        out[:, P, first if not seen else later] += 40.0
        seen.append(1)
        return out
    return model.lm_head.register_forward_hook(hook)


def trace_of(steps, out, G, eos=None) -> Trace:
    return Trace(engine="diffusion", method="dllm-hand", params=dict(gen_length=G, eos_id=eos),
                 output_ids=out, denoise=steps, token_text={i: str(i) for i in range(64)})


# -- (a) an edit happens, replays, is drawn -------------------------------------------------------
def test_a_token_the_model_changes_its_mind_about_is_rewritten_and_replayed(dig, tmp_path):
    model, tok = dig
    runs = []
    for method, kw in (("dllm-llada21-edit", {}), ("dllm-threshold", {"threshold": 0.7})):
        h = changing_mind(model, SEVEN, TWO)
        calls, hc = count_forwards(model)
        try:
            runs.append((speclab.run(dig, SUM_PROMPT, method, gen_length=8, **kw), len(calls)))
        finally:
            h.remove()
            hc.remove()
    (r, forwards), (plain, _) = runs
    t = r.trace
    first = t.denoise[0]
    assert 0 in first.committed and first.tokens[0] == SEVEN               # slot 0 written "7" at step 1
    edits = [(i, e) for i, s in enumerate(t.denoise) for e in s.edits]
    assert [(i, e.pos, e.before, e.after) for i, e in edits][:1] == [(1, 0, SEVEN, TWO)]  # rewritten at step 2
    assert "token to token" in edits[0][1].reason
    assert r.ids[0] == TWO and plain.ids[0] == SEVEN                          # the threshold policy keeps "7"
    assert t.totals.target_forwards == len(t.denoise) == forwards
    back = Trace.load(t.save(tmp_path / "t.json"))
    assert replay(back) == r.ids == back.output_ids and back.denoise[1].edits == t.denoise[1].edits
    # every commit and every edit is a Decision with its input, its threshold and its output
    for s in t.denoise:
        m2t = {d.at: d for d in s.decisions if d.policy == "mask-to-token"}
        t2t = {d.at: d for d in s.decisions if d.policy == "token-to-token"}
        assert sorted(m2t) == s.committed and sorted(t2t) == [e.pos for e in s.edits]
        assert all(d.threshold == 0.7 and (d.inputs["p"] >= 0.7 or d.output.startswith("forced"))
                   for d in m2t.values())
        for e in s.edits:
            d = t2t[e.pos]
            assert d.inputs["p"] > 0.5 == d.threshold
            assert (d.inputs["held"], d.inputs["proposed"]) == (e.before, e.after)
    # the canvas shows the rewritten cell in its own colour with a mark; the order map a cross
    step = edits[0][0]
    cells = canvas_dict(t, step)["data"][1]
    assert cells["customdata"][0] == "rewritten" and cells["marker"]["color"][0] == colors.EDIT["rewritten"]
    assert "it held <b>" in cells["hovertext"][0]
    marks = canvas_dict(t, step)["data"][-1]
    assert marks["name"].startswith("edited") and len(marks["x"]) == len(t.denoise[step].edits)
    order = decoding_order(t)
    assert order.data[-1].name == "rewritten or taken back" and list(order.data[-1].y)[0] == step + 1


class TakeBackSlotZero(Threshold):
    """A test policy: the threshold policy that re-masks slot 0 once, at step 2."""

    def select(self, v: View) -> Choice:
        ch = super().select(v)
        if v.step == 1:
            ch.remask = torch.zeros_like(v.eligible)
            ch.remask[0] = True
            ch.reasons = {0: "a second look"}
        return ch


def test_a_token_taken_back_is_masked_again_committed_again_and_replayed(dig):
    model, tok = dig
    h = changing_mind(model, SEVEN, TWO)
    try:
        den = make_denoiser(model)
        out, steps, totals = denoise(den, tok(SUM_PROMPT)["input_ids"], TakeBackSlotZero(0.7), 8,
                                     eos_id=tok.eos_token_id)
    finally:
        h.remove()
    assert steps[0].tokens[0] == SEVEN and 0 in steps[0].committed
    assert [(e.pos, e.before, e.after) for e in steps[1].edits] == [(0, SEVEN, MASK)] and steps[1].remasked == [0]
    assert steps[1].tokens[0] == den.mask_id and 0 in steps[2].masked and 0 in steps[2].committed
    assert out[0] == TWO and totals.target_forwards == len(steps)
    t = trace_of(steps, out, 8, tok.eos_token_id)
    assert replay(t) == out
    cells = canvas_dict(t, 1)["data"][1]
    assert cells["customdata"][0] == "remasked" and "taken back" in cells["hovertext"][0]
    assert "a second look" in cells["hovertext"][0]


# -- (b) post-edit steps on a block-causal model: bounded, counted, on the cache ------------------
def test_post_edit_forwards_look_again_at_a_filled_block_and_stop_within_the_bound():
    model = tiny()
    calls, h = count_forwards(model.model)
    try:
        den = make_denoiser(model)
        out, steps, totals = denoise(den, [1, 2, 3, 4, 5], JointThreshold(0.5, 0.0, 3), 12, B)
    finally:
        h.remove()
    assert isinstance(den, BlockDenoiser) and totals.target_forwards == len(steps)
    assert len(calls) in (0, len(steps))                  # the lean forward does not call the module
    per_block = {}
    for s in steps:
        per_block.setdefault(s.block, []).append(s)
    for block, ss in per_block.items():
        assert len(ss) <= B + 3 + 1                        # LLaDA 2.1's bound: B + post-edit steps + 1
        post = [s for s in ss if "post_edit_step" in s.info]
        assert post and all(not s.committed for s in post)
        assert ss[-1].info["block_done"] in ("no edit", "post-edit limit")
        assert all(block[0] <= e.pos < block[1] for s in ss for e in s.edits)
    assert sum(len(s.edits) for s in steps) > 0
    assert replay(trace_of(steps, out, 12)) == out


def test_a_filled_block_looked_at_again_gives_the_rows_of_a_fresh_forward():
    """The post-edit forward runs the filled block on top of the cache: its rows equal those of a
    decoder that never ran the block before, and transformers' own forward."""
    model = tiny()
    P, x = 5, torch.tensor([1, 2, 3, 4, 5] + [9, 8, 7, 6] + [47] * 8)      # block 0 filled, 47 the mask
    den = BlockDenoiser(model)
    den.start(P, B)
    den.block_logits(x)                                  # the first mask's block: block 1, caching block 0
    fresh = BlockDenoiser(model)
    fresh.start(P, B)
    again = fresh.block_logits(x, 0)                     # block 0 again, filled, nothing cached beyond the prompt
    hf = BlockDenoiser(model, backend="hf")
    hf.start(P, B)
    torch.testing.assert_close(again, hf.block_logits(x, 0), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="can not be re-masked"):
        den.block_logits(x, 0)                           # block 0 is cached: earlier blocks stay as written


# -- (c) no edits: the threshold policy, step for step --------------------------------------------
@pytest.mark.parametrize("where", ["whole canvas", "block-causal"])
def test_without_edits_the_edit_policy_is_the_threshold_policy_step_for_step(dig, where):
    if where == "whole canvas":
        model, tok = dig
        prompt, G, BL = tok("ADD 120+305=")["input_ids"], 8, 4
    else:
        model, prompt, G, BL = tiny(), [1, 2, 3, 4, 5], 12, B
    runs = []
    for pol in (JointThreshold(0.5, None), Threshold(0.5)):
        den = make_denoiser(model)
        runs.append(denoise(den, prompt, pol, G, BL, eos_id=None))
    (a, sa, ta), (b, sb, tb) = runs
    assert a == b and ta.target_forwards == tb.target_forwards == len(sa) == len(sb)
    assert [(s.committed, s.tokens, s.conf, s.edits) for s in sa] == [(s.committed, s.tokens, s.conf, []) for s in sb]


# -- (d) R²-dLLM: the counters and the spatial rules on hand sequences ------------------------------
def view(step, x0, conf, eligible, lo=0) -> View:
    G = len(x0)
    el = torch.tensor(eligible)
    z = torch.zeros(G)
    return View(step, G, (lo, G), step, el, el.clone(), torch.tensor(x0), torch.tensor(conf), z, torch.rand(G), None)


def test_stability_counters_count_unchanged_predictions_and_finalise_at_n_steps():
    """Slots 0-2 are watched; slots 3-5 are each step's best (the base rule's forced commit).
    Slot 0 keeps "5" at p 0.85: finalised at its third step. Slot 1 changes its mind at step 2:
    its streak restarts, finalised at step 4. Slot 2 is stable but unsure (0.2): its streak grows
    past 3 and it is never finalised by this rule."""
    pol = R2(window=0, token_cluster=None)                # the temporal rule alone, beside the base
    pol.plan(6, 1)
    pol.start_block(6)
    T, F = True, False
    seq = [([5, 6, 7, 1, 1, 1], [.85, .85, .2, .89, .1, .1], [T, T, T, T, T, T]),
           ([5, 9, 7, 1, 1, 1], [.85, .85, .2, 0, .89, .1], [T, T, T, F, T, T]),
           ([5, 9, 7, 1, 1, 1], [.85, .85, .2, 0, 0, .89], [T, T, T, F, F, T]),
           ([5, 9, 7, 1, 1, 1], [0, .85, .2, 0, 0, 0], [F, T, T, F, F, F])]
    got = []
    for i, (x0, conf, el) in enumerate(seq):
        ch = pol.select(view(i, x0, conf, el))
        got.append((ch.info["streak"], ch.commit.nonzero().flatten().tolist(),
                    [(d.policy, d.at) for d in ch.decisions]))
    assert got[0] == ([1, 1, 1, 0, 1, 1], [3], [("r2 base", 3)])
    assert got[1] == ([2, 1, 2, 0, 0, 2], [4], [("r2 base", 4)])
    assert got[2] == ([3, 2, 3, 0, 0, 0], [0, 5], [("r2 base", 5), ("r2 temporal", 0)])
    # step 4: slot 1 is the best and forced by the base rule, which resets its streak; slot 2 goes on
    assert got[3] == ([0, 0, 4, 0, 0, 0], [1], [("r2 base", 1)])



@pytest.mark.parametrize("agg,finalised,value", [("last", False, .6), ("ave", True, (.95 + .95 + .6) / 3),
                                                 ("max", True, .95)])
def test_a_streak_is_judged_by_its_last_mean_or_best_probability(agg, finalised, value):
    """Slot 0 proposes the same token at p 0.95, 0.95, 0.6, under the base threshold 0.97 (slot 1,
    surer, is committed by the base rule each step; the hand views show it masked again)."""
    pol = R2(threshold=0.97, window=0, token_cluster=None, temporal_eval=agg)
    pol.plan(2, 1)
    for i, c in enumerate((.95, .95, .6)):
        out = pol.select(view(i, [4, 3], [c, .99], [True, True]))
    assert out.commit.tolist() == [finalised, True] and out.info["streak"][0] == 3
    ds = [d for d in out.decisions if d.policy == "r2 temporal"]
    assert len(ds) == finalised
    if finalised:
        assert ds[0].inputs["streak"] == 3 and ds[0].threshold == 0.8
        assert ds[0].inputs[f"{agg} p"] == pytest.approx(value, abs=1e-4)


def test_a_confident_window_commits_its_masked_slots_and_a_same_token_run_commits_one():
    pol = R2(temporal_steps=0, token_cluster=None)
    pol.plan(6, 1)
    # base commits slot 0 (0.95); window [0, 3) then holds 1 committed and masked 1, 2 at mean 0.825
    ch = pol.select(view(0, [1, 2, 3, 4, 5, 6], [.95, .85, .8, .1, .1, .1], [True] * 6))
    assert ch.commit.tolist() == [True, True, True, False, False, False]
    assert {d.at: d.inputs["window"] for d in ch.decisions if d.policy == "r2 window"} == {1: [0, 3], 2: [0, 3]}
    # two committed slots in the window: more than window_unmasked = 1, no window commit
    ch = pol.select(view(1, [1, 2, 3, 4, 5, 6], [0, 0, .85, .85, .1, .1], [False, False, True, True, True, True]))
    assert ch.commit.tolist() == [False, False, True, False, False, False]   # the base's forced best only
    # token cluster: slots 3, 4 both propose 7, the best 0.81 > 0.8: the more confident slot alone
    pol = R2(window=0, temporal_steps=0)
    pol.plan(6, 1)
    ch = pol.select(view(0, [1, 2, 3, 7, 7, 6], [.95, .1, .1, .5, .81, .1], [True] * 6))
    assert ch.commit.tolist() == [True, False, False, False, True, False]
    assert [(d.policy, d.at, d.inputs["run"]) for d in ch.decisions[1:]] == [("r2 token cluster", 4, [3, 5])]


def test_r2_runs_on_a_real_model_records_its_counters_and_replays(dig):
    r = speclab.run(dig, "ADD 120+305=", "dllm-r2", gen_length=8, block_length=4)
    t = r.trace
    assert replay(t) == r.ids and t.totals.target_forwards == len(t.denoise)
    for s in t.denoise:
        lo, hi = s.block
        assert len(s.info["streak"]) == hi - lo and sorted(d.at for d in s.decisions) == s.committed
        assert sum(s.info["by_rule"].values()) == len(s.committed)


@pytest.mark.parametrize("method,kw,msg", [
    ("dllm-llada21-edit", dict(edit_threshold=1.5), "edit_threshold must be"),
    ("dllm-llada21-edit", dict(max_post_edit_steps=-1), "max_post_edit_steps must be"),
    ("dllm-r2", dict(token_cluster="left"), "token_cluster must be"),
    ("dllm-r2", dict(temporal_eval="min"), "temporal_eval must be"),
    ("dllm-r2", dict(threshold=0.0), r"threshold must be in \(0, 1\]"),
])
def test_bad_settings_are_refused(dig, method, kw, msg):
    with pytest.raises(ValueError, match=msg):
        speclab.run(dig, SUM_PROMPT, method, gen_length=8, **kw)


def test_both_are_registered_as_lossy_diffusion_methods():
    from speclab.decoding.registry import METHODS, method_defaults
    for name in ("dllm-llada21-edit", "dllm-r2"):
        m = METHODS[name]
        assert m.engine == "diffusion" and m.guarantee == "lossy" and m.family == "diffusion"
    assert method_defaults("dllm-llada21-edit") | {} == dict(
        gen_length=None, block_length=None, eos_stop=None, threshold=0.7, edit_threshold=0.5, max_post_edit_steps=16)
    assert method_defaults("dllm-r2")["temporal_steps"] == 3
