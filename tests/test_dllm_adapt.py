"""Diffusion policies that adapt where and how much they commit: AdaBlock-dLLM (dllm-adablock) ends
its blocks at a confident delimiter, inside the engine's block; ETE (dllm-ete) commits uncertain
slots until a round carries its budget of nats, and counts the cascade each set off. Every block
choice, commit, exploration and cascade is a Decision; replay reproduces the output and the
forwards counted are the forwards run."""
import math
import sys
from pathlib import Path

import pytest
import torch

import speclab
from speclab.decoding.diffusion import denoise
from speclab.decoding.dllm_adapt import ETE, AdaBlock, delimiter_ids
from speclab.decoding.dllm_policies import Threshold, View
from speclab.figures.decisions import decision_summary
from speclab.figures.views import view_of
from speclab.models.dllm import make_denoiser
from speclab.trace import Trace, replay

sys.path.insert(0, str(Path(__file__).parent))
from test_block_dllm import B, tiny  # noqa: E402  (a block-diffusion Llama from a config)

CODE_PROMPT = "def read_config(path):"
NL = 9                                   # the hand views' delimiter id


@pytest.fixture(scope="module")
def code():
    return speclab.models.zoo.load_shared("code-dllm")


def view(step, x0, conf, eligible, block=None) -> View:
    G = len(x0)
    el = torch.tensor(eligible)
    z = torch.zeros(G)
    return View(step, G, block or (0, G), step, el, el.clone(), torch.tensor(x0), torch.tensor(conf), z,
                torch.rand(G), None)


def committed(ch) -> list[int]:
    return ch.commit.nonzero().flatten().tolist()


# -- AdaBlock-dLLM ---------------------------------------------------------------------------------
def adablock(G, **kw) -> AdaBlock:
    pol = AdaBlock(**kw)
    pol.set_delimiter_ids([NL])
    pol.plan(G, 1)
    pol.start_block(G)
    return pol


def test_a_confident_delimiter_ends_the_adaptive_block_and_the_next_starts_after_it():
    """G = 16, window int(0.25 * 16) = 4 slots. Slot 2 proposes a delimiter at p 0.5 >= 0.3: the
    block is [0, 3); slot 5's surer delimiter is outside the window. Slot 4 (p 0.95) waits although
    it passes the threshold. Once [0, 3) is filled the next block starts at slot 3."""
    pol = adablock(16)
    T, F = True, False
    x0 = [1, 2, NL, 3, 4, NL] + [5] * 10
    ch = pol.select(view(0, x0, [.95, .4, .5, .2, .95, .9] + [.1] * 10, [T] * 16))
    assert committed(ch) == [0] and ch.info["adaptive_block"] == [0, 3]
    blk = ch.decisions[0]
    assert (blk.policy, blk.at, blk.output, blk.threshold) == ("adablock block", 0, 3, 0.3)
    assert blk.inputs["delimiter at"] == 2 and blk.inputs["window"] == [0, 4] and blk.inputs["candidates"] == [[2, .5]]
    assert [(d.policy, d.at, d.output) for d in ch.decisions[1:]] == [("adablock commit", 0, "commit")]
    ch = pol.select(view(1, x0, [0, .4, .5, .2, .95, .9] + [.1] * 10, [F] + [T] * 15))
    assert committed(ch) == [2] and ch.decisions[-1].output == "forced (best masked)"   # best of [1, 3)
    ch = pol.select(view(2, x0, [0, .6, 0, .2, .95, .9] + [.1] * 10, [F, T, F] + [T] * 13))
    assert committed(ch) == [1] and not any(d.policy == "adablock block" for d in ch.decisions)
    # [0, 3) is filled: a new block from slot 3; slot 5's delimiter at 0.9 cuts it at [3, 6)
    ch = pol.select(view(3, x0, [0, 0, 0, .2, .95, .9] + [.1] * 10, [F, F, F] + [T] * 13))
    assert ch.info["adaptive_block"] == [3, 6] and committed(ch) == [4, 5]


@pytest.mark.parametrize("x0,conf,why,size", [
    ([1] * 8, [.5] * 8, "no delimiter in the window", 5),
    ([1, NL] + [1] * 6, [.5, .2] + [.5] * 6, "delimiter below its threshold", 5),
])
def test_without_a_confident_delimiter_the_block_is_the_default_size(x0, conf, why, size):
    pol = adablock(8, default_block=5)
    ch = pol.select(view(0, x0, conf, [True] * 8))
    assert ch.decisions[0].note == why and ch.decisions[0].output == size and ch.info["adaptive_block"] == [0, size]


