"""The draft/verify engine. One round, read top to bottom:

    propose   the drafter offers a DraftTree (a chain is a tree of width one)
    verify    ONE target forward over the pending tokens and every draft node (tree attention)
    accept    walk the tree with the acceptance rule (greedy match or recursive rejection)
    commit    the target cache keeps only the accepted path; the drafter observes the outcome
    record    a Round for the trace (how much depends on the recording level)

The plain autoregressive decoder is this loop with a drafter that proposes nothing.
The engine's seam is `run(...) -> Trace` (`decode` plus the trace of what ran); speclab.run calls it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from speclab.decoding.acceptance import Sampler, greedy_ids, walk_tree, warp
from speclab.decoding.rules import get_rule
from speclab.decoding.rules import rule_params as resolve_rule_params
from speclab.decoding.tree import DraftTree
from speclab.models.geometry import is_chain
from speclab.models.loading import token_table
from speclab.models.protocol import TargetLM
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED, Decision, DraftNode, Round, Sampling, Totals, Trace

TOPK_RECORD = 5


@dataclass
class Context:
    """What has been committed so far. The target cache holds ids[:-pending]."""
    ids: list[int]                      # prompt + new tokens (host copy: model-free drafters read it)
    n_prompt: int
    pending: int                        # tail tokens not yet run through the target
    device: torch.device


@dataclass
class Outcome:
    """What one verify decided, for drafters to learn from (observe) and for the record."""
    tree: DraftTree
    path: list[int]                     # accepted node ids, in order
    emitted: int
    prefix_len: int                     # committed tokens before this round
    logits: torch.Tensor                # (P+N - logits_from, V) target logits at inputs[logits_from:]
    inputs: list[int]                   # the P+N tokens that forward ran on
    n_pending: int
    logits_from: int = 0                # P - 1 unless the drafter reads every row (Drafter.all_rows)

    @property
    def accepted_tokens(self) -> list[int]:
        return [self.tree.tokens[i] for i in self.path]

    def logits_at(self, rows: list[int]) -> torch.Tensor:
        """(len(rows), V) the target's logits after the inputs at `rows` (indices into inputs)."""
        return self.logits[[r - self.logits_from for r in rows]]


class Drafter:
    """The slot every drafting method fills. A chain is a tree of width one.

    The contract, per run (`decode` calls these in this order):
      begin(ctx, target, sampler, gen, record)  once, before the first round: reset per-request
            state. `gen` is the run's one seeded generator: draw every random number from it.
      propose(ctx) -> DraftTree   once per round: the draft nodes (tokens, parents, q per node,
            or q = None for a point-mass draft) for the target to verify after ctx.ids. It may run
            its own model, or the target's early layers on the shared cache, but it must leave the
            target's cache as it found it: `target.length` unchanged (asserted in every round).
            It must not change ctx.
      observe(outcome)            once per round, after the target's cache kept the accepted path:
            learn from what was accepted (online state: suffix index, recycling matrix, length).
      end()                       once, after the last round: release hooks; hand what outlives
            the request to an object its caller owns (never to a module or class attribute).
      forwards                    the draft model calls made so far (0 for model-free drafters).
      all_rows                    observe reads the target's logits after every input token: the
            prompt's too in the first round. Otherwise the verify scores only the last pending
            token and the draft nodes, the rows acceptance reads (a prompt's rows are most of a
            prefill's LM-head work).
    Optional capabilities, declared here with their defaults and read by the engine:
      decode_loop                 None, or a method decode_loop(target, prompt_ids, max_new_tokens,
            sampler, seed, record, eos_id, progress, rule) -> (new ids, rounds, totals) that runs
            in place of the rounds (PEARL drafts beside the verify in its own loop)
      lanes                       timing lanes of work that overlapped, for the trace (PEARL's)
    """
    name = "none"
    all_rows = False
    decode_loop: Callable | None = None
    lanes: tuple = ()

    def __init__(self):
        self.forwards = 0               # draft model calls (0 for model-free drafters)

    def begin(self, ctx: Context, target: TargetLM, sampler: Sampler, gen: torch.Generator,
              record: str | None = "light"):
        self.target, self.sampler, self.gen, self.record = target, sampler, gen, record

    def end(self) -> None:
        pass

    def propose(self, ctx: Context) -> DraftTree:
        return DraftTree()

    def observe(self, out: Outcome) -> None:
        pass


