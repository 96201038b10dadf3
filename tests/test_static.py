"""The static-shape runner (speclab.models.lean.static.StaticLM) against the lean forward.

StaticLM pads every forward to a bucket width, writes padding rows into slots nothing reads and
attends over the whole preallocated cache through a mask; on a CPU it runs eagerly with exactly
those buffers. It must give every real row what LeanLM gives it: the same decoded tokens, logits
equal to fp32 rounding (fp32 GEMMs on a CPU round by row count and softmax sums by length, and
padding changes both), and bit for bit the same logits through the native bf16 kernel, which
computes every row as a one-token forward. Captured hidden states (the EAGLE family's targets) and
early exits (layer-skip's drafts) run in the buckets too, with the same states LeanLM captures; a
request sizes its runners before its prefill; batch traces name each role's forward.
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from speclab.decoding.speculative import Drafter
from speclab.models import kernels
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.static import BUCKETS, StaticLM, bucket, capacity_for

TOL = 2e-5


def tiny_llama(dtype=torch.float32, seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def script(lm):
    """One sequence's life: a prompt, a chain verify, a tree verify kept in part, one-row steps, a
    rollback, a verify that reads a trimmed slice of logits. Returns every logits tensor."""
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(1, 150, (n,), generator=g)
    out = [lm.forward(ids(11))]                                   # prompt: bucket 16, 5 padding rows
    out.append(lm.forward(ids(3)))                                # chain of 3 in bucket 4
    out.append(lm.forward(ids(5), parents=[-1, -1, 0, 0, 1], n_prefix=0))      # a tree
    lm.keep_positions(14, [1, 4])                                 # its path 1 -> 4 committed
    out.append(lm.forward(ids(6), parents=[-1, 0, 1, 0, 3], n_prefix=1))       # prefix row + tree
    lm.keep(17)                                                   # a rejected draft rolled back
    for _ in range(4):
        out.append(lm.forward(ids(1)))                            # one-row steps (bucket 1)
    out.append(lm.forward(ids(9), logits_to_keep=4))              # bucket 16, 4 rows kept
    assert lm.length == 30
    return out


def test_buckets_and_capacity():
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 8, 16, 32, 64, 64]
    with pytest.raises(ValueError, match="widest bucket"):
        bucket(65)
    assert capacity_for(10) == 256 and capacity_for(300) == 512 and capacity_for(512) == 512


def test_static_runner_matches_the_lean_forward_on_a_transformers_llama():
    m = tiny_llama()
    a, b = script(LeanLM(m)), script(StaticLM(m, graphs=False))
    assert [x.shape for x in a] == [x.shape for x in b]
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=TOL, rtol=0), (x - y).abs().max()
        assert torch.equal(x.argmax(-1), y.argmax(-1))


def test_static_cache_is_sized_for_the_request_and_grows():
    m = tiny_llama()
    lm = StaticLM(m, max_len=100, graphs=False)
    assert lm.max_len == 256 < m.config.max_position_embeddings          # not the context window
    assert lm.vis.shape == (BUCKETS[-1], 256)
    ref = LeanLM(m)
    ids = torch.randint(1, 150, (230,), generator=torch.Generator().manual_seed(4))
    a, b = ref.forward(ids[:200]), lm.forward(ids[:200])                 # wider than a bucket: eager
    assert torch.allclose(a, b, atol=TOL, rtol=0)
    for t in ids[200:]:                                                   # 200 + 64 > 256: doubles
        assert torch.allclose(ref.forward(t[None]), lm.forward(t[None]), atol=TOL, rtol=0)
    assert lm.max_len == 512 and lm.length == 230


def test_padding_rows_write_only_slots_nothing_reads():
    m = tiny_llama()
    lm = StaticLM(m, graphs=False)
    lm.forward(torch.tensor([5, 6, 7]))                                   # bucket 4: slot 3 is padding
    kept = lm.kv[:, :, :, :3].clone()
    lm.forward(torch.tensor([8, 9, 10]))                                  # overwrites slots 3..6
    assert torch.equal(lm.kv[:, :, :, :3], kept)
    one = LeanLM(m)
    one.forward(torch.tensor([5, 6, 7, 8, 9, 10]))
    assert torch.allclose(lm.kv[:, :, :, :6], one.kv[:, :, :, :6], atol=TOL, rtol=0)


@pytest.mark.parametrize("method,params", [("ar", {}), ("draft-model", dict(k=4)), ("prompt-lookup", {}),
                                           ("tree-dynamic", dict(budget=8, width=3)), ("layer-skip", {})])
def test_toy_zoo_decodes_the_same_tokens_on_the_static_runner(method, params, target, draft, heldout_prompts):
    for p in heldout_prompts[:2]:
        a = speclab.generate(target, p, method, draft=draft, max_new_tokens=40, backend="fast", **params)
        b = speclab.generate(target, p, method, draft=draft, max_new_tokens=40, backend="static-eager", **params)
        assert a.ids == b.ids
        assert b.trace.params["backend"] == "StaticLM"


class HostLoop(Drafter):
    """`ar` through the host's round loop: a Drafter subclass that proposes nothing keeps it."""
    name = "ar-host-loop"


