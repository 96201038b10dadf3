"""The method registry's types and lookups: a `Method` row and the `Draft` it needs, `register()`,
and what every caller asks of the rows (get_method, method_params, method_defaults, param_types,
build_drafter, paired_draft, guarantee, methods). The rows themselves are decoding/registry.py's,
which imports this module and re-exports every name here: callers import speclab.decoding.registry
(importing this module alone gives an empty table)."""
from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Callable

from speclab.decoding.guarantees import LOSSLESS, check, weakest
from speclab.decoding.speculative import Drafter
from speclab.scoped import scoped


@dataclass(frozen=True)
class Draft:
    """What a method's `draft` must be, and the zoo's own for a target given by name."""
    kind: str                       # "draft" (a draft LM), "eagle" (an EAGLE head), "medusa" (Medusa heads)
    what: str                       # how a message names it: "a draft model", "an EAGLE head"
    paired: dict = field(default_factory=dict)   # target zoo name -> the zoo's draft of this kind


# what a drafter's constructor parameter receives from the run: f(target_model, draft_model)
def the_target(target, draft):
    return target


def the_draft(target, draft):
    return draft


@dataclass(frozen=True, kw_only=True)
class Method:
    name: str
    family: str                     # autoregressive | speculative | self-speculative | model-free | ... | dag | diffusion
    engine: str                     # its Engine row's name (decoding/engines.py): speculative | diffusion | dag | ...
    guarantee: str                  # a key of decoding/guarantees.GUARANTEES, under the exact rule
    summary: str                    # what it does, naming its paper
    drafter: type | None = None     # speculative: the Drafter class; its constructor's parameters are the method's
    inputs: dict = field(default_factory=dict)   # constructor parameter -> f(target, draft): filled by the run
    draft: Draft | None = None      # the draft it needs (None: none)
    batchable: bool = False         # runs in a batch: its drafter sees only its own lane's text, logits and draft
    tree: bool = False              # drafts trees: its budget is a verify's row count
    adaptive: Callable | None = None   # the cost gate wraps it: takes `gate`; adaptive(params) -> gate="auto" turns it on
    aliases: dict = field(default_factory=dict)  # a parameter -> the constructor's name for it (suffix: k -> max_k)
    setup: Callable | None = None   # setup(params, ar) -> params, before the run; ar() decodes the prompt with `ar`
    sampling: bool = True           # takes the run's temperature (False: greedy only, or the method ignores it)
    config: type | None = None      # diffusion / dag: the dataclass whose fields are its parameters
    run_params: tuple = ()          # diffusion / dag: parameters of the run, before the config's
    strategy: str | None = None     # dag: the decoding strategy (decoding/dag.py DECODERS, or "all")
    rule: str = "exact"             # speculative: the acceptance rule a run takes unless it names one
    noise_canvas: bool = False      # diffusion: DiffusionGemma's sampler over a canvas of random tokens
    loop: Callable | None = None    # diffusion: the step loop that runs its policy (denoise, freedave)

    @property
    def lossless(self) -> bool:
        return self.guarantee in LOSSLESS

    @property
    def needs_draft(self) -> bool:
        return self.draft is not None

    @property
    def draft_kind(self) -> str | None:
        return self.draft.kind if self.draft else None


def gated(drafter, gate, adaptive: bool):
    """gate: "auto" (on for adaptive length policies, greedy decoding), True / "on" (also under
    sampling: a seed then no longer fixes the text), False / "off". See decoding/gate.py."""
    if gate not in ("auto", True, False, "on", "off"):
        raise ValueError(f"gate must be 'auto', 'on' or 'off', got {gate!r}")
    if gate in (True, "on") or gate == "auto" and adaptive:
        from speclab.decoding.gate import CostGate
        return CostGate(drafter, greedy_only=gate == "auto")
    return drafter


def constructor_params(cls) -> dict[str, inspect.Parameter]:
    """A class's constructor parameters by name, in order, following `**kw` into the base classes'
    constructors (DraftModelDrafter(draft, backend, vocab, **kw) takes ChainDrafter's k, ...)."""
    out: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        more = False
        for name, p in list(inspect.signature(init).parameters.items())[1:]:
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.kind is not p.VAR_POSITIONAL:
                out.setdefault(name, p)
        if not more:
            break
    return out


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method to the registry (a user's own drafter, a test's toy): the API, the CLI, the bench,
    batches and the dashboard's form see it at once. Its parameters are checked against its drafter."""
    if method.name in METHODS:
        raise ValueError(f"a method named {method.name!r} is already registered: unregister it first or pick "
                         "another name")
    check(f"method {method.name!r}", method.guarantee)
    # a method's parameters are its drafter's (a draft and a verify) or its config's (any other engine)
    if method.config is None and not (isinstance(method.drafter, type) and issubclass(method.drafter, Drafter)):
        raise ValueError(f"method {method.name!r}: drafter must be a Drafter subclass (or give a config dataclass "
                         f"for a method that drafts nothing), got {method.drafter!r}")
    if method.drafter is not None:
        missing = set(method.inputs) - set(constructor_params(method.drafter))
        bad = set(method.aliases.values()) - set(constructor_params(method.drafter))
        if missing or bad:
            raise ValueError(f"method {method.name!r}: {method.drafter.__name__} takes no "
                             f"{sorted(missing | bad)}; its parameters are {list(constructor_params(method.drafter))}")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    METHODS.pop(name, None)