def forwards_of(attr: str) -> property:
    """`forwards = forwards_of("lm")` in a drafter's class: its draft calls are those of the object it
    drafts with, self.<attr> (0 before it is made); Drafter.__init__'s reset to 0 is ignored."""
    return property(lambda self: getattr(self, attr).forwards if hasattr(self, attr) else 0,
                    lambda self, v: None)


@dataclass
class RunState:
    target: TargetLM
    drafter: Drafter
    sampler: Sampler
    gen: torch.Generator
    record: str | None
    vocab_size: int
    walk: Callable = walk_tree          # the acceptance rule's verify (decoding/rules)
    rule: str = "exact"                 # its name
    hidden_layer: int = 0               # > 0: the rule reads the target's state after this layer (h_at)
    totals: Totals = field(default_factory=Totals)


def speculative_round(s: RunState, ctx: Context) -> tuple[Round, list[int]]:
    """One draft/verify round. Returns its record and the committed tokens (path + emitted)."""
    t0 = time.perf_counter()
    base = s.target.length
    tree = s.drafter.propose(ctx)                                                   # 1. propose
    assert s.target.length == base, (f"{type(s.drafter).__name__}.propose changed the target cache "
                                     f"({base} -> {s.target.length} positions): a drafter must leave it as it was")
    tree.validate(s.vocab_size)
    t1 = time.perf_counter()
    pending = ctx.ids[len(ctx.ids) - ctx.pending:]
    inputs = pending + tree.tokens
    ids_at = "cpu" if getattr(s.target, "host_ids", False) else ctx.device          # a static runner stages them
    if s.hidden_layer and s.hidden_layer not in s.target.capture_layers:            # the rule reads h_at
        s.target.capture_layers = (*s.target.capture_layers, s.hidden_layer)
    logits = s.target.forward(torch.tensor(inputs, device=ids_at),                   # 2. verify
                              parents=tree.parents, n_prefix=len(pending),          # (1+N, V) or
                              logits_to_keep=0 if s.drafter.all_rows else 1 + len(tree))  # (P+N, V)
    first = len(inputs) - len(logits)                                               # logits[0]'s input row
    rows = logits[len(pending) - 1 - first:]                                        # (1+N, V)
    top = greedy_ids(rows).tolist() if s.sampler.greedy else None   # one host transfer per round
    h_at = None
    if s.hidden_layer:                                  # draft node i sits at input row len(pending) + i
        hidden = s.target.captured[s.hidden_layer][0]
        h_at = lambda node: hidden[len(pending) + node]
    (path, emitted, dist, tries), p_at = accept(s, tree, rows, top, h_at)           # 3. accept
    s.target.keep_positions(base + len(pending), path)                              # 4. commit
    out = Outcome(tree, path, emitted, len(ctx.ids) - ctx.pending + len(pending), logits, inputs, len(pending), first)
    t2 = time.perf_counter()
    s.drafter.observe(out)
    t3 = time.perf_counter()
    rnd = record_round(s, out, tries, dist, p_at)                                   # 5. record
    rnd.draft_s, rnd.verify_s = (t1 - t0) + (t3 - t2), t2 - t1
    return rnd, out.accepted_tokens + [emitted]