def test_greedy_ar_keeps_its_token_on_the_device_and_matches_the_host_loop(target, heldout_prompts, monkeypatch):
    runs = []
    real = StaticLM.greedy_run
    monkeypatch.setattr(StaticLM, "greedy_run", lambda self, *a, **k: runs.append(a[1]) or real(self, *a, **k))
    for p in heldout_prompts[:2]:
        dev = speclab.generate(target, p, "ar", max_new_tokens=40, backend="static-eager")
        host = speclab.generate(target, p, HostLoop(), max_new_tokens=40, backend="static-eager")
        assert dev.ids == host.ids and len(dev.ids) == 40
        assert dev.trace.totals.target_forwards == host.trace.totals.target_forwards == 40
        assert [r.emitted for r in dev.trace.rounds] == dev.ids
        shape = lambda t: [(r.kept, r.emitted_kind, r.drafted, r.accepted) for r in t.rounds]
        assert shape(dev.trace) == shape(host.trace)
    assert runs == [39, 39]             # the prompt's round on the host, the 39 after it on the device


@pytest.mark.parametrize("lag", [0, 1])
def test_greedy_run_stops_after_eos_and_its_cache_goes_on(lag):
    """The device loop read `lag` steps behind: it stops at an end-of-text token, the steps already
    queued past it are counted and leave nothing the next forward sees."""
    m = tiny_llama(seed=2)
    prompt = torch.randint(1, 150, (9,), generator=torch.Generator().manual_seed(5))
    host = StaticLM(m, graphs=False)
    ref = [int(host.forward(prompt)[-1].argmax())]
    for _ in range(20):
        ref.append(int(host.forward(torch.tensor([ref[-1]]))[-1].argmax()))
    first, ref = ref[0], ref[1:]
    k = next(i for i in range(3, 20) if ref[i] not in ref[:i])
    lm = StaticLM(m, graphs=False)
    lm.forward(prompt)
    before, seen = lm.forwards, []
    toks, times = lm.greedy_run(first, 20, eos_id=ref[k], on_token=seen.append, lag=lag)
    assert toks == seen == ref[:k + 1] and len(times) == k + 1 and times == sorted(times)
    assert lm.length == 9 + k + 1 and lm.forwards - before == k + 1 + lag
    more, _ = lm.greedy_run(toks[-1], 19 - k, lag=lag)
    assert toks + more == ref


def test_static_batch_matches_the_lean_batch(target, heldout_prompts):
    ps = heldout_prompts[:3]
    a = speclab.generate(target, ps, "prompt-lookup", max_new_tokens=32, backend="fast")
    b = speclab.generate(target, ps, "prompt-lookup", max_new_tokens=32, backend="static-eager")
    assert [r.ids for r in a] == [r.ids for r in b]
    for rs, forward in ((a, "LeanLM"), (b, "StaticLM")):     # each lane's trace says what ran it
        assert {(r.trace.models["target"].backend, r.trace.models["target"].graphs) for r in rs} == {(forward, False)}


