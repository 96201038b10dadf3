"""Acceptance rules by name, one row each: how a verify's target distributions judge a draft tree.

A rule is a TENSOR TEST over a batch of candidates (decoding/acceptance.py has the contract):

    test(p, q, x, u, params, given) -> (accepted (B,), residual (B, V), record)

plus `prepare(params, model)`, which checks the parameters and returns what the test reads (a
neighbour table, a probe), and a path only where it differs from the first accepted sibling
(typical's "longest"). The walk of the tree is shared (acceptance.walk): its host form writes the
trace's records, its batched form serves decoding/batch.py (each lane's candidates in one test).
A rule with a path of its own (K-SEQ's chains) gives its whole walk as `make` and has no batched
form; so does a rule given only as `make` (a user's own, a test's).

`make(params, model)` returns the host walk of one verify (derived from the test where the rule
gives one), shaped like `walk_tree` (model: the target's transformers model, for rules that read
its weights):

    walk(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at, h_at=None) -> (path, emitted, dist, tries)

children: node -> its children in try order; tokens: node -> token; q_at: node -> the draft
distribution (V,) its children were sampled from (absent: point-mass children); p_at(node) -> the
target's logits (V,) after that node (-1: after the committed prefix); draw() -> a uniform float
from the run's generator; argmax_at(node) -> the target's greedy token there, precomputed. It
returns the accepted node path, the token the target emits after it, the distribution that token
came from (None where it is the target's argmax) and every sibling tried, in order (each a
`Tried`). For a lossy rule the walk fills each Tried's `exact` (what the exact rule would have
decided there, with the same uniform draw) and the test's `inputs` and `threshold`: the trace keeps
both verdicts per node and one policy decision per test, so views show the tokens it rescued.

A rule with `reads_hidden` is also handed h_at(node) -> (C,): the target's state after its last layer
(pre-norm) at draft node `node`'s own position, from the same verify (the engine asks the target to
capture that layer); a method whose loop cannot give it gets none, and the walk says so in one line.

A rule may also give `induced(p, q, params, model=None) -> (dist, slack)`: the law of the FIRST
token a round emits when the root holds a single candidate x ~ q (q: the draft's distribution,
one-hot for a point-mass draft; None: nothing was drafted), under the target's warped distribution
p (V,), with slack an upper bound on TV(dist, the exact law) where the rule approximates (0 where
exact). The bench's quality columns take TV(dist, p) from it, round by round; a rule without the
hook gets no TV there (None), and a lossless rule needs none (its law is p).

The row says what the rule guarantees (decoding/guarantees.py), whether it needs the draft's
distribution q (a point-mass drafter cannot feed it), whether it has a greedy form, its parameters
with their defaults, and the paper it comes from. `exact` (rules/exact.py) is the default of every
run; `register_rule` adds one at run time, as `registry.register` adds a method.
"""
from __future__ import annotations

from functools import partial
from dataclasses import dataclass, field
from typing import Callable

from speclab.decoding.acceptance import Form, Verify, walk
from speclab.decoding.guarantees import check
from speclab.scoped import lookup, scoped

SHARED_PATHS = ("first", "longest")     # the paths acceptance.walk knows