def accept(s: RunState, tree: DraftTree, rows: torch.Tensor, top: list[int] | None, h_at=None):
    """The acceptance rule on one verify's rows (1+N, V): rows[0] holds the target after the last
    pending token, rows[1+i] after draft node i; top: their argmax (greedy only); h_at: node -> the
    target's state at it, for a rule that reads it (rules/base.py). Returns
    walk_tree's (path, emitted, dist, tries) and p_at (node -> its parent's row), for the record."""
    p_at = lambda node: rows[node + 1]                   # node -1: the root, row 0
    argmax_at = (lambda node: top[node + 1]) if top is not None else None
    draw = lambda: torch.rand((), generator=s.gen, device=s.gen.device).item()
    extra = {} if h_at is None else {"h_at": h_at}
    return s.walk(tree.children(), tree.tokens, tree.q_map(), p_at, s.sampler, s.gen, draw, argmax_at, **extra), p_at


def record_round(s: RunState, out: Outcome, tries, dist, p_at) -> Round:
    tree = out.tree
    kind = "target" if not len(tree) else ("bonus" if out.path and not tree.children().get(out.path[-1]) else "correction")
    rnd = Round(accepted=list(out.path), path_tokens=out.accepted_tokens, emitted=out.emitted,
                emitted_kind=kind, drafted=len(tree), info=dict(tree.info))
    if s.record is None and len(tree) and not is_chain(tree.parents):
        rnd.info["depth"] = max(tree.depths())   # per-position acceptance of a tree needs its depth
    if s.record is not None:        # the drafter's own (ADED's explore / exploit, SWIFT's search), drafted or not
        rnd.decisions.extend(tree.decisions)
    if s.record is None or not len(tree):
        return rnd
    full = s.record == "full"
    rule = s.rule if s.rule != "exact" else \
        "greedy" if s.sampler.greedy else ("point-mass" if not tree.q_map() else "spec-sampling")
    probs = {}  # node's parent -> target probs there (softmax of logits; warped when sampling)
    for i, par in enumerate(tree.parents):
        if par not in probs:
            lg = p_at(par)
            probs[par] = lg.float().softmax(-1) if s.sampler.greedy else warp(lg, s.sampler)
    depths, qmap = tree.depths(), tree.q_map()
    order = {t.node: (k, t) for k, t in enumerate(tries)}
    for i, tok in enumerate(tree.tokens):
        par = tree.parents[i]
        k_t = order.get(i)
        node = DraftNode(id=i, parent=par, token=tok, depth=depths[i], q=tree.q_tok[i], source=tree.source[i],
                         p=float(probs[par][tok]), rule=rule,
                         decision=NOT_REACHED if k_t is None else (ACCEPTED if k_t[1].accepted else REJECTED),
                         u=None if k_t is None else k_t[1].u, try_order=None if k_t is None else k_t[0])
        if k_t is not None and not s.sampler.greedy:
            node.p = k_t[1].p_x   # the p the rule tested: later siblings see the residual
        if k_t is not None and k_t[1].exact is not None:   # a rule beside exact: both verdicts, its decision
            t = k_t[1]
            node.verdicts = {s.rule: node.decision, "exact": ACCEPTED if t.exact else REJECTED}
            rnd.decisions.append(Decision(s.rule, dict(t.inputs or {}), t.threshold, node.decision, at=i))
        if full:
            node.p_topk = _topk(probs[par])
            if par in qmap:
                node.q_topk = _topk(qmap[par])
        rnd.nodes.append(node)
    if full and dist is not None:
        rnd.residual_topk = _topk(dist)
    return rnd


def _topk(dist: torch.Tensor, k: int = TOPK_RECORD) -> list[list[float]]:
    v, i = dist.float().topk(k)
    return [[int(a), round(float(b), 6)] for a, b in zip(i.tolist(), v.tolist())]


def commit_round(s, ctx: Context, rnd: Round, committed: list[int], new: list[int], rounds: list[Round],
                 max_new_tokens: int, eos_id: int | None, progress=None) -> list[int]:
    """Book one verified round: the tokens kept (cut at max_new_tokens and after EOS) go to `new`,
    every committed token to the context, the round to `rounds`, its counts to s.totals, and how
    many were kept to `progress(n)` where given."""
    keep = committed[: max_new_tokens - len(new)]
    if eos_id is not None and eos_id in keep:
        keep = keep[: keep.index(eos_id) + 1]
    rnd.kept = len(keep)
    new += keep
    ctx.ids += committed
    ctx.pending = 1
    rounds.append(rnd)
    tot = s.totals
    tot.drafted += rnd.drafted
    tot.accepted += len(rnd.accepted)
    tot.draft_s += rnd.draft_s
    tot.verify_s += rnd.verify_s
    if progress is not None:
        progress(len(keep))
    return keep


