"""`speclab.run(target, prompt, "dllm-*", ...)`: load, check, build the policy, decode, trace.

The diffusion engine's seam: `run_dllm(...) -> Trace`; `speclab.api.run` wraps it in a Result."""
from __future__ import annotations

from dataclasses import fields

from speclab.decoding.diffusion import check_shape, denoise
from speclab.decoding.dllm_policies import POLICIES, FreeDave
from speclab.decoding.freedave import freedave
from speclab.models.loading import as_model, chat_prompt, encode_prompt, model_info, token_table
from speclab.trace import RECORD_LEVELS, Sampling, Trace


def run_dllm(target, prompt, method: str, gen_length: int | None = None, block_length: int | None = None,
             max_new_tokens: int | None = None, temperature: float = 0.0, top_k=None, top_p=None,
             seed: int = 0, record: str | None = "light", device=None, progress=None, eos_stop: bool = True,
             draft=None, backend=None, chat: bool = False, **params) -> Trace:
    from speclab.models.dllm import make_denoiser
    if record not in RECORD_LEVELS:
        raise ValueError(f"record must be one of None, 'light', 'full', got {record!r}")
    if draft is not None:
        raise ValueError(f"{method} takes no draft model: a diffusion LM drafts and checks with itself")
    if top_k is not None or top_p is not None:
        raise ValueError(f"{method} samples with temperature only (Gumbel-max); top_k / top_p are not supported")
    if temperature is None or temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    known = [f.name for f in fields(POLICIES[method])]
    if set(params) - set(known):
        raise ValueError(f"{method} does not take {sorted(set(params) - set(known))}; it takes "
                         f"gen_length, block_length, eos_stop, {', '.join(known)}")
    gen_length = gen_length if gen_length is not None else (max_new_tokens or 64)
    check_shape(gen_length, block_length)          # before any model loads
    policy = POLICIES[method](**params)
    model, tok = as_model(target, device)
    den = make_denoiser(model)
    if den.block_causal and block_length is None:  # a block-diffusion LM decodes in its trained blocks
        block_length = min(den.B, gen_length)
        check_shape(gen_length, block_length)
    if chat:                                       # a user message in the chat template (smollm2-dllm)
        prompt = chat_prompt(tok, prompt)
    ids = encode_prompt(tok, prompt, gen_length, getattr(model.config, "max_position_embeddings", None))
    run = freedave if isinstance(policy, FreeDave) else denoise
    new, steps, totals = run(den, ids, policy, gen_length, block_length, temperature, seed, record,
                                 tok.eos_token_id, eos_stop, progress)
    seen = ids + new + [den.mask_id] + [t for s in steps for t in s.top1]
    trace = Trace(engine="diffusion", method=method,
                  params=dict(params, gen_length=gen_length, block_length=block_length or gen_length,
                              eos_stop=eos_stop, eos_id=tok.eos_token_id, mask_id=den.mask_id,
                              policy=type(policy).__name__, **({"chat": True} if chat else {}),
                              **({"block_causal": True} if den.block_causal else {})),
                  models={"target": model_info(model, getattr(model, "name_or_path", "target"))},
                  sampling=Sampling(temperature, None, None, seed), record=record,
                  prompt_ids=ids, output_ids=new, token_text=token_table(tok, seen),
                  totals=totals, denoise=steps)
    return trace
