"""transformers' DiffusionGemma through speclab's diffusion engine: `dllm-entropy-bound` reproduces
`model.generate()` token for token under the same seed, the recorded steps replay and count what
ran, and what a noise-canvas model cannot do fails in one line."""
import pytest
import torch

import speclab
from speclab.trace import Trace, replay
from speclab.train import digits

DiffusionGemma = pytest.importorskip("transformers").DiffusionGemmaForBlockDiffusion
L = 8


def tiny_config(vocab: int):
    from transformers import DiffusionGemmaConfig
    text = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                num_experts=2, top_k_experts=1, moe_intermediate_size=32,
                layer_types=["sliding_attention", "full_attention"], sliding_window=32,
                max_position_embeddings=256, pad_token_id=14, eos_token_id=12, bos_token_id=12)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, position_embedding_size=64,
                  patch_size=4, pooling_kernel_size=1)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=L,
                                boi_token_id=13, eoi_token_id=13, image_token_id=13)


@pytest.fixture(scope="module")
def dgemma():
    tok = digits.build_tokenizer()
    torch.manual_seed(0)
    model = DiffusionGemma(tiny_config(len(tok))).eval()
    with torch.no_grad():                    # peaky logits: several positions accepted per step, early stops
        model.model.decoder.embed_tokens.weight.mul_(40.0)
    return model, tok


def reference(model, ids, G, seed, **kw):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig
    if "entropy_bound" in kw:                    # transformers takes the bound in a sampler config
        kw["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=kw.pop("entropy_bound"))
    torch.manual_seed(seed)
    out = model.generate(torch.tensor([ids]), max_new_tokens=G, eos_token_id=12, pad_token_id=14, **kw)
    new = out.sequences[0, len(ids):].tolist()
    return new[: new.index(12) + 1] if 12 in new else new


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kw", [{}, {"entropy_bound": 0.5, "max_denoising_steps": 6}])
def test_entropy_bound_reproduces_transformers_generate(dgemma, seed, kw):
    model, tok = dgemma
    prompt = "ADD 12+34="
    ids = tok(prompt)["input_ids"]
    want = reference(model, ids, 3 * L, seed, **dict(kw))
    state = torch.random.get_rng_state()
    r = speclab.run(dgemma, prompt, "dllm-entropy-bound", gen_length=3 * L, seed=seed, record="full", **kw)
    assert r.ids == want
    assert torch.equal(torch.random.get_rng_state(), state)     # the caller's RNG is left alone


def test_steps_replay_and_count_what_ran(dgemma, tmp_path):
    model, tok = dgemma
    calls = []
    hook = model.model.decoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        r = speclab.run(dgemma, "SUM 27=", "dllm-entropy-bound", gen_length=2 * L, seed=3, record="full")
    finally:
        hook.remove()
    t = r.trace
    assert replay(t) == r.ids and t.totals.target_forwards == len(calls) == len(t.denoise)
    assert t.params["canvas"] == "noise"
    for s in t.denoise:
        lo, hi = s.block
        acc, noise = set(s.info["accepted"]), set(s.remasked)
        assert acc | noise == set(range(lo, hi)) and not acc & noise     # every slot accepted or re-noised
        assert acc and len(s.info["entropy"]) == len(s.masked)
        kept = [s.tokens[p] == s.info["sampled"][p - lo] for p in acc]
        assert all(kept)                                                  # accepted slots hold the sample
    path = tmp_path / "t.json"
    t.save(path)
    assert replay(Trace.load(path)) == r.ids


def test_noise_canvas_errors_are_one_line(dgemma):
    with pytest.raises(ValueError, match="random tokens, not masks.*dllm-entropy-bound"):
        speclab.run(dgemma, "SUM 27=", "dllm-threshold", gen_length=L)
    with pytest.raises(ValueError, match="multiple of this DiffusionGemma's canvas length 8"):
        speclab.run(dgemma, "SUM 27=", "dllm-entropy-bound", gen_length=12)
    with pytest.raises(ValueError, match="its own temperature schedule"):
        speclab.run(dgemma, "SUM 27=", "dllm-entropy-bound", gen_length=L, temperature=0.7)
    with pytest.raises(ValueError, match="belong to DiffusionGemma's noise canvas"):
        speclab.run("digits-dllm", "SUM 27=", "dllm-entropy-bound", gen_length=8, t_min=0.3)


def test_entropy_bound_on_a_mask_based_dllm(tmp_path):
    """The same rule, unmask-only, on digits-dllm: a bound of 0 commits one per step (the lowest
    entropy), a huge bound the whole block in one forward; the trace replays."""
    one = speclab.run("digits-dllm", "ADD 12+34=", "dllm-entropy-bound", gen_length=8, entropy_bound=0.0,
                      record="full")
    allin = speclab.run("digits-dllm", "ADD 12+34=", "dllm-entropy-bound", gen_length=8, entropy_bound=1e9)
    assert one.trace.totals.target_forwards == len(one.trace.denoise) and replay(one.trace) == one.ids
    assert all(len(s.committed) == 1 for s in one.trace.denoise)
    for s in one.trace.denoise:                  # the committed slot had the lowest entropy of the block
        e = dict(zip(s.masked, s.info["entropy"]))
        assert e[s.committed[0]] == min(e[p] for p in s.masked if s.block[0] <= p < s.block[1])
    assert allin.trace.totals.target_forwards == 1


def test_hf_diffusion_peer_matches_speclab_and_counts_forwards(dgemma):
    from speclab.bench.peers import run_diffusion_peer
    model, tok = dgemma
    ids = tok("ADD 12+34=")["input_ids"]
    peer = run_diffusion_peer(model, tok, ids, 2 * L, seed=5)
    ours = speclab.run(dgemma, ids, "dllm-entropy-bound", gen_length=2 * L, seed=5, record=None)
    assert peer["ids"] == ours.ids
    assert peer["target_forwards"] == ours.trace.totals.target_forwards
    assert peer["tokens_per_forward"] == pytest.approx(
        sum(t != tok.pad_token_id for t in peer["ids"]) / peer["target_forwards"], rel=1e-5)
