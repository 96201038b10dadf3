"""Peers: transformers' own `generate()` on the same loaded models, counted the same way.

  hf-greedy         generate(do_sample=False)
  hf-static         generate(cache_implementation="static"): a KV cache preallocated for the bench's
                    longest request, so every decode step has one shape. On CUDA transformers compiles
                    that step (torch.compile, CUDA graphs) and the peer repeats the call until its time
                    settles before timing it; elsewhere it runs the same static cache uncompiled
  hf-assisted       generate(assistant_model=draft, num_assistant_tokens=k, constant schedule)
  hf-prompt-lookup  generate(prompt_lookup_num_tokens=k)
  hf-early-exit     generate(assistant_early_exit=L)   (Llama-style models)
  hf-diffusion      DiffusionGemma's own generate() (its entropy-bound sampler), seeded like
                    speclab's dllm-entropy-bound; forwards = decoder calls, as transformers counts
                    them in `tokens_per_forward`

Target forwards are counted with a forward hook on the target, so tau means the same as ours. On
CUDA every timing waits for the device (torch.cuda.synchronize) before the clock is read.
"""
from __future__ import annotations

import time

import torch

PEERS = ("hf-greedy", "hf-static", "hf-assisted", "hf-prompt-lookup", "hf-early-exit", "hf-diffusion")


def peer_kwargs(name: str, draft, k: int, exit_layer: int) -> dict:
    if name == "hf-greedy":
        return {}
    if name == "hf-static":
        return dict(cache_implementation="static")
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


def _sync(device: torch.device):
    """Wait for the device's queued work, so that a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def settled(times: list[float], tol: float = 0.05, min_calls: int = 3) -> bool:
    """Whether a warm-up has settled: at least min_calls calls (compile, CUDA-graph capture, one
    replay) and the last two within tol of each other."""
    if len(times) < max(min_calls, 2):
        return False
    a, b = times[-2:]
    return abs(a - b) <= tol * min(a, b)


def warm_static(call, max_calls: int = 10) -> list[float]:
    """Repeat `call` (it returns its own wall seconds) until its time settles; the times."""
    times = []
    while len(times) < max_calls and not settled(times):
        times.append(call())
    return times


@torch.inference_mode()
def run_diffusion_peer(model, tok, prompt_ids: list[int], gen_length: int, seed: int = 0) -> dict:
    """DiffusionGemma's generate() on one prompt: its RNG seeded inside fork_rng (as speclab's loop)."""
    calls = [0]
    hook = model.model.decoder.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    dev = next(model.parameters()).device
    try:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            ids = torch.tensor([prompt_ids], device=dev)
            _sync(dev)
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=gen_length,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                 return_dict_in_generate=True)
            _sync(dev)
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
             exit_layer: int = 4, max_cache_len: int | None = None) -> dict:
    """One greedy generate() call. Returns ids, wall_s and counted target forwards; hf-static also
    cache_len (the static cache's length) and warmup_s (the calls that compiled it, untimed).
    max_cache_len: hf-static's cache length (default: this prompt + max_new_tokens); the bench
    passes its longest request, so one compiled step serves every prompt."""
    if name == "hf-diffusion":
        return run_diffusion_peer(model, tok, prompt_ids, max_new_tokens)
    kw = peer_kwargs(name, draft, k, exit_layer)
    extra = {}
    if name == "hf-static":
        need = len(prompt_ids) + max_new_tokens
        if max_cache_len is not None and max_cache_len < need:
            raise ValueError(f"hf-static: max_cache_len {max_cache_len} is shorter than the prompt + max_new_tokens "
                             f"({need}); pass at least {need}")
        # transformers keeps a static cache at least as long as the model's longest before it
        # (_previous_max_cache_length), so that a shorter request reuses the compiled step
        cache_len = max(max_cache_len or need, getattr(model, "_previous_max_cache_length", -1))
        kw["max_cache_len"] = cache_len
        extra["cache_len"] = cache_len
    ids = torch.tensor([prompt_ids], device=model.device)

    def call():
        _sync(model.device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kw)
        _sync(model.device)
        return out, time.perf_counter() - t0

    if name == "hf-static" and model.device.type == "cuda":
        # compiled per cache length: the first calls compile and capture, untimed. The lengths already
        # warmed live on the model, as transformers keeps its compiled step there
        warmed = model.__dict__.setdefault("_speclab_static_warmed", set())
        if extra["cache_len"] not in warmed:
            extra["warmup_s"] = warm_static(lambda: call()[1])
            warmed.add(extra["cache_len"])
    if name == "hf-static":
        # no hook: a compiled step guards on the model's hooks, so adding one would recompile it
        # inside the timed call. Greedy generate() runs one forward per new token (the prefill's
        # gives the first), which the CPU test pins against hf-greedy's hooked count
        out, wall = call()
        new = out[0, len(prompt_ids):].tolist()
        return dict(ids=new, wall_s=wall, target_forwards=len(new), **extra)
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        out, wall = call()
    finally:
        hook.remove()
    new = out[0, len(prompt_ids):].tolist()
    return dict(ids=new, wall_s=wall, target_forwards=calls[0], **extra)
