"""One row per engine: everything decided per engine, in one place.

    engine        kind        steps (trace field)    noun / rate                     verify  draft  batch  bench baseline
    speculative   causal      rounds                 round / tau                     yes     yes    yes    ar
    diffusion     diffusion   denoise                step / tokens per forward       no      no     no     dllm-lowconf
    dag           dag         dag                    strategy / tau                  no      no     no     (none)
    superposed    causal      rounds                 step / tokens per forward       no      no     no     ar

An `Engine` row holds the model kind it decodes (and how an error names it), `run(target, prompt,
method, **kw) -> Result` (its door: spec_run.generate, dllm_run.run_dllm, the DAG decoder below), how
its traces hold and read their steps (a `speclab.trace.Steps` row: the field, `count`, `replay`, the
step noun and rate, which views and metrics read without a model), what it takes (a verify and its
acceptance rule, a draft model, a batch of prompts), its run-parameter check and the bench's baseline
for its targets. `speclab.run` is the one dispatcher: it looks the method's row up
(`get_engine(method.engine)`), checks the run's method parameters with the row's `check` (the
keywords its door does not name itself), and calls its `run`. Readers ask the row (`engine_of(trace)`,
`engine_for(target)`, `trace.steps_row()`), never compare engine names.

A fourth engine (a Jacobi decoder, a batched GPU engine) is one file with its loop and one row:

    register_engine(Engine(name="jacobi", kind="causal", kind_is="a causal LM", decoders="jacobi",
                           wrong_target="{target} is {its}: decode it with {use}", run=run_jacobi,
                           steps=Steps(engine="jacobi", field="rounds", noun="token", ...)))
    register(Method(name="jacobi", family="jacobi", engine="jacobi", ...))   # decoding/registry.py
    add_view(View("jacobi", step=(...)))                                        # figures/views.py

`Method.engine` stays the row's name (a string), so traces and the method registry load as before.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Callable

from speclab.decoding.dag import DecodeConfig, decode_config, decode_text, run_dag
from speclab.decoding.dgemma import DGemmaSampler, is_dgemma
from speclab.decoding.dllm_run import run_dllm
from speclab.decoding.registry import Method, get_method, method_params, param_types
from speclab.decoding.result import Result
from speclab.decoding.spec_run import generate
from speclab.decoding.superposed import run_superposed
from speclab.models.loading import as_model, model_kind
from speclab.params import check_types
from speclab.trace import STEPS, Steps, Trace, register_steps, unregister_steps
from speclab.scoped import scoped


def check_params(m: Method, params: dict) -> None:
    """A method's own parameters (not the run's: record, seed, ...): unknown names and wrong types
    are one ValueError line, before any weights load."""
    takes = method_params(m)
    unknown = set(params) - set(takes)
    if unknown:
        raise ValueError(f"method {m.name!r} does not take {sorted(unknown)}; it takes {takes}")
    check_types(f"method {m.name!r}", params, param_types(m))


def check_dllm_params(m: Method, params: dict) -> None:
    """check_params, plus the noise canvas's own knobs for the sampler that runs DiffusionGemma; an
    unknown name is refused in the diffusion door's own words (dllm_run.run_dllm)."""
    noise = {f.name for f in fields(DGemmaSampler)} if m.noise_canvas else set()
    takes = method_params(m)
    unknown = set(params) - set(takes) - noise
    if unknown:
        raise ValueError(f"{m.name} does not take {sorted(unknown)}; it takes {', '.join(takes)}")
    check_params(m, {k: v for k, v in params.items() if k not in noise - set(takes)})


