"""Skipping sublayers of the target: the lean forward less a skip set (nothing skipped is the full
forward bit for bit; a skipped attention writes no cache and a draft leaves the committed cache as
it was), SWIFT (lossless: greedy equality with `ar` on the code zoo, the joint of two sampled tokens
at T = 1 on a toy; the skip mask and the search recorded; skip sets kept per task in a store the
caller owns) and Unified Layer Skipping (lossy, its even pattern, refused on transformers' forward)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.swift import SkipSets, SwiftDrafter, even_pattern
from speclab.decoding.registry import guarantee
from speclab.decoding.speculative import Context, decode
from speclab.figures.skips import skip_mask_figure
from speclab.figures.views import view_of
from speclab.models import kernels
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.skips import SkipSet

from test_rules import chi2_p    # tests/ is on the path, as for conftest

NEW = 32


@pytest.fixture(scope="module")
def lm(target):
    """The toy target's lean forward at one fixed team size: its fp32 rows are torch's ops, whose bits
    may differ between thread counts, and a busy machine moves the "auto" size between forwards."""
    lm = LeanLM(target[0], "target")
    lm.team = kernels.TeamSize(1)
    return lm


def prefill(lm, ids, **kw):
    lm.reset()
    return lm.forward(torch.tensor(ids), **kw)


# -- the forward less a skip set --------------------------------------------------------------------
def test_a_skip_set_that_skips_nothing_is_the_full_forward_bit_for_bit(lm):
    ids = [5, 17, 300, 42, 9, 77]
    full = prefill(lm, ids)
    assert torch.equal(prefill(lm, ids, skip=SkipSet()), full)
    lm.reset()
    assert torch.equal(lm.skip_lm(SkipSet()).forward(torch.tensor(ids)), full)


def test_skipping_changes_the_logits_and_the_tail_skipped_is_the_early_exit(lm):
    ids = [5, 17, 300, 42, 9, 77]
    full = prefill(lm, ids)
    attn, mlp = prefill(lm, ids, skip=SkipSet(attn=frozenset({3}))), prefill(lm, ids, skip=SkipSet(mlp=frozenset({3})))
    assert not torch.equal(attn, full) and not torch.equal(mlp, full) and not torch.equal(attn, mlp)
    lm.reset()
    exit4 = lm.exit_lm(4).forward(torch.tensor(ids))
    assert torch.equal(prefill(lm, ids, skip=SkipSet.layers(range(4, 8))), exit4)
    with pytest.raises(ValueError, match=r"outside this model's 0\.\.7"):
        lm.skip_lm(SkipSet.layers([8]))


def test_a_skipped_attention_writes_no_cache_and_a_draft_leaves_the_committed_cache_as_it_was(lm):
    prompt, more = [5, 17, 300, 42], [9, 77, 12]
    prefill(lm, prompt)
    clean = lm.forward(torch.tensor(more))                          # what the verify gives with no draft before it
    lm.keep(4)
    committed = lm.kv[:, :, :, :4].clone()
    lm.kv[2, :, :, 4:7] = 7.0                                       # a mark in layer 2's next slots
    lm.skip_lm(SkipSet(attn=frozenset({2}), mlp=frozenset({5}))).forward(torch.tensor(more))
    assert (lm.kv[2, :, :, 4:7] == 7.0).all() and not (lm.kv[3, :, :, 4:7] == 7.0).all()
    lm.keep(4)                                                      # the draft dropped, as SWIFT drops it
    assert torch.equal(lm.kv[:, :, :, :4], committed)
    assert torch.equal(lm.forward(torch.tensor(more)), clean)      # the verify writes every layer


def test_the_native_kernel_runs_the_kept_layers_as_spans(monkeypatch):
    """bf16 on an x86 CPU with AVX2 runs layers as native calls over spans of consecutive
    layers: a skipped layer splits the span and is not run, a capture after it still sees the state.
    The kernel is stood in for by one that records its spans (this path needs that CPU)."""
    from types import SimpleNamespace

    from speclab.models import kernels
    calls = []

    def layers(x, ln1, *rest):
        calls.append((rest[6], len(ln1)))           # (l0: the span's first layer, layers in the span)
        return x + len(ln1)
    monkeypatch.setattr(kernels, "module", lambda: SimpleNamespace(layers=layers))
    w = {k: torch.zeros(1) for k in ("ln1", "ln2")} | {k: SimpleNamespace(data=0) for k in
                                                       ("wqkv_k", "wo_k", "w13_k", "w2_k")}
    stub = SimpleNamespace(layers=[w] * 8, _spans={}, kv=None, cos=None, sin=None, Hq=1, Hkv=1, eps=0.0)
    seen = {}
    x = LeanLM._native_layers(stub, torch.zeros(1), 8, None, 0, None, (3, 5), seen.__setitem__, frozenset({2, 3, 6}))
    assert calls == [(0, 2), (4, 1), (5, 1), (7, 1)] and float(x) == 5
    assert {k: float(v) for k, v in seen.items()} == {3: 2.0, 5: 3.0}
    calls.clear()
    LeanLM._native_layers(stub, torch.zeros(1), 8, None, 0, None, (3,), seen.__setitem__)
    assert calls == [(0, 3), (3, 5)]                # nothing skipped: the spans as before


def test_the_search_scores_in_scratch_slots_and_keeps_the_cache(target, lm):
    prompt, text = list(range(10, 16)), list(range(100, 112))
    prefill(lm, prompt + text[:-1])                                 # committed: prompt + 11 generated
    committed, n = lm.kv[:, :, :, :lm.length].clone(), lm.length
    d = SwiftDrafter(target[0], window=8)
    d.begin(Context(prompt + text, len(prompt), 1, lm.device), lm, Sampler(0.0), torch.Generator(), None)
    score = d.matchness(d.skip, Context(prompt + text, len(prompt), 1, lm.device))
    assert 0 <= score <= 1 and lm.length == n and torch.equal(lm.kv[:, :, :, :n], committed)
    assert d.search_forwards == 1


# -- SWIFT ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def swift_runs(target, heldout_prompts):
    """Two prompts, greedy: ar's ids and swift's result, the search running (window 6) from the
    seventh generated token on."""
    out = []
    for p in heldout_prompts[:2]:
        ar = speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids
        out.append((ar, speclab.generate(target, p, "swift", max_new_tokens=NEW, window=6, gate="off")))
    return out


def test_swift_greedy_is_ar(swift_runs):
    for ar, r in swift_runs:
        assert r.ids == ar
        assert r.trace.guarantee == "identical-to-ar" and r.trace.totals.drafted > 0


def test_swift_records_the_skip_mask_each_round_and_each_search_step(swift_runs):
    for _, r in swift_runs:
        rounds = r.trace.rounds
        assert all(len(rd.info["skip"]) == 8 and set(rd.info["skip"]) <= set(".amx") for rd in rounds)
        assert all(rd.info["skip"][0] == rd.info["skip"][-1] == "." for rd in rounds)   # first, last kept
        assert all([d.output for d in rd.decisions if d.policy == "swift-skip"] == [rd.info["skip"]] for rd in rounds)
        search = [d for rd in rounds for d in rd.decisions if d.policy == "swift-search"]
        assert search and search[0].output == "scored" and search[0].inputs["proposal"] == "current"
        assert {d.output for d in search[1:]} <= {"kept", "reverted"} and search[0].threshold == 0.93
        stops = [d for rd in rounds for d in rd.decisions if d.policy == "swift-stop"]
        assert all(d.output in ("go", "stop", "max_k") and d.threshold == 0.8 for d in stops)
        assert sum(d.output != "go" for d in stops) == sum(1 for rd in rounds if rd.drafted)
    tr = swift_runs[0][1].trace
    assert "skip mask" in [f.name for f in view_of(tr).summary]
    heat = next(t for t in skip_mask_figure(tr, 2).data if t.type == "heatmap")
    assert len(heat.z) == 8 and len(heat.z[0]) == len(tr.rounds)


def test_swift_sampling_keeps_the_targets_joint_of_two_tokens():
    """Two draft tokens a round from the target less its layer 1 (a random toy, T = 1, top-k 4):
    the first two tokens are distributed as the target's joint (chi-square, p > 0.001)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3)
    model, prompt, s = LlamaForCausalLM(cfg).eval(), [3, 7, 1, 9], Sampler(1.0, top_k=4)
    with torch.no_grad():
        p = lambda ids: warp(model(input_ids=torch.tensor([ids])).logits[0, -1], s)   # noqa: E731
        first = p(prompt)
        joint = torch.stack([first[a] * p(prompt + [a]) for a in range(32)])           # (32, 32)
    lm, counts, drafted, n = LeanLM(model, "target"), torch.zeros(32, 32), 0, 800
    threads = torch.get_num_threads()
    torch.set_num_threads(1)            # a toy's products are too small to share out: threads only wait
    try:
        for seed in range(n):
            drafter = SwiftDrafter(model, threshold=0.01, max_k=2)
            new, _, tot = decode(lm, drafter, prompt, 2, s, seed=seed, record=None)
            counts[new[0], new[1]] += 1
            drafted += tot.drafted
    finally:
        torch.set_num_threads(threads)
    assert drafted >= 2 * n
    assert chi2_p(counts, joint) > 1e-3


