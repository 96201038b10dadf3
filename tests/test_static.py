"""The static-shape runner (speclab.models.lean.static.StaticLM) against the lean forward.

StaticLM pads every forward to a bucket width, writes padding rows into slots nothing reads and
attends over the whole preallocated cache through a mask; on a CPU it runs eagerly with exactly
those buffers. It must give every real row what LeanLM gives it: the same decoded tokens, logits
equal to fp32 rounding (fp32 GEMMs on a CPU round by row count and softmax sums by length, and
padding changes both), and bit for bit the same logits through the native bf16 kernel, which
computes every row as a one-token forward.
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from speclab.models import kernels
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.static import BUCKETS, StaticLM, bucket, capacity_for

TOL = 2e-5


def tiny_llama(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
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


def test_static_batch_matches_the_lean_batch(target, heldout_prompts):
    ps = heldout_prompts[:3]
    a = speclab.generate(target, ps, "prompt-lookup", max_new_tokens=32, backend="fast")
    b = speclab.generate(target, ps, "prompt-lookup", max_new_tokens=32, backend="static-eager")
    assert [r.ids for r in a] == [r.ids for r in b]


def test_static_runner_is_bitwise_the_native_kernel_forward():
    if not kernels.available("cpu", torch.bfloat16):
        pytest.skip("needs speclab's bf16 kernel (a CPU with AVX512-BF16)")
    m = tiny_llama(torch.bfloat16)
    static = StaticLM(m, graphs=False)
    assert static.fused
    for x, y in zip(script(LeanLM(m)), script(static)):
        assert torch.equal(x, y)


def test_one_row_and_verify_steps_compile_without_graph_breaks():
    """torch.compile(fullgraph=True) stands in for CUDA graph capture on a CPU: it fails on any
    graph break, i.e. on any host sync or data-dependent Python inside a step."""
    m = tiny_llama()
    lm = StaticLM(m, graphs=False)
    ids = torch.randint(1, 150, (12,), generator=torch.Generator().manual_seed(5))
    lm.forward(ids[:8])
    torch._dynamo.reset()
    step = torch.compile(lm._step, fullgraph=True, backend="eager", dynamic=False)
    for W, parents in ((1, None), (4, [-1, 0, 0, 1])):
        base = lm.length
        eager = lm.forward(ids[8:8 + W], parents=parents)                 # stages the buffers
        lm.keep(base)
        with torch.inference_mode():
            compiled = step(W, W, 0)[:W]
        assert torch.equal(compiled, eager)
    torch._dynamo.reset()


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