def own_rounds(s, ctx: Context, one_round: Callable, lm, max_new_tokens: int, eos_id: int | None, progress=None,
               end: Callable | None = None, f0: int | None = None):
    """The loop of a drafter whose rounds are its own (ppd's verify with prompt rows, lud's forward of
    units): `one_round(rounds)` -> (round, committed tokens), booked by commit_round until
    max_new_tokens or EOS; `end()` however it stops. -> (new ids, rounds, totals), the forwards
    counted on `lm` since `f0` (default: from the loop's start; no draft forward)."""
    f0, rounds, new = lm.forwards if f0 is None else f0, [], []
    t0 = time.perf_counter()
    try:
        while len(new) < max_new_tokens:
            rnd, committed = one_round(rounds)
            keep = commit_round(s, ctx, rnd, committed, new, rounds, max_new_tokens, eos_id, progress)
            if eos_id is not None and keep and keep[-1] == eos_id:
                break
    finally:
        if end is not None:
            end()
    tot = s.totals
    tot.wall_s = time.perf_counter() - t0
    tot.target_forwards, tot.draft_forwards, tot.new_tokens = lm.forwards - f0, 0, len(new)
    return new, rounds, tot


def decode(target: TargetLM, drafter: Drafter, prompt_ids: list[int], max_new_tokens: int,
           sampler: Sampler, seed: int = 0, record: str | None = "light", eos_id: int | None = None,
           progress=None, rule: str = "exact", rule_params: dict | None = None, model=None):
    """Run rounds until max_new_tokens or EOS under acceptance `rule` (its parameters; model: the
    target's transformers model, for a rule that reads its weights). Returns (new ids, rounds, totals).
    A drafter with its own loop (`decode_loop`: PEARL drafts beside the verify) runs that instead."""
    if drafter.decode_loop is not None:
        return drafter.decode_loop(target, prompt_ids, max_new_tokens, sampler, seed, record, eos_id, progress, rule)
    dev = target.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    target.reset()
    t_forwards0 = target.forwards
    ctx = Context(list(prompt_ids), len(prompt_ids), len(prompt_ids), dev)
    row = get_rule(rule)
    walk = row.make(resolve_rule_params(rule, rule_params), model)
    s = RunState(target, drafter, sampler, gen, record, target.config.vocab_size, walk, rule,
                 target.config.num_hidden_layers if row.reads_hidden else 0)
    captures = target.capture_layers
    drafter.begin(ctx, target, sampler, gen, record)
    d_forwards0 = drafter.forwards
    rounds, new = [], []
    t0 = time.perf_counter()
    try:                # a run stopped mid-way (a cancel from its page, an error) leaves the target as it found it
        while len(new) < max_new_tokens:
            if rounds and on_device_loop(s):
                device_loop(s, ctx, new, rounds, max_new_tokens, eos_id, progress)
                break
            rnd, committed = speculative_round(s, ctx)
            keep = commit_round(s, ctx, rnd, committed, new, rounds, max_new_tokens, eos_id, progress)
            if eos_id is not None and keep and keep[-1] == eos_id:
                break
    finally:
        drafter.end()
        if s.hidden_layer:
            target.capture_layers = captures
    tot = s.totals
    tot.wall_s = time.perf_counter() - t0
    tot.target_forwards = target.forwards - t_forwards0
    tot.draft_forwards = drafter.forwards - d_forwards0
    tot.new_tokens = len(new)
    return new, rounds, tot