def test_adaptive_blocks_stay_inside_the_engine_block_of_a_block_causal_model():
    """tiny() is trained block-causal with B = 4: an adaptive block never crosses an edge of 4."""
    den = make_denoiser(tiny())
    pol = AdaBlock(threshold=0.5, default_block=3)
    pol.set_delimiter_ids(range(0, 47, 3))               # a third of the vocabulary ends a "line"
    out, steps, totals = denoise(den, [1, 2, 3, 4, 5], pol, 12, B)
    assert totals.target_forwards == len(steps) and replay(trace_of(steps, out, 12)) == out
    for s in steps:
        lo, hi = s.block
        a, b = s.info["adaptive_block"]
        assert lo <= a < b <= hi and all(a <= p < b for p in s.committed)
    sizes = [d.output for s in steps for d in s.decisions if d.policy == "adablock block"]
    assert sizes and max(sizes) <= 3


def trace_of(steps, out, G) -> Trace:
    return Trace(engine="diffusion", method="dllm-hand", params=dict(gen_length=G), output_ids=out, denoise=steps,
                 token_text={i: str(i) for i in range(64)})


def test_without_adaptation_adablock_is_the_threshold_policy_step_for_step(code):
    model, tok = code
    ids = tok(CODE_PROMPT)["input_ids"]
    pol = AdaBlock(threshold=0.5, delimiter_threshold=2.0, default_block=16)
    pol.use_tokenizer(tok)
    a, sa, _ = denoise(make_denoiser(model), ids, pol, 16, eos_id=None)
    b, sb, _ = denoise(make_denoiser(model), ids, Threshold(0.5), 16, eos_id=None)
    assert a == b and [s.committed for s in sa] == [s.committed for s in sb]


def test_adablock_runs_on_a_real_model_records_its_blocks_and_replays(code, tmp_path):
    r = speclab.run(code, CODE_PROMPT, "dllm-adablock", gen_length=32, threshold=0.7)
    t = Trace.load(r.trace.save(tmp_path / "t.json"))
    assert replay(t) == r.ids and t.totals.target_forwards == len(t.denoise)
    starts = []
    for s in t.denoise:
        a, b = s.info["adaptive_block"]
        commits = sorted(d.at for d in s.decisions if d.policy == "adablock commit")
        assert commits == s.committed and all(a <= p < b for p in commits)
        starts += [(d.at, d.output) for d in s.decisions if d.policy == "adablock block"]
    # the blocks tile the canvas left to right, each chosen at its first step
    assert [a for a, _ in starts] == [0] + [a + n for a, n in starts[:-1]]
    assert view_of(t).summary and any(f.name == "decisions over the run" for f in view_of(t).summary)


def test_delimiters_are_read_from_token_texts():
    texts = ["a", "\n", "x.", "b,", " \n  ", "e.g", "?", ""]
    assert delimiter_ids(texts, "line") == [1, 4]
    assert delimiter_ids(texts, "sentence") == [1, 2, 4, 6]
    assert delimiter_ids(texts, "clause") == [1, 2, 3, 4, 6]


# -- ETE -------------------------------------------------------------------------------------------
def test_a_round_below_its_budget_explores_the_surest_uncertain_slots():
    """Slot 0 passes 0.9 (0.105 nats) and is exploited; the round is under its 1-nat budget, so
    slot 2 (p 0.6, the surest below 0.9: 0.51 nats) and then slot 1 (p 0.5) are explored, the
    second taking the round past the budget; slot 3 is not."""
    pol = ETE()
    pol.plan(4, 1)
    ch = pol.select(view(0, [1, 2, 3, 4], [.9, .5, .6, .3], [True] * 4))
    assert committed(ch) == [0, 1, 2] and ch.info["explored"] == [2, 1]
    assert ch.info["information"] == pytest.approx(-math.log(.9) - math.log(.6) - math.log(.5), abs=1e-3)
    explore = [d for d in ch.decisions if d.policy == "ete explore"]
    assert [d.at for d in explore] == [2, 1] and explore[0].threshold == 1.0
    assert explore[1].inputs["round information"] == pytest.approx(-math.log(.9) - math.log(.6), abs=1e-3)
    rnd = ch.decisions[-1]
    assert rnd.policy == "ete round" and rnd.output == 2 and rnd.inputs["committed"] == 3
    # leftmost: slot 1, then slot 2; a budget already met by the exploits explores nothing
    pol = ETE(explore_by="leftmost")
    pol.plan(4, 1)
    assert pol.select(view(0, [1, 2, 3, 4], [.9, .5, .6, .3], [True] * 4)).info["explored"] == [1, 2]
    pol = ETE(budget=0.1)
    pol.plan(4, 1)
    assert pol.select(view(0, [1, 2, 3, 4], [.9, .5, .6, .3], [True] * 4)).info["explored"] == []


