"""The speculative engine's door: `generate(target, prompt, method, ...) -> Result` (or a list of
Results for a batch of prompts): check the run's settings, load the models, build the drafter, decode
(decoding/speculative.py, or decoding/batch.py for a batch) and trace. `speclab.run` calls it through
the speculative Engine row (decoding/engines.py), after checking the target / draft pairing."""
from __future__ import annotations

from speclab.decoding.acceptance import Sampler
from speclab.decoding.batch import run_batch, unsupported
from speclab.decoding.guarantees import weakest
from speclab.decoding.registry import (Method, build_drafter, get_method, guarantee, method_params, paired_draft,
                                       param_types, recorded_params)
from speclab.decoding.result import Result
from speclab.decoding.rules import check_run, get_rule
from speclab.decoding.rules import rule_params as resolve_rule_params
from speclab.decoding.speculative import Drafter
from speclab.decoding.speculative import run as run_speculative
from speclab.models.backends import make_lm
from speclab.models.lean.archs import VERIFY_ROOM
from speclab.models.loading import as_model, chat_prompt, check_vocab, encode_prompt, model_info
from speclab.params import check_types
from speclab.trace import RECORD_LEVELS


def generate(target, prompt, method: str = "ar", draft=None, max_new_tokens: int = 128,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int = 0, record: str | None = "light", device=None, progress=None,
             backend: str = "auto", dtype="auto", chat: bool = False, rule: str | None = None,
             rule_params: dict | None = None, **method_params_) -> Result | list[Result]:
    """Decode `prompt` with `method`; every decision goes into `result.trace`.

    prompt: text, a list of token ids, or a LIST OF PROMPTS (texts or id lists): those are decoded
    together as one batch (speclab.decoding.batch: one target forward per round for all of them)
    and a list of Results comes back, one per prompt, in order, each lossless against decoding its
    prompt alone. Lane i samples with seed + i (or seed[i] if seed is a list), recorded in its trace.
    A batch's target runs in one cache (models.backends.make_batch_lm: the models the lean forward runs on
    its shared slot space, anything else as rows of a transformers cache).

    target / draft: a zoo name ("code-target", "smollm2-135m"), a local directory, a hub id, or
    (model, tokenizer). dtype: "auto" (bf16 where the hardware runs it natively, else fp32; the toy
    zoo stays fp32), "bf16" or "fp32"; ignored for already loaded models. chat: `prompt` is a user
    message, wrapped in the tokenizer's chat template (generation stops at the end-of-turn token).
    backend: "auto" runs Llama, Qwen2 / Qwen2.5, Qwen3 and Mistral models (models.lean.archs) on
    speclab's lean forward (same weights, same logits to fp32 rounding, preallocated cache) and
    anything else through transformers; "hf" forces transformers for every model.
    rule: the acceptance rule of the verify (decoding/rules: "exact", "typical", "lantern", ...; None:
    the method's own, `exact` for most), with its parameters in rule_params. A lossy rule is recorded
    with both verdicts per node; the trace's `guarantee` says what the run keeps.
    """
    if isinstance(prompt, (list, tuple)) and not prompt:
        raise ValueError("empty prompt: give a prompt (text or token ids), or a non-empty list of prompts "
                         "to decode as a batch")
    batch = is_batch(prompt)
    if isinstance(method, Drafter):                 # a user's own drafter plugs into the same slot
        custom, method = method, getattr(method, "name", type(method).__name__)
    else:
        custom = None
    m = get_method(method) if custom is None else Method(name=method, family="custom", engine="speculative",
                                                                    guarantee="identical-to-ar", summary="",
                                                                    drafter=type(custom))
    if record not in RECORD_LEVELS:
        raise ValueError(f"record must be one of None, 'light', 'full', got {record!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    takes = method_params(m) if custom is None else []   # a Drafter instance came built: none
    unknown = set(method_params_) - set(takes)
    if unknown:
        raise ValueError(f"method {method!r} does not take {sorted(unknown)}; it takes {takes}")
    if custom is None:
        check_types(f"method {method!r}", method_params_, param_types(m))
    if batch:
        check_batch(prompt, method, custom, seed)
    sampler = Sampler(temperature, top_k, top_p)
    rule = rule or m.rule
    rule_params = resolve_rule_params(rule, rule_params)            # unknown rule or parameter: one line
    check_run(rule, sampler.greedy, method=None if custom is not None else m.name)
    if batch and get_rule(rule).batch_refusal():
        raise ValueError(get_rule(rule).batch_refusal())
    kept = guarantee(m.name, rule) if custom is None else weakest(m.guarantee, get_rule(rule).guarantee)
    if m.needs_draft and draft is None:
        draft = paired_draft(target, m)
        if draft is None:
            raise ValueError(f"method {method!r} needs {m.draft.what} for this target: pass draft=... (or --draft); "
                             f"the zoo ships them for {', '.join(sorted(m.draft.paired))}")
    tgt = as_model(target, device, dtype)
    # a draft given by name loads in the target's dtype (one regime per run)
    dft = as_model(draft, device, next(tgt[0].parameters()).dtype) if m.needs_draft else None
    if dft is not None:
        check_vocab(tgt, dft)
    model, tok = tgt
    prompts = list(prompt) if batch else [prompt]
    if chat:
        prompts = [chat_prompt(tok, p) for p in prompts]
    n_pos = getattr(model.config, "max_position_embeddings", None)
    ids = [encode_one(tok, p, max_new_tokens, n_pos, i if batch else None) for i, p in enumerate(prompts)]
    if m.setup is not None and custom is None and not batch:
        # before the run, outside its timing: the baseline's output on this prompt with the run's own
        # sampler, seed and backend (the oracle drafts it)
        ar = lambda: generate(tgt, ids[0], "ar", max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                              top_p=top_p, seed=seed, record=None, backend=backend).ids
        method_params_ = m.setup(method_params_, ar)
    build = lambda: custom or build_drafter(m, model, dft[0] if dft else None, method_params_, backend)  # a new one
    models = {"target": model_info(model, getattr(model, "name_or_path", "target"))}
    if dft is not None:
        models["draft"] = model_info(dft[0], getattr(dft[0], "name_or_path", "draft"))

    params = dict(recorded_params(method_params_), max_new_tokens=max_new_tokens, **({"chat": True} if chat else {}))
    if batch:       # one drafter per sequence: drafters keep per-request state
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed + i for i in range(len(ids))]
        traces = run_batch(model, [build() for _ in ids], tok, ids, max_new_tokens, sampler, seeds, record,
                           method, params, models, progress, backend, rule, rule_params)
        for t in traces:
            t.guarantee = kept
        return [Result(text=tok.decode(t.output_ids), ids=list(t.output_ids), trace=t) for t in traces]
    # how far the request reaches (the factory sizes what it builds by it)
    lm = make_lm(model, "target", backend, max_len=len(ids[0]) + max_new_tokens + VERIFY_ROOM)
    trace = run_speculative(lm, build(), tok, ids[0], max_new_tokens, sampler, seed,
                            record, method, params, models, progress, rule, rule_params, model)
    trace.guarantee = kept
    return Result(text=tok.decode(trace.output_ids), ids=list(trace.output_ids), trace=trace)