@dataclass(frozen=True, kw_only=True)
class Engine:
    name: str                           # what Method.engine and Trace.engine hold
    kind: str                           # the model kind it decodes (models.loading.model_kind)
    kind_is: str                        # that kind as a message names it: "a causal LM"
    decoders: str                       # the methods that decode that kind, as a message names them
    wrong_target: str                   # the error for a target of another kind; keys: method, target,
                                        # its (the target's kind_is), use (the target kind's decoders)
    run: Callable[..., Result | list[Result]]   # run(target, prompt, method, **kw): its door
    steps: Steps                        # how its traces hold and read their steps (speclab.trace)
    verify: bool = False                # a target verifies drafts: takes rule= / rule_params=
    draft: bool = False                 # takes a draft model (a method whose row names one)
    batch: bool = False                 # decodes a list of prompts as one batch
    check: Callable[[Method, dict], None] = check_params   # its run-parameter check (method parameters)
    baseline: Callable[..., str] | None = None   # baseline(model) -> the method the bench divides every
                                                 # row by on this engine's targets; None: not benched

    @property
    def noun(self) -> str:
        return self.steps.noun

    @property
    def run_keywords(self) -> frozenset[str]:
        """The keywords its door names itself (record, seed, max_new_tokens, ...): read from the door's
        signature, so they cannot drift from it. A run's other keywords are its method's parameters,
        which `check` checks."""
        ps = inspect.signature(self.run).parameters.values()
        return frozenset(p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def check_method(self, m: Method, kw: dict) -> None:
        """The run's method parameters (what `kw` holds beyond the door's own keywords) through
        `check`: one ValueError line, before any weights load."""
        self.check(m, {k: v for k, v in kw.items() if k not in self.run_keywords})

    @property
    def rate(self) -> str:
        return self.steps.rate


ENGINES: dict[str, Engine] = {}


def register_engine(row: Engine) -> Engine:
    """Add an engine: speclab.run dispatches to it, its traces load, replay and are counted (its
    Steps row is registered with it). The views need its View (figures.views.add_view)."""
    if row.name in ENGINES:
        raise ValueError(f"an engine named {row.name!r} is already registered: unregister it first or pick "
                         "another name")
    if row.steps.engine != row.name:
        raise ValueError(f"engine {row.name!r}: its Steps row is named {row.steps.engine!r}; give both one name")
    if STEPS.get(row.name) is not row.steps:
        register_steps(row.steps)
    ENGINES[row.name] = row
    return row


def unregister_engine(name: str) -> None:
    ENGINES.pop(name, None)
    unregister_steps(name)


def registered_engine(row: Engine):
    """`with registered_engine(Engine(...)):` the engine exists inside the block only."""
    return scoped(register_engine, unregister_engine, row, row.name)


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)} (register_engine adds one)")
    return ENGINES[name]


def engine_of(trace: Trace) -> Engine:
    """The row of the engine that wrote `trace`."""
    return get_engine(trace.engine)


def kind_row(kind: str) -> Engine | None:
    """The first registered row that decodes models of `kind` (None: no engine does)."""
    return next((r for r in ENGINES.values() if r.kind == kind), None)


def engine_for(target) -> Engine:
    """The row that decodes `target` (a loaded model, (model, tokenizer), a zoo name or a folder): the
    first of its kind. One ValueError line where its kind is unknown before loading or no row takes it."""
    kind = model_kind(target)
    row = kind_row(kind) if kind is not None else None
    if row is None:
        raise ValueError(f"no engine decodes {_name(target)} (its kind: {kind or 'unknown before loading'}); "
                         f"the engines decode {', '.join(sorted({r.kind_is for r in ENGINES.values()}))}")
    return row


def kind_words(kind: str) -> tuple[str, str]:
    """(how a message names a model kind, the methods that decode it), from the first row of that kind."""
    row = kind_row(kind)
    return (row.kind_is, row.decoders) if row else (f"a {kind} model", "its own methods")


def check_pairing(row: Engine, method: str, target, draft=None, draft_kind: str | None = None) -> None:
    """Does this engine decode this kind of model (and take this draft)? One ValueError line if not,
    before any weights load (the kind comes from the config; a hub id is left to loading).
    draft_kind: the method's draft (registry Draft.kind): "dllm" lets a diffusion LM draft."""
    kind = model_kind(target)
    if kind is not None and kind != row.kind:
        its, use = kind_words(kind)
        raise ValueError(row.wrong_target.format(method=method, target=_name(target), its=its, use=use))
    if draft is None:
        return
    if not row.draft:
        raise ValueError(f"{method} takes no draft model: {row.kind_is} decodes without one")
    dkind = model_kind(draft)
    if dkind == "diffusion" and draft_kind == "dllm":
        return          # a block-diffusion LM drafting for a causal target (dllm-draft)
    if dkind not in (None, row.kind):
        raise ValueError(f"the draft {_name(draft)} is {kind_words(dkind)[0]}: a draft model must be "
                         f"{row.kind_is} that shares the target's tokenizer (e.g. code-draft)")


