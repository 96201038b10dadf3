"""Fast-dLLM v2 (dllm-fastv2): sub-blocks filled left to right inside the block of a block-diffusion
LM, each step running the whole block (refreshing the block cache) or only the sub-block on the
stale keys / values of the rest of the block. Without the block cache the schedule is the same
rule on a whole-block forward; on a fresh block cache the sub-block forward is the whole-block
forward; every forward and commit is a Decision; forward rows count what ran."""
import copy
import sys
from pathlib import Path

import pytest
import torch

import speclab
from speclab.bench.dllm_eval import forward_rows
from speclab.decoding.diffusion import denoise
from speclab.decoding.dllm_adapt import FastV2
from speclab.figures import decision_summary, decision_table
from speclab.models.dllm import BlockDenoiser, make_denoiser

sys.path.insert(0, str(Path(__file__).parent))
from test_block_dllm import MASK, B, reference, tiny  # noqa: E402  (a block-diffusion Llama, B = 4)

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def code_block():
    """code-dllm (the toy zoo's whole-canvas dLLM) run block-causally, blocks of 8: a copy, so the
    shared model keeps its own config."""
    model, tok = speclab.models.zoo.load_shared("code-dllm")
    model = copy.deepcopy(model)
    model.config.speclab_block_causal, model.config.speclab_block_length = True, 8
    return model, tok


def schedule_by_hand(model, prompt, G, BL, b, tau):
    """The paper's loop, written out with no cache: each step the training-layout forward of the
    active block (test_block_dllm.reference), then commit in the leftmost sub-block with a mask:
    its masked slots with p > tau, the block's first slot at the block's first step, at least the
    most confident."""
    P = len(prompt)
    x = torch.tensor(prompt + [MASK] * G)
    forwards = 0
    for lo in range(P, P + G, BL):
        while bool((x[lo:lo + BL] == MASK).any()):
            rows = reference(model, x, P)                              # (BL, V), block of the first mask
            rows[:, MASK] = -float("inf")
            forwards += 1
            p, x0 = rows.softmax(-1).max(-1)
            a = int((x[lo:lo + BL] == MASK).nonzero()[0]) // b * b
            cand = torch.zeros(BL, dtype=torch.bool)
            cand[a:a + b] = True
            cand &= x[lo:lo + BL] == MASK
            commit = cand & (p > tau)
            if x[lo] == MASK:
                commit[0] = True
            if not commit.any():
                commit[torch.where(cand, p, torch.full_like(p, -1.0)).argmax()] = True
            x[lo:lo + BL][commit] = x0[commit]
    return x[P:].tolist(), forwards


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_a_block_cache_the_sub_block_schedule_recomputes_the_whole_block(seed):
    model, G, BL, b, tau = tiny(seed), 16, B, 2, 0.99
    want, want_fwd = schedule_by_hand(model, PROMPT, G, BL, b, tau)
    runs = {}
    for cache in ("none", "block"):
        out, steps, totals = denoise(make_denoiser(model), PROMPT, FastV2(b, tau, cache), G, BL, eos_stop=False)
        assert out == want and totals.target_forwards == want_fwd == len(steps)
        runs[cache] = steps
    assert [s.committed for s in runs["none"]] == [s.committed for s in runs["block"]]
    assert {s.info["rows"] for s in runs["block"]} == {BL}
    # no cache: each forward runs the prompt and every committed block again
    assert [s.info["rows"] for s in runs["none"]] == [len(PROMPT) + s.block[0] + BL for s in runs["none"]]
    assert want_fwd > G // b                                        # tau 0.99: sub-blocks take several steps


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_a_sub_block_forward_on_a_fresh_block_cache_gives_the_whole_block_rows(backend):
    model, P, BL = tiny(), len(PROMPT), 8

    def fresh_rows(x):                               # a decoder that never held a block cache
        den = BlockDenoiser(model, backend=backend)
        den.start(P, BL)
        return den.block_logits(x, 0)

    x = torch.tensor(PROMPT + [9, 8, 7, 6, 5, MASK, 11, MASK] + [MASK] * 8)
    den = BlockDenoiser(model, backend=backend)
    den.start(P, BL)
    whole = den.refresh_block(x, 0)
    torch.testing.assert_close(whole, fresh_rows(x), atol=1e-5, rtol=1e-5)
    sub = den.sub_block_logits(x, 0, 4, 4)                           # slots 4..7; rows 5..7 computed
    assert den.forwards == 2
    torch.testing.assert_close(sub[5:8], whole[5:8], atol=1e-4, rtol=1e-4)
    assert torch.equal(sub[:5], whole[:5])                           # rows outside it: as last computed
    # the rest of the block is read from the cache, stale: a changed slot before the sub-block is
    # not seen until the next refresh
    y = x.clone()
    y[P + 2] = 30
    stale = den.sub_block_logits(y, 0, 4, 4)
    torch.testing.assert_close(stale[5:8], whole[5:8], atol=1e-4, rtol=1e-4)
    fresh = fresh_rows(y)
    assert (fresh[5:8] - whole[5:8]).abs().max() > 1e-2
    # any other forward drops the block cache: the rows of a decoder that never held it
    again = den.block_logits(y, 0)
    torch.testing.assert_close(again, fresh, atol=1e-4, rtol=1e-4)
    assert not den.holds_block(0)
    with pytest.raises(ValueError, match="no block cache"):
        den.sub_block_logits(y, 0, 4, 4)
    den.refresh_block(x, 0)
    with pytest.raises(ValueError, match="first slot .* is masked"):
        den.sub_block_logits(x, 0, 5, 3)