def encode_one(tok, prompt, max_new_tokens: int, n_pos: int | None, index: int | None):
    """encode_prompt, its error naming the prompt of a batch it is about."""
    if index is None:
        return encode_prompt(tok, prompt, max_new_tokens, n_pos)
    try:
        return encode_prompt(tok, prompt, max_new_tokens, n_pos)
    except ValueError as e:
        raise ValueError(f"prompt {index} of the batch: {e}") from e


def is_batch(prompt) -> bool:
    """A list of prompts (texts or lists of token ids), as opposed to one prompt given as token ids."""
    return isinstance(prompt, (list, tuple)) and any(isinstance(p, (str, list, tuple)) for p in prompt)


def check_batch(prompts, method: str, custom, seed) -> None:
    """One ValueError line for a batch that cannot run, before any weights load."""
    for i, p in enumerate(prompts):
        if not isinstance(p, (str, list, tuple)):
            raise ValueError(f"a batch is a list of prompts (texts or lists of token ids); prompt {i} is a "
                             f"{type(p).__name__}: give every prompt the same way")
    if custom is not None:
        raise ValueError("a batch builds one drafter per prompt: pass a method name, not a Drafter instance, "
                         "or decode the prompts one at a time")
    reason = unsupported(method)
    if reason:
        raise ValueError(reason)
    if isinstance(seed, (list, tuple)) and (len(seed) != len(prompts) or not all(isinstance(x, int) for x in seed)):
        raise ValueError(f"seed for a batch of {len(prompts)} prompts: one integer (prompt i gets seed + i) "
                         f"or a list of {len(prompts)} integers, got {seed!r}")