@dataclass(frozen=True, kw_only=True)
class Rule:
    name: str
    guarantee: str                  # a key of decoding/registry.GUARANTEES
    summary: str                    # what it does, naming its paper
    make: Callable | None = None    # make(params, model) -> host walk; None: derived from `test`
    test: Callable | None = None    # test(p, q, x, u, params, given): the tensor test (acceptance.py)
    prepare: Callable | None = None  # prepare(params, model) -> what the test reads as params (checked)
    path: str = "first"             # "first" / "longest" (the shared walk's), or a name of its own walk
    without_replacement: bool = False  # siblings drawn without replacement: q renormalised per sibling (RSD)
    reads: tuple = ()               # what its test reads of the verify besides p, q, x, u: "top", "soft"
    needs_q: bool = False           # reads q(x): refuses point-mass drafts (prompt lookup, a greedy tree)
    greedy: bool = True             # has a greedy (temperature 0) form
    params: dict = field(default_factory=dict)     # parameter -> default
    only_for: tuple = ()            # the methods whose drafts it is built for (empty: any method)
    induced: Callable | None = None  # induced(p, q, params, model=None) -> (first-token law, slack): see above
    reads_hidden: bool = False      # its walk takes h_at(node): the target's last-layer state at that node

    def __post_init__(self):
        if self.make is None:
            if self.test is None or self.path not in SHARED_PATHS:
                raise ValueError(f"rule {self.name!r} needs a tensor test on a shared path ({', '.join(SHARED_PATHS)}) "
                                 "or a walk of its own (make=)")
            object.__setattr__(self, "make", partial(Rule.host_walk, self))

    @property
    def form(self) -> Form:
        """What the shared walk needs of this rule."""
        return Form(self.name, self.test, self.path, self.without_replacement,
                    tuple(self.reads) + (("h",) if self.reads_hidden else ()), self.guarantee == "lossy")

    def prepared(self, params: dict, model=None):
        """The parameters its test reads (checked; tables and probes loaded once per run)."""
        return self.prepare(params, model) if self.prepare is not None else params

    def host_walk(self, params: dict, model=None):
        """The shared walk over one verify, shaped as the module's docstring says."""
        form, ready = self.form, self.prepared(params, model)

        def walk_one(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at=None, h_at=None):
            return walk(form, ready, [Verify(children, tokens, q_at, p_at, gen, draw, argmax_at, h_at)], sampler)[0]
        return walk_one

    def batch_refusal(self) -> str | None:
        """None where decoding/batch.py can verify with this rule, else the one-line reason."""
        if self.test is None or self.path not in SHARED_PATHS:
            return (f"rule {self.name!r} has no tensor form on the shared walk, so it verifies one prompt at a time: "
                    f"decode the prompts one by one, or batch with {', '.join(batch_rules())}")
        if self.reads_hidden:
            return (f"rule {self.name!r} reads the target's hidden state, which a batch verify does not capture: "
                    "decode the prompts one by one")
        return None


RULES: dict[str, Rule] = {}


def register_rule(rule: Rule) -> Rule:
    """Add an acceptance rule (a user's own, a test's); its name must be new."""
    if rule.name in RULES:
        raise ValueError(f"a rule named {rule.name!r} is already registered: unregister it first or pick another name")
    check(f"rule {rule.name!r}", rule.guarantee)
    RULES[rule.name] = rule
    return rule


def unregister_rule(name: str) -> None:
    if name != "exact":
        RULES.pop(name, None)


def registered_rule(rule: Rule):
    """`with registered_rule(Rule(...)):` the rule exists inside the block only."""
    return scoped(register_rule, unregister_rule, rule, rule.name)


def get_rule(name: str) -> Rule:
    return lookup(RULES, name, "acceptance rule", "rules")


def rule_params(name: str, params: dict | None) -> dict:
    """The rule's parameters: its defaults, overridden by `params`; an unknown one is refused."""
    rule = get_rule(name)
    unknown = set(params or {}) - set(rule.params)
    if unknown:
        raise ValueError(f"rule {name!r} does not take {sorted(unknown)}; it takes "
                         f"{', '.join(rule.params) or 'no parameters'}")
    return dict(rule.params, **(params or {}))


def check_run(name: str, greedy: bool, point_mass: bool | None = None, method: str | None = None) -> None:
    """One line where a rule cannot serve the run: no greedy form at temperature 0, a rule that
    reads q over a drafter whose drafts carry none (point_mass: None = not known yet), or a rule
    built for other methods' drafts."""
    rule = get_rule(name)
    if method is not None and rule.only_for and method not in rule.only_for:
        raise ValueError(f"rule {name!r} verifies the drafts of {', '.join(rule.only_for)} only, not {method!r}: "
                         "use rule='exact'")
    if greedy and not rule.greedy:
        raise ValueError(f"rule {name!r} has no greedy form (at temperature 0 it would equal 'exact'): "
                         "sample with a temperature > 0, or use rule='exact'")
    if point_mass and rule.needs_q:
        raise ValueError(f"rule {name!r} reads the draft's distribution q, and this drafter's drafts are point "
                         "masses (no q): use a drafter that samples its drafts, or rule='exact'")


def total_variation(a, b) -> float:
    """TV(a, b) = 1/2 sum |a - b| of two distributions over the same vocabulary, in fp64."""
    return 0.5 * float((a.double() - b.double()).abs().sum())


def batch_rules() -> list[str]:
    """The rules decoding/batch.py verifies with."""
    return [r.name for r in RULES.values() if r.test is not None and r.path in SHARED_PATHS and not r.reads_hidden]


def rules() -> list[dict]:
    """One row per rule: name, guarantee, needs_q, greedy, params, summary."""
    return [dict(name=r.name, guarantee=r.guarantee, needs_q=r.needs_q, greedy=r.greedy, params=dict(r.params),
                 only_for=list(r.only_for), summary=r.summary) for r in RULES.values()]
