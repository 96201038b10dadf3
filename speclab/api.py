"""The Python API: `speclab.run(...)` (every engine) and `speclab.generate(...)` (speculative, batches) -> Result."""
from __future__ import annotations

from dataclasses import dataclass

from speclab import metrics
from speclab.decoding.acceptance import Sampler
from speclab.decoding.batch import run_batch, unsupported
from speclab.decoding.registry import (Method, build_drafter, get_method, guarantee, method_params, paired_draft,
                                       param_types, recorded_params)
from speclab.decoding.guarantees import weakest
from speclab.decoding.rules import check_run, get_rule
from speclab.decoding.rules import rule_params as resolve_rule_params
from speclab.decoding.speculative import Drafter
from speclab.decoding.speculative import run as run_speculative
from speclab.models.backends import make_lm
from speclab.models.lean.archs import VERIFY_ROOM
from speclab.models.loading import (PromptBoundaryWarning, as_model, chat_prompt, check_vocab,  # noqa: F401
                                    encode_prompt, model_info)
from speclab.params import check_types
from speclab.trace import RECORD_LEVELS, Trace


@dataclass
class Result:
    text: str
    ids: list[int]                 # new token ids
    trace: Trace

    @property
    def stats(self) -> dict:
        t = self.trace.totals
        return dict(new_tokens=t.new_tokens, target_forwards=t.target_forwards,
                    draft_forwards=t.draft_forwards, tau=t.tau, wall_s=t.wall_s,
                    # alpha: the papers' per-token rate (accepted / judged), the cost model's; kept:
                    # accepted / drafted, every drafted token counted (metrics' docstring)
                    alpha=metrics.token_alpha(self.trace.rounds), kept=t.alpha,
                    drafted=t.drafted, accepted=t.accepted, draft_s=t.draft_s, verify_s=t.verify_s)


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
    if m.engine != "speculative":
        raise ValueError(f"method {method!r} runs on the {m.engine} engine: use speclab.run()")
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
    if batch and rule != "exact":
        raise ValueError(f"rule={rule!r} verifies one prompt at a time; a batch verifies with 'exact'")
    kept = guarantee(m.name, rule) if custom is None else weakest(m.guarantee, get_rule(rule).guarantee)
    if m.needs_draft and draft is None:
        draft = paired_draft(target, m)
        if draft is None:
            raise ValueError(f"method {method!r} needs {m.draft.what} for this target: pass draft=... (or --draft); "
                             f"the zoo ships them for {', '.join(sorted(m.draft.paired))}")
    check_pairing(m.engine, method, target, draft if m.needs_draft else None)
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
                           method, params, models, progress, backend)
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


def run(target, prompt, method: str = "ar", **kw) -> Result:
    """Any engine by method name: speculative methods go to generate(), dag-* to the DAG decoder,
    dllm-* to the diffusion decoder. The one dispatcher: the CLI, the dashboard and the bench call it.
    The target / draft pairing is checked first, for every engine. The same keywords mean the same
    thing everywhere (record, seed, device, dtype, chat, temperature); max_new_tokens is the canvas
    length of a diffusion run unless gen_length is given, and a DAG's output length is its graph's."""
    m = get_method(method) if isinstance(method, str) else None
    if m is None or m.engine == "speculative":
        return generate(target, prompt, method, **kw)      # checks the pairing itself (public too)
    if kw.pop("rule", None) not in (None, "exact") or kw.pop("rule_params", None):
        raise ValueError(f"{method} has no verify to take an acceptance rule: rule= is for speculative methods")
    check_pairing(m.engine, method, target, kw.get("draft"))
    if is_batch(prompt):
        raise ValueError(f"a list of prompts decodes as a batch on the speculative engine only; {method} "
                         f"({m.engine}) takes one prompt at a time")
    if m.engine == "dag":
        return _run_dag(target, prompt, m.strategy, **kw)
    if m.engine == "diffusion":
        from speclab.decoding.dllm_run import run_dllm
        trace = run_dllm(target, prompt, m.name, **kw)
        tok = as_model(target, kw.get("device"), kw.get("dtype", "auto"))[1]
        return Result(text=tok.decode(trace.output_ids, skip_special_tokens=False), ids=list(trace.output_ids),
                      trace=trace)
    raise ValueError(f"method {method!r}: the {m.engine} engine is not available in this version")