def registered(method: Method):
    """`with registered(Method(...)):` the method exists inside the block only."""
    return scoped(register, unregister, method, method.name)


TARGET_AND_DRAFT = {"target_model": the_target, "draft": the_draft}
DRAFT = {"draft": the_draft}


def guarantee(method: str, rule: str | None = None) -> str:
    """What a run of `method` under acceptance `rule` (None: the method's own) keeps: the weaker of
    the method's and the rule's guarantees (a lossy rule makes any method lossy). A method whose
    drafts its own rule alone keeps lossless (tree-rsd) keeps nothing under another; a method that
    drafts nothing to verify (no drafter) keeps its own."""
    from speclab.decoding.rules import get_rule
    m = get_method(method)
    if m.drafter is None:
        return m.guarantee
    rule = rule or m.rule
    if rule != m.rule and m.rule != "exact":
        return "lossy"
    return weakest(m.guarantee, get_rule(rule).guarantee)


def get_method(name: str | Method) -> Method:
    """A method's row by name; a row passes through, so a caller that has looked it up hands the row
    to the helpers below (method_params, paired_draft, build_drafter) instead of its name."""
    if isinstance(name, Method):
        return name
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}")
    return METHODS[name]


def _knobs(m: Method) -> dict:
    """{parameter: default (None: unset)} of a method, in order."""
    if m.config is not None:
        out = {p: None for p in m.run_params}
        return out | {f.name: None if f.default is MISSING else f.default for f in fields(m.config)}
    if m.drafter is None:
        return {}
    out = {name: None if p.default is p.empty else p.default
           for name, p in constructor_params(m.drafter).items() if name not in m.inputs and name != "backend"}
    if m.adaptive is not None:
        out["gate"] = "auto"
    return out | {alias: None for alias in m.aliases}


def param_types(name: str | Method) -> dict:
    """{parameter: its declared type} of a method, for params.check_types: the annotations of its
    drafter's constructors (through `**kw` into the base classes, as constructor_params) or of its
    decode-config fields; an alias takes its parameter's type. A constructor whose annotations do
    not resolve is left out (its own checks apply)."""
    m = get_method(name)
    out: dict = {}
    if m.config is not None:
        out = typing.get_type_hints(m.config)
    elif m.drafter is not None:
        for klass in m.drafter.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            try:
                hints = typing.get_type_hints(init)
            except (NameError, TypeError):
                hints = {}
            for k, v in hints.items():
                out.setdefault(k, v)
            if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
                break
    return out | {alias: out[real] for alias, real in m.aliases.items() if real in out}


def method_params(name: str | Method) -> list[str]:
    return list(_knobs(get_method(name)))


def method_defaults(name: str) -> dict:
    """{parameter: default} of a method, read from where the defaults live (its drafter's constructor,
    its policy or decode-config dataclass), so a form shows the value that runs; None = unset."""
    return _knobs(get_method(name))


def build_drafter(name: str | Method, target, draft, params: dict, backend: str = "auto") -> Drafter:
    """A new drafter for one run of a speculative method: the constructor gets the caller's
    parameters (aliases resolved), what the row's `inputs` take from the run, and the run's backend;
    the cost gate wraps it when the row says so."""
    m = get_method(name)
    kw = {k: v for k, v in params.items() if k != "gate" and k not in m.aliases}
    for alias, real in m.aliases.items():
        if params.get(alias) is not None:
            kw[real] = params[alias]
    ctor = constructor_params(m.drafter)
    if "backend" in ctor:
        kw["backend"] = backend
    kw |= {p: fill(target, draft) for p, fill in m.inputs.items()}
    drafter = m.drafter(**kw)
    if m.adaptive is None:
        return drafter
    values = {n: p.default for n, p in ctor.items() if p.default is not p.empty} | kw
    return gated(drafter, params.get("gate", "auto"), m.adaptive(values))


def paired_draft(target, method: str | Method) -> str | None:
    """The zoo's draft for `method` on a target given by name (None if there is none, or none installed)."""
    from speclab.models.zoo import zoo_path
    m = get_method(method)
    name = target if isinstance(target, str) else getattr(target[0], "name_or_path", None)
    d = m.draft.paired.get(str(name)) if m.draft else None
    return d if d and zoo_path(d) is not None else None


def batch_methods() -> list[str]:
    return [m.name for m in METHODS.values() if m.batchable]


# parameters that pass what the caller owns, not a setting: an object whose state outlives one
# request (history), or data (the oracle's reference: by default ar's output, which a greedy run's
# own output repeats). A run reads them, but they are neither recorded in a trace nor shown as a knob
OWNED_PARAMS = ("history", "reference")


def recorded_params(params: dict) -> dict:
    """The method parameters a trace records: everything but the caller-owned objects."""
    return {k: v for k, v in params.items() if k not in OWNED_PARAMS}


def methods() -> list[dict]:
    """One row per method: name, family, engine, guarantee, lossless, needs_draft, batchable, tree,
    params, summary."""
    return [dict(name=m.name, family=m.family, engine=m.engine, guarantee=m.guarantee, lossless=m.lossless,
                 needs_draft=m.needs_draft,
                 batchable=m.batchable, tree=m.tree, params=method_params(m.name), summary=m.summary)
            for m in METHODS.values()]