def test_the_cascade_counts_slots_that_cross_the_threshold_for_the_nearest_explored_slot():
    """Round 1 explores slots 1 and 6 (nothing passes 0.9). In round 2 slots 2, 3 and 7 cross 0.9:
    2 and 3 are nearest to slot 1, 7 to slot 6; slot 4 stays below."""
    pol = ETE(budget=5.0)
    pol.plan(8, 1)
    T, F = True, False
    pol.select(view(0, [1] * 8, [.1, .5, .2, .2, .1, .1, .4, .2], [T] * 8))
    ch = pol.select(view(1, [1] * 8, [.1, 0, .95, .92, .3, .1, 0, .97], [T, F, T, T, T, T, F, T]))
    assert ch.info["cascade"] == [[1, 2], [6, 1]] and ch.info["crossed"] == 3
    casc = {d.at: d for d in ch.decisions if d.policy == "ete cascade"}
    assert casc[1].output == 2 and casc[1].inputs["crossed"] == [2, 3] and casc[6].output == 1
    assert [d.at for d in ch.decisions if d.policy == "ete exploit"] == [2, 3, 7]


@pytest.mark.parametrize("kw", [dict(budget=0.0), dict(max_explore=0)])
def test_without_exploring_ete_is_the_threshold_policy_step_for_step(code, kw):
    model, tok = code
    ids = tok(CODE_PROMPT)["input_ids"]
    a, sa, _ = denoise(make_denoiser(model), ids, ETE(threshold=0.5, **kw), 16, eos_id=None)
    b, sb, _ = denoise(make_denoiser(model), ids, Threshold(0.5), 16, eos_id=None)
    assert a == b and [s.committed for s in sa] == [s.committed for s in sb]
    assert all(s.info["explored"] == [] for s in sa)


def test_ete_runs_on_a_real_model_records_its_information_and_replays(code, tmp_path):
    r = speclab.run(code, CODE_PROMPT, "dllm-ete", gen_length=32)
    t = Trace.load(r.trace.save(tmp_path / "t.json"))
    assert replay(t) == r.ids and t.totals.target_forwards == len(t.denoise)
    prev = []
    for s in t.denoise:
        conf = dict(zip(s.masked, s.conf))
        nats = sum(-math.log(max(conf[p], 1e-30)) for p in s.committed)
        assert s.info["information"] == pytest.approx(nats, abs=1e-2)        # the trace's conf is rounded
        assert set(s.info["explored"]) <= set(s.committed)
        at = sorted(d.at for d in s.decisions if d.policy in ("ete exploit", "ete explore"))
        assert at == s.committed
        assert [e for e, _ in s.info["cascade"]] == prev
        prev = s.info["explored"]
    assert sum(len(s.info["explored"]) for s in t.denoise) > 0
    # the existing views show the meter: one summary panel per decision kind, the budget dashed
    fig = decision_summary(t)
    titles = [a.text for a in fig.layout.annotations]
    assert {"ete round", "ete explore", "ete cascade"} <= set(titles)


@pytest.mark.parametrize("method,kw,msg", [
    ("dllm-adablock", dict(delimiters="word"), "delimiters must be one of line, sentence, clause"),
    ("dllm-adablock", dict(delimiter_threshold=-1.0), "delimiter_threshold must be >= 0"),
    ("dllm-adablock", dict(default_block=0), "default_block must be an integer >= 1"),
    ("dllm-adablock", dict(window=0.0), r"window must be in \(0, 1\]"),
    ("dllm-adablock", dict(threshold=1.5), r"threshold must be in \(0, 1\]"),
    ("dllm-ete", dict(budget=-0.5), "budget must be >= 0"),
    ("dllm-ete", dict(max_explore=1.5), "max_explore must be an integer >= 0"),
    ("dllm-ete", dict(explore_by="random"), "explore_by must be confidence or leftmost"),
])
def test_bad_settings_are_refused_in_one_line(code, method, kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        speclab.run(code, CODE_PROMPT, method, gen_length=8, **kw)
    assert "\n" not in str(e.value)


def test_adablock_without_its_delimiters_says_how_to_get_them(code):
    model, tok = code
    with pytest.raises(ValueError, match="use_tokenizer"):
        denoise(make_denoiser(model), tok(CODE_PROMPT)["input_ids"], AdaBlock(), 8)


def test_both_are_registered_as_lossy_diffusion_methods():
    from speclab.decoding.registry import METHODS, method_defaults
    for name in ("dllm-adablock", "dllm-ete"):
        m = METHODS[name]
        assert m.engine == "diffusion" and m.guarantee == "lossy" and m.family == "diffusion"
    assert method_defaults("dllm-adablock") == dict(gen_length=None, block_length=None, eos_stop=None, threshold=0.9,
                                                    delimiter_threshold=0.3, default_block=32, window=0.25,
                                                    delimiters="line")
    assert method_defaults("dllm-ete")["budget"] == 1.0 and "From Bits to Rounds" in METHODS["dllm-ete"].summary