def test_batch_traces_record_each_roles_forward_and_graphs(target, draft, heldout_prompts):
    rs = speclab.generate(target, heldout_prompts[:2], "draft-model", draft=draft, max_new_tokens=6, k=3,
                          backend="static-eager")
    for r in rs:
        info = r.trace.models
        assert (info["target"].backend, info["target"].graphs) == ("StaticLM", False)
        assert (info["draft"].backend, info["draft"].graphs) == ("StaticLM", False)
        assert info["target"].runs_on() == "float32 on cpu, StaticLM"
        assert r.trace.params["backend"] == "LeanBatchLM" and r.trace.params["batch_size"] == 2
    (r, _) = speclab.generate(target, heldout_prompts[:2], "prompt-lookup", max_new_tokens=4, backend="hf")
    assert r.trace.models["target"].backend == "BatchCausalLM" and r.trace.models["target"].graphs is False


def test_static_runner_is_bitwise_the_native_kernel_forward():
    if not kernels.available("cpu", torch.bfloat16):
        pytest.skip("needs speclab's bf16 kernel (an x86 CPU with AVX2)")
    m = tiny_llama(torch.bfloat16)
    static = StaticLM(m, graphs=False)
    assert static.fused
    for x, y in zip(script(LeanLM(m)), script(static)):
        assert torch.equal(x, y)


def test_one_row_and_verify_steps_compile_without_graph_breaks():
    """torch.compile(fullgraph=True) stands in for CUDA graph capture on a CPU: it fails on any
    graph break, i.e. on any host sync or data-dependent Python inside a step. Covered: a one-row
    step, a tree verify, a verify that captures hidden states (the EAGLE targets) and an early exit
    (the layer-skip draft)."""
    m = tiny_llama(layers=3)
    lm = StaticLM(m, graphs=False)
    ids = torch.randint(1, 150, (12,), generator=torch.Generator().manual_seed(5))
    lm.forward(ids[:8])
    torch._dynamo.reset()
    step = torch.compile(lm._step, fullgraph=True, backend="eager", dynamic=False)
    for W, parents, nl, caps in ((1, None, None, ()), (4, [-1, 0, 0, 1], None, ()), (4, [-1, 0, 0, 1], None, (1, 3)),
                                 (1, None, 2, ()), (2, None, 2, (1,))):
        base = lm.length
        lm.capture_layers = caps
        eager = lm.forward(ids[8:8 + W], parents=parents, n_layers=nl)    # stages the buffers
        states = {c: h.clone() for c, h in lm.captured.items()}
        assert sorted(states) == list(caps)
        lm.hidden.zero_()
        lm.keep(base)
        with torch.inference_mode():
            compiled = step(W, W, 0, nl, caps, parents is None)[:W]    # a chain: the mask built in the step
        assert torch.equal(compiled, eager)
        for c, h in states.items():                                       # the compiled step wrote them
            assert torch.equal(lm.hidden[c - 1, :W], h[0])
    torch._dynamo.reset()


def capture_script(lm, layers):
    """script() with hidden states captured after `layers`, and early exits through the first
    layer (the layer-skip draft: its speculative slots dropped before the next verify). Returns
    every logits tensor and every captured state."""
    g = torch.Generator().manual_seed(7)
    ids = lambda n: torch.randint(1, 150, (n,), generator=g)
    out, states = [], []

    def run(*a, **kw):
        out.append(lm.forward(*a, **kw))
        states.append({c: h.clone() for c, h in lm.captured.items()})
    lm.capture_layers = layers
    run(ids(11))                                                  # prompt in bucket 16
    run(ids(5), parents=[-1, -1, 0, 0, 1], n_prefix=0)            # a tree verify
    lm.keep_positions(11, [1, 4])
    for _ in range(3):
        run(ids(1), n_layers=1)                                   # exit drafts
    lm.drop_layers_tail(1, 3)
    run(ids(4))                                                   # their verify
    lm.capture_layers = ()
    run(ids(1))                                                   # a step capturing nothing
    run(ids(70))                                                  # wider than a bucket: LeanLM's path
    assert lm.length == 88
    return out, states


@pytest.mark.parametrize("layers", [(2,), (1, 2)])
def test_captured_states_and_early_exits_match_the_lean_forward(layers):
    m = tiny_llama()
    (la, sa), (lb, sb) = capture_script(LeanLM(m), layers), capture_script(StaticLM(m, graphs=False), layers)
    for x, y in zip(la, lb):
        assert torch.allclose(x, y, atol=TOL, rtol=0), (x - y).abs().max()
    for a, b in zip(sa, sb):
        assert sorted(a) == sorted(b)
        for c in a:
            assert a[c].shape == b[c].shape and torch.allclose(a[c], b[c], atol=1e-5, rtol=0)
    assert [sorted(s) for s in sb] == [list(layers)] * 2 + [[c for c in layers if c <= 1]] * 3 + [list(layers), [], []]


