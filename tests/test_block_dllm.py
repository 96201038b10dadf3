"""Block diffusion (smollm2-dllm's engine): the cached block forward equals the training forward,
FreeDave stays lossless on it, LoRA adapters round-trip, bad pairings fail in one line."""
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from speclab.decoding.diffusion import denoise
from speclab.decoding.dllm_policies import FreeDave, LowConfidence, Threshold
from speclab.decoding.freedave import freedave
from speclab.models.dllm import BlockDenoiser, make_denoiser, mark_dllm
from speclab.models.geometry import additive, block_of, block_visible

V, MASK, B = 48, 47, 4


def tiny(seed=0, hidden=32):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(mark_dllm(cfg, MASK, shift=True)).eval()
    model.config.speclab_block_causal, model.config.speclab_block_length = True, B
    with torch.no_grad():                        # sharper logits than the init, so ties are rare
        model.lm_head.weight.mul_(20)
    return model


@torch.no_grad()
def reference(model, x: torch.Tensor, P: int) -> torch.Tensor:
    """The TRAINING layout, no cache: [clean copy | noisy copy] with block_visible's mask. Rows
    for the active block's slots: slot 0 from the clean copy at lo-1, slot s from noisy s-1."""
    T = len(x)
    lo = P + int((x[P:] == MASK).nonzero()[0]) // B * B
    clean = torch.where(x == MASK, torch.zeros_like(x), x)        # what is hidden from the block may be anything
    ids = torch.cat([clean, x])[None]
    pos = torch.arange(T).repeat(2)
    grp = torch.cat([torch.full((T,), -1), torch.zeros(T, dtype=torch.long)])
    blk = block_of(pos, P, B)
    mask = additive(block_visible(pos, blk, grp, pos, blk, grp), torch.float32)[None, None]
    h = model.model(input_ids=ids, attention_mask=mask, position_ids=pos[None]).last_hidden_state[0]
    rows = torch.cat([h[lo - 1:lo], h[T + lo:T + lo + B - 1]])
    return model.lm_head(rows).float()                                  # (B, V)


def test_cached_block_forward_equals_training_forward():
    model = tiny()
    den = make_denoiser(model)
    assert isinstance(den, BlockDenoiser)
    P, G = 5, 12
    x = torch.tensor(list(range(1, P + 1)) + [MASK] * G)
    den.start(P, B)
    rng = random.Random(0)
    calls = 0
    while bool((x[P:] == MASK).any()):
        lo = P + int((x[P:] == MASK).nonzero()[0]) // B * B
        got = den.logits(x)[lo:lo + B]
        torch.testing.assert_close(got, reference(model, x, P), atol=1e-4, rtol=1e-4)
        # K canvases in one call: each gets exactly its own rows
        drafts = x.repeat(3, 1)
        for k in range(3):
            slot = lo + rng.randrange(B)
            if drafts[k, slot] == MASK:
                drafts[k, slot] = rng.randrange(V - 1)
        if bool((drafts[:, lo:lo + B] == MASK).any(1).all()) and bool((drafts[0, P:] == MASK).any()):
            batch = den.logits_batch(drafts)
            for k in range(3):
                torch.testing.assert_close(batch[k, lo:lo + B], reference(model, drafts[k], P), atol=1e-4, rtol=1e-4)
        masked = (x[lo:lo + B] == MASK).nonzero().flatten()
        x[lo + int(masked[rng.randrange(len(masked))])] = rng.randrange(V - 1)
        calls += 1
    assert den.n == P + G - B                       # the last block was never needed as a prefix
    assert calls == G


def test_block_engine_decodes_block_by_block_and_freedave_is_lossless():
    model = tiny(1)
    prompt, G = [3, 1, 4, 1, 5], 12
    one, steps1, tot1 = denoise(make_denoiser(model), prompt, LowConfidence(), G, B, eos_stop=False)
    assert tot1.target_forwards == G and len(one) == G
    for s in steps1:                                 # a block-causal step only ever commits in its block
        lo, hi = s.block
        assert all(lo <= c < hi for c in s.committed)
        later = [c for m, c, t in zip(s.masked, s.conf, s.top1) if m >= hi]
        assert later == [0.0] * len(later)           # later blocks: not looked at yet, no confidence
    fd, steps, tot = freedave(make_denoiser(model), prompt, FreeDave(draft_steps=3), G, B, record="full",
                              eos_stop=False)
    assert fd == one
    assert all(len(s.info["entropy"]) == len(s.masked) for s in steps)   # record="full" has FreeDave's entropy
    assert tot.target_forwards <= G
    thr, _, tot_t = denoise(make_denoiser(model), prompt, Threshold(1e-9), G, B, eos_stop=False)
    assert tot_t.target_forwards == G // B           # a ~0 threshold commits a whole block per forward


def test_block_mask_rules():
    pos = torch.arange(6)
    blk = block_of(pos, 2, 2)                        # prompt 0,1 | block 0: 2,3 | block 1: 4,5
    assert blk.tolist() == [-1, -1, 0, 0, 1, 1]
    clean, noisy = torch.full((6,), -1), torch.zeros(6, dtype=torch.long)
    v = block_visible(pos, blk, noisy, pos, blk, clean)
    assert v[2].tolist() == [True, True, False, False, False, False]   # noisy block 0 sees the prompt only
    assert v[4].tolist() == [True, True, True, True, False, False]
    own = block_visible(pos, blk, noisy, pos, blk, noisy)
    assert own[2].tolist() == [False, False, True, True, False, False]  # and its own block, both ways
    causal = block_visible(pos, blk, clean, pos, blk, clean)
    assert torch.equal(causal, torch.ones(6, 6, dtype=torch.bool).tril())


def test_lora_adapter_round_trip_and_wrong_base(tmp_path):
    from argparse import Namespace
    from speclab.models.adapter import apply_dllm_lora
    from speclab.models.lora import add_lora
    from speclab.train.smollm2_dllm import save_adapter
    base = tiny(2)
    trained = tiny(2)
    add_lora(trained, rank=4, alpha=8)
    with torch.no_grad():
        for n, p in trained.named_parameters():
            if n.endswith("lora_B"):
                p.normal_(0, 0.05)
    mask_vec = torch.randn(32)
    args = Namespace(block_length=B, alpha=8.0, rank=4)
    save_adapter(trained, mask_vec, tmp_path / "ad", "tiny", args, MASK, [])
    merged = apply_dllm_lora(tmp_path / "ad", base)
    assert merged.config.speclab_block_causal and merged.config.mask_token_id == MASK
    ids = torch.tensor([[1, 2, 3, MASK, 5]])
    with torch.no_grad():
        emb = trained.model.embed_tokens(ids)
        emb[0, 3] = mask_vec.to(torch.bfloat16).float()
        want = trained(inputs_embeds=emb).logits
        got = merged(input_ids=ids).logits
    torch.testing.assert_close(got[0, :3], want[0, :3], atol=0.05, rtol=0.02)   # bf16-stored deltas
    torch.testing.assert_close(got[0, 3:, :MASK], want[0, 3:, :MASK], atol=0.05, rtol=0.02)
    with pytest.raises(ValueError, match="hidden_size=32.*has 64"):
        apply_dllm_lora(tmp_path / "ad", tiny(0, hidden=64))
