"""`speclab.run(target, prompt, "dllm-*", ...)`: load, check, build the policy, decode, trace.

The diffusion engine's seam: `run_dllm(...) -> Trace`; its Engine row (decoding/engines.py) wraps it
in a Result. The method's row names the policy class (`config`) and the step loop that runs it (`loop`)."""
from __future__ import annotations

from dataclasses import fields

from speclab.decoding.dgemma import DGemmaSampler, canvas_length, dgemma_decode, is_dgemma
from speclab.decoding.diffusion import check_shape
from speclab.decoding.registry import get_method, param_types
from speclab.models.loading import as_model, chat_prompt, encode_prompt, model_info, token_table
from speclab.params import check_types
from speclab.trace import MASK as EDIT_MASK
from speclab.trace import RECORD_LEVELS, Sampling, Trace


def run_dllm(target, prompt, method: str, gen_length: int | None = None, block_length: int | None = None,
             max_new_tokens: int | None = None, temperature: float = 0.0, top_k=None, top_p=None,
             seed: int = 0, record: str | None = "light", device=None, progress=None, eos_stop: bool = True,
             draft=None, backend=None, chat: bool = False, dtype="auto", **params) -> Trace:
    from speclab.models.dllm import make_denoiser
    if record not in RECORD_LEVELS:
        raise ValueError(f"record must be one of None, 'light', 'full', got {record!r}")
    if draft is not None:
        raise ValueError(f"{method} takes no draft model: a diffusion LM drafts and checks with itself")
    if top_k is not None or top_p is not None:
        raise ValueError(f"{method} samples with temperature only (Gumbel-max); top_k / top_p are not supported")
    if temperature is None or temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    gen_length = gen_length if gen_length is not None else (max_new_tokens or 64)
    m = get_method(method)
    known = [f.name for f in fields(m.config)]
    noise_only = [f.name for f in fields(DGemmaSampler) if f.name not in known]
    noise_canvas = m.noise_canvas                  # the sampler that also runs DiffusionGemma's canvas
    if set(params) - set(known) - set(noise_only) or (set(params) & set(noise_only) and not noise_canvas):
        raise ValueError(f"{method} does not take {sorted(set(params) - set(known))}; it takes "
                         f"gen_length, block_length, eos_stop, {', '.join(known)}")
    check_types(method, params, param_types(method))
    model, tok = as_model(target, device, dtype)
    if is_dgemma(model):
        return _run_dgemma(model, tok, prompt, method, gen_length, block_length, temperature, seed, record,
                           progress, chat, params)
    if set(params) & set(noise_only):
        raise ValueError(f"{sorted(set(params) & set(noise_only))} belong to DiffusionGemma's noise canvas; "
                         f"on a mask-based dLLM {method} takes only entropy_bound")
    check_shape(gen_length, block_length)
    policy = m.config(**params)
    policy.prepare(model, tok)                  # what it reads of the run's model and tokenizer (DiffusionPolicy)
    den = make_denoiser(model)
    if den.block_causal and block_length is None:  # a block-diffusion LM decodes in its trained blocks
        block_length = min(den.B, gen_length)
        check_shape(gen_length, block_length)
    if chat:                                       # a user message in the chat template (smollm2-dllm)
        prompt = chat_prompt(tok, prompt)
    ids = encode_prompt(tok, prompt, gen_length, getattr(model.config, "max_position_embeddings", None))
    new, steps, totals = m.loop(den, ids, policy, gen_length, block_length, temperature, seed, record,
                                 tok.eos_token_id, eos_stop, progress)
    seen = ids + new + [den.mask_id] + [t for s in steps for t in s.top1 + s.committed_tokens]
    seen += [e.after for s in steps for e in s.edits if e.after != EDIT_MASK]     # a rewrite's token
    trace = Trace(engine="diffusion", method=method, guarantee=get_method(method).guarantee,
                  params=dict(params, gen_length=gen_length, block_length=block_length or gen_length,
                              eos_stop=eos_stop, eos_id=tok.eos_token_id, mask_id=den.mask_id,
                              policy=type(policy).__name__, **({"chat": True} if chat else {}),
                              **({"block_causal": True} if den.block_causal else {})),
                  models={"target": model_info(model, getattr(model, "name_or_path", "target"))},
                  sampling=Sampling(temperature, None, None, seed), record=record,
                  prompt_ids=ids, output_ids=new, token_text=token_table(tok, seen),
                  totals=totals, denoise=steps)
    return trace


def _run_dgemma(model, tok, prompt, method, gen_length, block_length, temperature, seed, record, progress, chat,
                params) -> Trace:
    """DiffusionGemma: its own sampler (entropy bound, re-noising, temperature schedule, stop rule)."""
    L = canvas_length(model)
    if not get_method(method).noise_canvas:
        raise ValueError(f"DiffusionGemma denoises a canvas of random tokens, not masks: {method} needs a mask-based "
                         "dLLM; decode it with dllm-entropy-bound (its own sampler)")
    if block_length not in (None, L):
        raise ValueError(f"this DiffusionGemma's block is its canvas, {L} tokens: drop block_length or set it to {L}")
    if temperature:
        raise ValueError("DiffusionGemma samples with its own temperature schedule (t_max -> t_min): "
                         "set t_min / t_max and leave temperature at 0")
    sampler = DGemmaSampler(**params)
    if chat:
        prompt = chat_prompt(tok, prompt)
    ids = encode_prompt(tok, prompt, gen_length, getattr(model.config.get_text_config(), "max_position_embeddings", None))
    new, steps, totals = dgemma_decode(model, ids, sampler, gen_length, seed, record, tok.eos_token_id, progress)
    pad = int(model.config.get_text_config().pad_token_id or 0)
    seen = ids + new + [pad] + [t for s in steps for t in s.top1 + s.tokens]
    return Trace(engine="diffusion", method=method, guarantee=get_method(method).guarantee,
                 params=dict(params, gen_length=gen_length, block_length=L, eos_stop=True, eos_id=tok.eos_token_id,
                             mask_id=pad, policy="DGemmaSampler", canvas="noise", **({"chat": True} if chat else {})),
                 models={"target": model_info(model, getattr(model, "name_or_path", "target"))},
                 sampling=Sampling(0.0, None, None, seed), record=record,
                 prompt_ids=ids, output_ids=new, token_text=token_table(tok, seen), totals=totals, denoise=steps)