def test_swift_keeps_skip_sets_per_task_in_the_callers_store(target):
    prompt = "def parse(line):"
    store = SkipSets()
    a = speclab.generate(target, prompt, "swift", max_new_tokens=10, window=4, gate="off", history=store, task="code")
    assert len(store) == 1 and a.trace.rounds[0].decisions[0].inputs["source"] == "initial"
    assert "history" not in a.trace.params
    b = speclab.generate(target, prompt, "swift", max_new_tokens=4, window=4, gate="off", history=store, task="code")
    first = [d for d in b.trace.rounds[0].decisions if d.policy == "swift-skip"][0]
    (found,) = store.values()
    assert first.inputs["source"] == "cache" and first.output == found.skip.text(8)
    c = speclab.generate(target, prompt, "swift", max_new_tokens=4, window=4, gate="off", history=store, task="chat")
    assert c.trace.rounds[0].decisions[0].inputs["source"] == "initial" and len(store) == 1   # too short to search
    history = speclab.SuffixHistory()           # the store a dashboard session or a bench pass hands on
    speclab.generate(target, prompt, "swift", max_new_tokens=10, window=4, gate="off", history=history)
    assert len(history.skip_sets) == 1
    with pytest.raises(ValueError, match="history must be"):
        speclab.generate(target, prompt, "swift", max_new_tokens=2, history={})