def _name(m) -> str:
    if isinstance(m, (tuple, list)):
        return str(getattr(m[0], "name_or_path", None) or getattr(m[0], "name", None) or type(m[0]).__name__)
    return str(m)


# -- the doors of the diffusion and DAG engines (the speculative one is decoding/spec_run.py) ---------
@functools.wraps(run_dllm, assigned=())   # its keywords are run_dllm's (Engine.run_keywords reads them)
def run_diffusion(target, prompt, method: str, **kw) -> Result:
    trace = run_dllm(target, prompt, method, **kw)
    tok = as_model(target, kw.get("device"), kw.get("dtype", "auto"))[1]
    return Result(text=tok.decode(trace.output_ids, skip_special_tokens=False), ids=list(trace.output_ids),
                  trace=trace)


def run_dag_method(target, prompt, method: str, record="light", seed=0, device=None, temperature=None, top_k=None,
                   top_p=None, draft=None, max_new_tokens=None, dtype="auto", chat=False, progress=None,
                   **params) -> Result:
    """max_new_tokens, progress: a DAG decodes its whole output in one forward (its length is the graph's)."""
    m = get_method(method)
    if chat:
        raise ValueError(f"{m.name}: a DA-Transformer has no chat template; give the input itself as the prompt")
    model = as_model(target, device, dtype)[0]
    check_pairing(DAG, m.name, (model, None))     # a hub id is known only once loaded
    known = {f.name for f in fields(DecodeConfig)}
    if set(params) - known:
        raise ValueError(f"dag methods do not take {sorted(set(params) - known)}; they take {sorted(known)}")
    # temperature 0 (greedy, every caller's default) is no sampling setting for a DAG: dag-sample
    # then draws at its decode config's temperature
    for name, v in (("temperature", temperature or None), ("top_k", top_k), ("top_p", top_p)):
        if v is not None:
            params[name] = v
    check_types(m.name, params, param_types(m))
    trace = run_dag(model, str(prompt), m.strategy, record=record, seed=seed, cfg=decode_config(model, **params))
    trace.guarantee = m.guarantee
    return Result(text=decode_text(model, trace.output_ids), ids=list(trace.output_ids), trace=trace)


def diffusion_baseline(model) -> str:
    """One token per step; on DiffusionGemma, its own sampler (the entropy-bounded noise canvas)."""
    return "dllm-entropy-bound" if is_dgemma(model) else "dllm-lowconf"


SPECULATIVE = register_engine(Engine(
    name="speculative", kind="causal", kind_is="a causal LM", decoders="ar, draft-model, prompt-lookup, suffix, ...",
    wrong_target="{target} is {its}: decode it with {use}, not {method!r}",
    run=generate, steps=STEPS["speculative"], verify=True, draft=True, batch=True, baseline=lambda model: "ar"))
DIFFUSION = register_engine(Engine(
    name="diffusion", kind="diffusion", kind_is="a masked-diffusion LM (bidirectional)",
    decoders="a dllm-* method (dllm-threshold, dllm-lowconf, ...)",
    wrong_target="{target} is not a masked-diffusion LM ({its}): {method} needs a diffusion model such as "
                 "code-dllm or digits-dllm; decode {target} with {use}",
    run=run_diffusion, steps=STEPS["diffusion"], check=check_dllm_params, baseline=diffusion_baseline))
DAG = register_engine(Engine(
    name="dag", kind="dag", kind_is="a DA-Transformer", decoders="a dag-* method (dag-viterbi, dag-greedy, ...)",
    wrong_target="{method} needs a DA-Transformer target (numwords-dat, dates-dat), not {target} ({its})",
    run=run_dag_method, steps=STEPS["dag"]))
SUPERPOSED = register_engine(Engine(
    name="superposed", kind="causal", kind_is="a causal LM", decoders="superposed, ar, draft-model, ...",
    wrong_target="{target} is {its}: {method} writes its drafts with a causal LM (Llama, Qwen2, ...); decode "
                 "{target} with {use}",
    run=run_superposed, steps=STEPS["superposed"], baseline=lambda model: "ar"))
