"""The Python API: `speclab.generate(...) -> Result`, one entry point for every method."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from speclab.decoding.acceptance import Sampler
from speclab.decoding.registry import Method, get_method, method_params, takes_backend
from speclab.decoding.speculative import Drafter, decode
from speclab.models.causal import make_lm, param_count
from speclab.models.zoo import load_shared
from speclab.trace import RECORD_LEVELS, ModelInfo, Sampling, Trace, replay


@dataclass
class Result:
    text: str
    ids: list[int]                 # new token ids
    trace: Trace

    @property
    def stats(self) -> dict:
        t = self.trace.totals
        return dict(new_tokens=t.new_tokens, target_forwards=t.target_forwards,
                    draft_forwards=t.draft_forwards, tau=t.tau, alpha=t.alpha, wall_s=t.wall_s,
                    drafted=t.drafted, accepted=t.accepted, draft_s=t.draft_s, verify_s=t.verify_s)


def as_model(m, device=None):
    """A zoo name / directory / hub id, or an already loaded (model, tokenizer) pair."""
    if m is None:
        return None
    if isinstance(m, (tuple, list)):
        return m[0], m[1]
    return load_shared(str(m), device)


def check_vocab(target, draft):
    vt, vd = target[0].config.vocab_size, draft[0].config.vocab_size
    if vt != vd or len(target[1]) != len(draft[1]):
        raise ValueError(f"draft and target have different vocabularies (target {vt} tokens, draft {vd}): "
                         "a draft model must share the target's tokenizer")


class PromptBoundaryWarning(UserWarning):
    """A prompt that ends where the tokenizer would not end a token (trailing whitespace)."""


def encode_prompt(tokenizer, prompt, max_new_tokens: int, max_positions: int | None) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("empty prompt: give some text to continue")
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if prompt != prompt.rstrip():
            warnings.warn(PromptBoundaryWarning(
                f"the prompt ends in whitespace ({prompt[len(prompt.rstrip()):]!r}): byte-level BPE merges a "
                "newline or space with the text after it, so the model sees a last token it rarely saw "
                "there; drop the trailing whitespace for a natural continuation"), stacklevel=3)
    else:
        ids = [int(i) for i in prompt]
        if not ids:
            raise ValueError("empty prompt: give some token ids to continue")
    if max_positions and len(ids) + max_new_tokens > max_positions:
        raise ValueError(f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the model's "
                         f"context window of {max_positions}: shorten the prompt or lower max_new_tokens")
    return ids


def token_table(tokenizer, ids) -> dict[int, str]:
    uniq = sorted(set(int(i) for i in ids))
    return {i: tokenizer.decode([i]) for i in uniq}


def model_info(model, name: str) -> ModelInfo:
    p = next(model.parameters())
    return ModelInfo(name=str(name), params=param_count(model), dtype=str(p.dtype).replace("torch.", ""),
                     device=str(p.device))


def generate(target, prompt, method: str = "ar", draft=None, max_new_tokens: int = 128,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int = 0, record: str | None = "light", device=None, progress=None,
             backend: str = "auto", **method_params_) -> Result:
    """Decode `prompt` with `method`; every decision goes into `result.trace`.

    target / draft: a zoo name ("code-target"), a local directory, a hub id, or (model, tokenizer).
    backend: "auto" runs plain Llama models on speclab's lean forward (same weights, same logits
    to fp32 rounding, preallocated cache) and anything else through transformers; "hf" forces
    transformers for every model.
    """
    if isinstance(method, Drafter):                 # a user's own drafter plugs into the same slot
        custom, method = method, getattr(method, "name", type(method).__name__)
    else:
        custom = None
    m = get_method(method) if custom is None else Method(method, "custom", "speculative", True, False, "", None)
    if m.engine != "speculative":
        raise ValueError(f"method {method!r} runs on the {m.engine} engine: use speclab.run()")
    if record not in RECORD_LEVELS:
        raise ValueError(f"record must be one of None, 'light', 'full', got {record!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    unknown = set(method_params_) - set(method_params(method) if custom is None else [])
    if unknown:
        raise ValueError(f"method {method!r} does not take {sorted(unknown)}; it takes {method_params(method)}")
    sampler = Sampler(temperature, top_k, top_p)
    tgt = as_model(target, device)
    if m.needs_draft and draft is None:
        raise ValueError(f"method {method!r} needs a draft model: pass draft='code-draft' (or --draft)")
    dft = as_model(draft, device) if m.needs_draft else None
    if dft is not None:
        check_vocab(tgt, dft)
    model, tok = tgt
    from speclab.models.dllm import is_dllm
    if is_dllm(model) or (dft is not None and is_dllm(dft[0])):
        raise ValueError(f"{getattr(model, 'name_or_path', 'the model')} is a masked-diffusion LM (bidirectional): "
                         f"decode it with a dllm-* method (dllm-threshold, dllm-lowconf, ...), not {method!r}")
    ids = encode_prompt(tok, prompt, max_new_tokens, getattr(model.config, "max_position_embeddings", None))
    extra = {"backend": backend} if custom is None and takes_backend(method) else {}
    drafter = custom or m.build(model, dft[0] if dft else None, **method_params_, **extra)
    lm = make_lm(model, "target", backend)
    new, rounds, totals = decode(lm, drafter, ids, max_new_tokens, sampler, seed, record,
                                 tok.eos_token_id, progress)
    models = {"target": model_info(model, getattr(model, "name_or_path", "target"))}
    if dft is not None:
        models["draft"] = model_info(dft[0], getattr(dft[0], "name_or_path", "draft"))
    table_ids = ids + new + [n.token for r in rounds for n in r.nodes] + [r.emitted for r in rounds]
    trace = Trace(engine="speculative", method=method,
                  params=dict(method_params_, max_new_tokens=max_new_tokens, backend=type(lm).__name__),
                  models=models, sampling=Sampling(temperature, top_k, top_p, seed), record=record,
                  prompt_ids=ids, output_ids=new, token_text=token_table(tok, table_ids),
                  totals=totals, rounds=rounds)
    return Result(text=tok.decode(new), ids=new, trace=trace)


def run(target, prompt, method: str = "ar", **kw) -> Result:
    """Any engine by method name: speculative methods go to generate(), dag-* to the DAG decoder."""
    m = get_method(method) if isinstance(method, str) else None
    if m is None or m.engine == "speculative":
        return generate(target, prompt, method, **kw)
    if m.engine == "dag":
        return _run_dag(target, prompt, m.name.removeprefix("dag-"), **kw)
    if m.engine == "diffusion":
        from speclab.decoding.dllm_run import run_dllm
        return run_dllm(target, prompt, m.name, **kw)
    raise ValueError(f"method {method!r}: the {m.engine} engine is not available in this version")


def _run_dag(target, prompt, strategy, record="light", seed=0, device=None, temperature=None, top_k=None,
             top_p=None, draft=None, max_new_tokens=None, **params) -> Result:
    from dataclasses import fields
    from speclab.decoding.dag import DecodeConfig, decode_text, run_dag
    model = as_model(target, device)[0]
    if not hasattr(model, "vocab"):
        raise ValueError(f"dag-{strategy} needs a DA-Transformer target (numwords-dat, dates-dat), "
                         f"not {getattr(model, 'name_or_path', type(model).__name__)}")
    known = {f.name for f in fields(DecodeConfig)}
    if set(params) - known:
        raise ValueError(f"dag methods do not take {sorted(set(params) - known)}; they take {sorted(known)}")
    for name, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if v is not None:
            params[name] = v
    trace = run_dag(model, str(prompt), strategy, record=record, seed=seed, cfg=DecodeConfig(**params))
    return Result(text=decode_text(model, trace.output_ids), ids=list(trace.output_ids), trace=trace)