def test_captured_states_are_bitwise_the_native_kernel_forward():
    if not kernels.available("cpu", torch.bfloat16):
        pytest.skip("needs speclab's bf16 kernel (an x86 CPU with AVX2)")
    m = tiny_llama(torch.bfloat16, layers=3)
    static = StaticLM(m, graphs=False)
    assert static.fused
    (la, sa), (lb, sb) = capture_script(LeanLM(m), (1, 3)), capture_script(static, (1, 3))
    for x, y in zip(la, lb):
        assert torch.equal(x, y)
    for a, b in zip(sa, sb):
        assert sorted(a) == sorted(b) and all(torch.equal(a[c], b[c]) for c in a)


def test_graphs_need_cuda_and_a_known_mode():
    m = tiny_llama()
    with pytest.raises(ValueError, match="needs a CUDA device"):
        StaticLM(m, graphs=True)
    with pytest.raises(ValueError, match="graphs must be"):
        StaticLM(m, graphs="sometimes")
    assert StaticLM(m).graphs is False                                    # CPU default: eager


def test_trace_records_each_roles_forward_and_graphs(target, draft, heldout_prompts, tmp_path):
    from speclab.trace import Trace
    r = speclab.generate(target, heldout_prompts[0], "draft-model", draft=draft, max_new_tokens=8,
                         backend="static-eager", k=3)
    info = r.trace.models
    assert (info["target"].backend, info["target"].graphs) == ("StaticLM", False)
    assert info["draft"].backend == "StaticLM" and info["target"].device == "cpu"
    assert info["target"].runs_on() == "float32 on cpu, StaticLM"                 # what the views print
    from speclab.export import stats_table
    assert "float32 on cpu, StaticLM" in stats_table(r.trace)
    back = Trace.load(r.trace.save(tmp_path / "t.json"))
    assert back.models["target"].backend == "StaticLM" and back.models["target"].graphs is False
    d = r.trace.to_dict()                                # a trace written before these fields existed
    for m in d["models"].values():
        m.pop("backend"), m.pop("graphs")
    old = Trace.from_dict(d)
    assert old.models["target"].backend is None and old.models["target"].graphs is None


def test_a_dropped_runner_hands_its_cache_to_the_next_one():
    """Graphs are captured once per model, not per run: a dropped runner's cache, buffers and
    graphs go to the next runner of the same weights, the smallest one that holds the request."""
    import gc
    m = tiny_llama()
    a = StaticLM(m, graphs=False)
    a.forward(torch.randint(1, 150, (300,), generator=torch.Generator().manual_seed(6)))   # grows to 512
    kv = a.kv
    assert a.max_len == 512
    del a
    gc.collect()
    b = StaticLM(m, graphs=False)
    assert b.kv is kv and b.length == 0                   # the same cache, empty again
    c = StaticLM(m, graphs=False)                         # b holds it: c gets its own
    assert c.kv is not kv and c.max_len == 256


@pytest.fixture(scope="module")
def tiny(target):
    """tests/test_eagle3.py's random 8-layer Llama over the code zoo's tokenizer."""
    from test_eagle3 import tiny as build
    return build.__wrapped__(target)


def drafter_for(method, model, tok):
    """The drafter of `method` on `model`: EAGLE-3 with test_eagle3's synthetic checkpoint, EAGLE
    with a head whose layer is the target's last (so it drafts tokens the target accepts)."""
    from test_eagle3 import make_draft

    from speclab.decoding.drafters.eagle3 import Eagle3Drafter
    from speclab.decoding.registry import build_drafter
    from speclab.models.heads import build_eagle, head_config
    if method == "eagle3":
        return Eagle3Drafter(model, make_draft(model), budget=6, width=3, depth=3)
    if method == "eagle":
        torch.manual_seed(0)
        head = build_eagle(model, head_config(model.config, "eagle"), torch.arange(model.config.vocab_size - 50))
        head.model.layers[0].load_state_dict(model.model.layers[-1].state_dict())
        return build_drafter("eagle", model, head.eval(), dict(budget=6, width=3, depth=3))
    return build_drafter("layer-skip", model, None, {})