def on_device_loop(s: RunState) -> bool:
    """Plain greedy `ar` on a runner that keeps the token on the device (the static runner's
    greedy_run): every round after the prompt's is one step of the device's own loop. A drafter
    subclass, a sampler, a rule other than exact or a rule reading hidden states keep the host loop."""
    return (type(s.drafter) is Drafter and s.sampler.greedy and s.rule == "exact" and not s.hidden_layer
            and hasattr(s.target, "greedy_run"))


def device_loop(s: RunState, ctx: Context, new: list[int], rounds: list[Round], max_new_tokens: int,
                eos_id: int | None, progress=None):
    """The rest of a greedy `ar` run as the target's greedy_run: one Round per token, as the host
    loop records it (the token emitted by the target, nothing drafted), its verify_s the time
    between two tokens' arrival on the host (the device runs a step ahead of the host)."""
    assert ctx.pending == 1
    tick = (lambda t: progress(1)) if progress is not None else None
    t_prev = time.perf_counter()
    toks, times = s.target.greedy_run(ctx.ids[-1], max_new_tokens - len(new), eos_id, tick)
    for tok, t in zip(toks, times):
        rnd = Round(accepted=[], path_tokens=[], emitted=tok, emitted_kind="target", drafted=0)
        rnd.draft_s, rnd.verify_s, t_prev = 0.0, t - t_prev, t
        commit_round(s, ctx, rnd, [tok], new, rounds, max_new_tokens, eos_id)


def trace_of(tok, method: str, params: dict, models: dict, sampler: Sampler, seed: int, record: str | None,
             prompt_ids: list[int], new: list[int], rounds: list[Round], totals: Totals) -> Trace:
    """The Trace of one speculative run (or one lane of a batch): what ran, with the text of every
    token it mentions (prompt, output, draft nodes, emitted tokens, recorded top-k candidates)."""
    trace = Trace(engine="speculative", method=method, params=params, models=models,
                  sampling=Sampling(sampler.temperature, sampler.top_k, sampler.top_p, seed), record=record,
                  prompt_ids=prompt_ids, output_ids=new, totals=totals, rounds=rounds)
    trace.token_text = token_table(tok, trace.mentioned_ids())
    return trace


def run(target: TargetLM, drafter: Drafter, tok, prompt_ids: list[int], max_new_tokens: int, sampler: Sampler,
        seed: int, record: str | None, method: str, params: dict, models: dict, progress=None,
        rule: str = "exact", rule_params: dict | None = None, model=None) -> Trace:
    """The speculative engine's seam: decode `prompt_ids` and return the trace (params: the method's
    recorded parameters; models: model_info of each role; rule: the acceptance rule, recorded with
    its parameters where it is not `exact`)."""
    new, rounds, totals = decode(target, drafter, prompt_ids, max_new_tokens, sampler, seed, record,
                                 tok.eos_token_id, progress, rule, rule_params, model)
    params = dict(params, backend=type(target).__name__)
    if rule != "exact":
        params.update(rule=rule, rule_params=resolve_rule_params(rule, rule_params))
    models = with_runners(models, target, getattr(getattr(drafter, "inner", drafter), "lm", None))
    trace = trace_of(tok, method, params, models, sampler, seed, record, prompt_ids, new, rounds, totals)
    trace.lanes = list(drafter.lanes)       # timing lanes of a drafter that overlaps (PEARL)
    return trace


def with_runners(models: dict, target, draft_lm=None) -> dict:
    """`models` with, per role, the forward that ran it and whether CUDA graphs replayed it (a
    static-shape runner counts its replays)."""
    out = dict(models)
    for role, lm in (("target", target), ("draft", draft_lm)):
        if lm is not None and role in out:
            out[role] = replace(out[role], backend=type(lm).__name__, graphs=getattr(lm, "replays", 0) > 0,
                                kernel=kernel_of(lm))
    return out


def kernel_of(lm) -> str | None:
    """The CPU kernel path a lean forward ran on (models.kernels: avx2, avx512, ...), None off it."""
    if getattr(lm, "layout", None) != "packed":
        return None
    from speclab.models import kernels
    return kernels.path()