# -- Unified Layer Skipping -------------------------------------------------------------------------
def test_even_pattern_runs_the_first_and_last_layers_and_spreads_the_rest():
    assert even_pattern(8, 2.0).text(8) == ".x.xx.x."           # 4 of 8 run: 0, 2, 5, 7
    assert even_pattern(8, 1.0) == SkipSet.layers(())
    p = even_pattern(30, 1.5).text(30)
    assert p.count(".") == 20 and p[0] == p[-1] == "." and "xx" not in p
    assert even_pattern(8, 100).text(8) == ".xxxxxx."


def test_unified_layer_skip_is_lossy_and_decodes_every_token_with_the_pattern(target):
    assert guarantee("unified-layer-skip") == "lossy" and guarantee("swift") == "identical-to-ar"
    r = speclab.generate(target, "def parse(line):", "unified-layer-skip", max_new_tokens=12, speedup=2.0)
    t = r.trace
    assert t.guarantee == "lossy" and len(r.ids) == 12 and t.totals.drafted == 0
    assert t.totals.target_forwards == len(t.rounds) == 12
    assert all(rd.info["skip"] == ".x.xx.x." for rd in t.rounds)
    assert [d.policy for d in t.rounds[0].decisions] == ["unified-skip"] and not t.rounds[1].decisions
    assert "skip mask" in [f.name for f in view_of(t).summary]


@pytest.mark.parametrize("method,params", [("unified-layer-skip", {}), ("swift", dict(gate="off"))])
def test_skipping_on_transformers_forward_is_a_one_line_error(target, method, params):
    with pytest.raises(ValueError, match="lean forward only"):
        speclab.generate(target, "def f():", method, max_new_tokens=4, backend="hf", **params)