@pytest.mark.parametrize("method", ["eagle", "eagle3", "layer-skip"])
def test_feature_and_exit_drafters_verify_inside_the_buckets(method, tiny):
    """The EAGLE family's target captures hidden states and layer-skip drafts through an early
    exit: both run in the static runner's buckets (no eager fallback for a short prompt), greedy
    identical to ar in fp32."""
    from speclab.decoding.acceptance import Sampler
    from speclab.decoding.speculative import decode
    model, tok = tiny
    for start in (40, 300):
        prompt = list(range(start, start + 12))
        ref = speclab.generate(tiny, prompt, "ar", max_new_tokens=24, record=None, backend="fast").ids
        lm = StaticLM(model, "target", max_len=64, graphs=False)
        new, rounds, tot = decode(lm, drafter_for(method, model, tok), prompt, 24, Sampler())
        assert new == ref
        assert lm.fallbacks == 0 and tot.drafted > 0
        assert tot.accepted > 0 or method == "eagle" or start == 300     # a random EAGLE head rarely hits


def test_a_request_sizes_its_runners_before_the_prefill(tiny):
    """speclab.generate sizes the target's static runner (and the draft model's) for prompt + new
    tokens + draft room before the prefill: an idle cache of 256 slots, too small for the request,
    is left alone rather than taken and grown by doubling."""
    import gc

    from speclab.models.backends import make_lm
    model, tok = tiny
    draft = tiny_llama(seed=1)
    draft.resize_token_embeddings(model.config.vocab_size)
    small_kv = []
    for m in (model, draft):
        small = make_lm(m, "x", "static-eager")                           # no request: 256 slots
        assert small.max_len == 256
        small_kv.append(small.kv)
        del small
        gc.collect()
    prompt = list(range(40, 340))                                          # 300 tokens + 8 + room > 256
    r = speclab.generate(tiny, prompt, "draft-model", draft=(draft, tok), max_new_tokens=8, k=3,
                         backend="static-eager", record=None)
    assert len(r.ids) == 8
    gc.collect()
    for m, kv in zip((model, draft), small_kv):
        (idle,) = m._speclab_static.values()
        assert any(k["kv"] is kv and k["max_len"] == 256 for k in idle)   # idle, never grown
        assert max(k["max_len"] for k in idle) == 512


def test_compile_ops_layers_match_the_step_and_compile_without_graph_breaks():
    """The "compile-ops" layers (each residual add fused into the norm after it, RoPE and SwiGLU as
    ops) compute what the plain static layers compute (to fp32 rounding: about 1e-7 apart), and each
    op compiles with fullgraph=True (what inductor needs inside CUDA graphs; a graph break fails here)
    to the same values, on a chain, a tree and a capture."""
    m = tiny_llama(layers=3)
    lm = StaticLM(m, graphs=False)
    ids = torch.randint(1, 150, (12,), generator=torch.Generator().manual_seed(5))
    lm.forward(ids[:8])
    torch._dynamo.reset()
    compiled = {k: torch.compile(f, fullgraph=True, backend="eager", dynamic=False)
                for k, f in lm.ops(compile_=False).items() if k != "compiled"}
    for W, parents, caps in ((1, None, ()), (4, [-1, 0, 0, 1], ()), (4, [-1, 0, 0, 1], (1, 3))):
        base = lm.length
        lm.capture_layers = caps
        want = lm.forward(ids[8:8 + W], parents=parents)                 # the plain static layers; stages buffers
        states = {c: h.clone() for c, h in lm.captured.items()}
        lm.keep(base)
        outs = []
        for ops in (lm.ops(compile_=False), compiled):
            lm.hidden.zero_()
            lm.graphs = "compile-ops"                                    # the step takes the ops layers
            lm._ops = dict(ops, compiled=ops is compiled)
            try:
                with torch.inference_mode():
                    got = lm._step(W, W, 0, None, caps, parents is None)[:W]
            finally:
                lm.graphs, lm._ops = False, None
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            for c, h in states.items():
                torch.testing.assert_close(lm.hidden[c - 1, :W], h[0], rtol=0, atol=1e-5)
            outs.append(got)
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-5)   # compiled: the eager ops' values
    torch._dynamo.reset()
