"""Peers: transformers' own `generate()` on the same loaded models, counted the same way.

  hf-greedy         generate(do_sample=False)
  hf-assisted       generate(assistant_model=draft, num_assistant_tokens=k, constant schedule)
  hf-prompt-lookup  generate(prompt_lookup_num_tokens=k)
  hf-early-exit     generate(assistant_early_exit=L)   (Llama-style models)
  hf-diffusion      DiffusionGemma's own generate() (its entropy-bound sampler), seeded like
                    speclab's dllm-entropy-bound; forwards = decoder calls, as transformers counts
                    them in `tokens_per_forward`

Target forwards are counted with a forward hook on the target, so tau means the same as ours.
"""
from __future__ import annotations

import time

import torch

PEERS = ("hf-greedy", "hf-assisted", "hf-prompt-lookup", "hf-early-exit", "hf-diffusion")


def peer_kwargs(name: str, draft, k: int, exit_layer: int) -> dict:
    if name == "hf-greedy":
        return {}
    if name == "hf-assisted":
        if draft is None:
            raise ValueError("hf-assisted needs --draft")
        return dict(assistant_model=draft, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                    assistant_confidence_threshold=0.0)
    if name == "hf-prompt-lookup":
        return dict(prompt_lookup_num_tokens=k, max_matching_ngram_size=3)
    if name == "hf-early-exit":
        return dict(assistant_early_exit=exit_layer, num_assistant_tokens=k)
    raise ValueError(f"unknown peer {name!r}; peers: {', '.join(PEERS)}")


@torch.inference_mode()
def run_diffusion_peer(model, tok, prompt_ids: list[int], gen_length: int, seed: int = 0) -> dict:
    """DiffusionGemma's generate() on one prompt: its RNG seeded inside fork_rng (as speclab's loop)."""
    calls = [0]
    hook = model.model.decoder.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    dev = next(model.parameters()).device
    try:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            out = model.generate(torch.tensor([prompt_ids], device=dev), max_new_tokens=gen_length,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                 return_dict_in_generate=True)
            wall = time.perf_counter() - t0
    finally:
        hook.remove()
    new = out.sequences[0, len(prompt_ids):].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id) + 1]
    return dict(ids=new, wall_s=wall, target_forwards=calls[0],
                tokens_per_forward=float(out.tokens_per_forward[0]))


@torch.inference_mode()
def run_peer(name: str, model, tok, prompt_ids: list[int], max_new_tokens: int, draft=None, k: int = 4,
             exit_layer: int = 4) -> dict:
    """One greedy generate() call. Returns ids, wall_s and counted target forwards."""
    if name == "hf-diffusion":
        return run_diffusion_peer(model, tok, prompt_ids, max_new_tokens)
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        ids = torch.tensor([prompt_ids], device=model.device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             **peer_kwargs(name, draft, k, exit_layer))
        wall = time.perf_counter() - t0
    finally:
        hook.remove()
    new = out[0, len(prompt_ids):].tolist()
    return dict(ids=new, wall_s=wall, target_forwards=calls[0])