# what each engine decodes, and what to say when a model of another kind is given to it
ENGINE_KIND = {"speculative": "causal", "diffusion": "diffusion", "dag": "dag"}
KIND_IS = {"causal": "a causal LM", "diffusion": "a masked-diffusion LM (bidirectional)", "dag": "a DA-Transformer"}
KIND_METHODS = {"causal": "ar, draft-model, prompt-lookup, suffix, ...",
                "diffusion": "a dllm-* method (dllm-threshold, dllm-lowconf, ...)",
                "dag": "a dag-* method (dag-viterbi, dag-greedy, ...)"}


def check_pairing(engine: str, method: str, target, draft=None) -> None:
    """Does this engine decode this kind of model? One ValueError line if not, before any weights load
    (the kind comes from the config; a hub id is left to loading)."""
    from speclab.models.loading import model_kind
    want = ENGINE_KIND.get(engine)
    kind = model_kind(target)
    if want is None or kind is None or kind == want:
        pass
    elif engine == "dag":
        raise ValueError(f"{method} needs a DA-Transformer target (numwords-dat, dates-dat), not {_name(target)} "
                         f"({KIND_IS[kind]})")
    elif engine == "diffusion":
        raise ValueError(f"{_name(target)} is not a masked-diffusion LM ({KIND_IS[kind]}): {method} needs a diffusion "
                         f"model such as code-dllm or digits-dllm; decode {_name(target)} with {KIND_METHODS[kind]}")
    else:
        raise ValueError(f"{_name(target)} is {KIND_IS[kind]}: decode it with {KIND_METHODS[kind]}, not {method!r}")
    if draft is None:
        return
    if engine != "speculative":
        raise ValueError(f"{method} takes no draft model: {KIND_IS[want]} decodes without one")
    dkind = model_kind(draft)
    from speclab.decoding.registry import METHODS
    if dkind == "diffusion" and getattr(METHODS.get(method), "draft_kind", None) == "dllm":
        return          # a block-diffusion LM drafting for a causal target (dllm-draft)
    if dkind not in (None, "causal"):
        raise ValueError(f"the draft {_name(draft)} is {KIND_IS[dkind]}: a draft model must be a causal LM that "
                         "shares the target's tokenizer (e.g. code-draft)")


def _name(m) -> str:
    if isinstance(m, (tuple, list)):
        return str(getattr(m[0], "name_or_path", None) or getattr(m[0], "name", None) or type(m[0]).__name__)
    return str(m)


def _run_dag(target, prompt, strategy, record="light", seed=0, device=None, temperature=None, top_k=None,
             top_p=None, draft=None, max_new_tokens=None, dtype="auto", chat=False, progress=None, **params) -> Result:
    """max_new_tokens, progress: a DAG decodes its whole output in one forward (its length is the graph's)."""
    from dataclasses import fields
    from speclab.decoding.dag import DecodeConfig, decode_config, decode_text, run_dag
    if chat:
        raise ValueError(f"dag-{strategy}: a DA-Transformer has no chat template; give the input itself as the prompt")
    model = as_model(target, device, dtype)[0]
    check_pairing("dag", f"dag-{strategy}", (model, None))     # a hub id is known only once loaded
    known = {f.name for f in fields(DecodeConfig)}
    if set(params) - known:
        raise ValueError(f"dag methods do not take {sorted(set(params) - known)}; they take {sorted(known)}")
    # temperature 0 (greedy, every caller's default) is no sampling setting for a DAG: dag-sample
    # then draws at its decode config's temperature
    for name, v in (("temperature", temperature or None), ("top_k", top_k), ("top_p", top_p)):
        if v is not None:
            params[name] = v
    check_types(f"dag-{strategy}", params, param_types(f"dag-{strategy}"))
    trace = run_dag(model, str(prompt), strategy, record=record, seed=seed, cfg=decode_config(model, **params))
    trace.guarantee = get_method(f"dag-{strategy}").guarantee
    return Result(text=decode_text(model, trace.output_ids), ids=list(trace.output_ids), trace=trace)