def test_every_forward_and_commit_is_recorded_and_forward_rows_count_what_ran(code_block):
    model, tok = code_block
    tr = speclab.run((model, tok), "def add(a, b):", "dllm-fastv2", gen_length=16, block_length=8,
                     sub_block=4, threshold=0.95, eos_stop=False).trace
    steps = tr.denoise
    assert tr.totals.target_forwards == len(steps) and tr.params["block_causal"]
    rows = 0.0
    for s in steps:
        (fwd,) = [d for d in s.decisions if d.policy == "fastv2 forward"]
        s0, s1 = s.info["sub_block"]
        assert fwd.inputs["sub-block"] == [s0, s1] and s1 - s0 == 4 and s0 % 4 == 0
        if s0 in s.masked:                                            # a block's first step, or a sub-block
            assert fwd.inputs["block cache"] == "refreshed" and fwd.output == s.info["rows"] == 8   # starting on a mask
        else:
            assert fwd.inputs["block cache"] == "reused" and fwd.output == s.info["rows"] == 4
        commits = {d.at: d.output for d in s.decisions if d.policy == "fastv2 commit"}
        assert set(commits) == {p for p in s.masked if s0 <= p < s1}        # every masked slot of the sub-block
        assert sorted(p for p, o in commits.items() if o != "wait") == s.committed
        assert all(s0 <= p < s1 for p in s.committed)
        if s.block[0] in s.masked:
            assert commits[s.block[0]] == "AR first token"
        rows += s.info["rows"] / 8
    assert any(d.inputs["block cache"] == "reused" for s in steps for d in s.decisions if d.policy == "fastv2 forward")
    assert forward_rows(tr) == pytest.approx(rows) and forward_rows(tr) < len(steps)
    assert "fastv2 forward" in str(decision_summary(tr).layout.annotations)      # the existing views
    assert decision_table(tr, 0).data[0].cells.values[0][0] == "fastv2 forward"


@pytest.mark.parametrize("params, message", [
    ({"sub_block": 0}, "sub_block must be an integer >= 1"),
    ({"sub_block": 2.5}, "sub_block must be an integer >= 1"),
    ({"threshold": 0.0}, r"threshold must be in \(0, 1\]"),
    ({"threshold": 1.5}, r"threshold must be in \(0, 1\]"),
    ({"cache": "dual"}, "cache must be one of sub-block, block, none"),
    ({"block_cache": True}, "dllm-fastv2 does not take"),
])
def test_bad_parameters_fail_in_one_line(code_block, params, message):
    with pytest.raises(ValueError, match=message) as e:
        speclab.run(code_block, "def f():", "dllm-fastv2", gen_length=8, block_length=8, **params)
    assert "\n" not in str(e.value)


def test_a_whole_canvas_dllm_is_refused_in_one_line():
    with pytest.raises(ValueError, match="needs a block-diffusion LM") as e:
        speclab.run("code-dllm", "def f():", "dllm-fastv2", gen_length=8)
    assert "\n" not in str(e.value)
