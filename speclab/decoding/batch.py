"""Batch > 1: lossless speculative decoding of B sequences at once. One round, read top to bottom:

    propose   every active lane's OWN drafter offers a DraftTree (drafters keep per-request state)
    verify    ONE target forward for the whole batch: lane b's pending tokens and draft nodes,
              padded to the longest lane; positions = lane b's own committed length (+ depth for
              tree nodes); a 4-D mask so each row sees only its lane's committed keys and, for a
              draft node, its own ancestors (models/backends.py: make_batch_lm)
    accept    the run's acceptance rule over every lane at once (acceptance.walk, its batched form:
              each test takes one candidate of every live lane; each lane draws from its own
              generator in the order its run alone does, so a lane is its run alone, bit for bit)
    commit    per lane: the batch cache keeps its pending tokens and accepted path; its drafter observes
    record    per lane: a Round of the lane's own trace

Lanes that finish (EOS or max_new_tokens) leave the batch: no more rows in the forward, no more
drafting. Drafters run per lane (a draft model runs once per lane and round: batching the draft
forwards too is the next step). Methods whose drafter runs the target itself (layer-skip, eagle,
eagle-chain, medusa: they share its cache or hidden states) are not supported in a batch yet.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclab.decoding.acceptance import Sampler, Verify, greedy_ids, walk
from speclab.decoding.registry import batch_methods, get_method
from speclab.decoding.rules import get_rule
from speclab.decoding.rules import rule_params as resolve_rule_params
from speclab.decoding.speculative import (Context, Drafter, Outcome, RunState, commit_round, record_round, trace_of,
                                         with_runners)
from speclab.models.backends import make_batch_lm
from speclab.models.geometry import BatchSlots
from speclab.trace import Round, Totals, Trace



class LaneTarget:
    """What a lane's drafter sees of the batch target: its config and device, never its cache."""

    def __init__(self, lm: BatchSlots):
        self.config, self.device = lm.config, lm.device


@dataclass
class Lane:
    """One sequence of the batch: its own context, drafter, generator, rounds and totals."""
    ctx: Context
    s: RunState                         # lane target view, drafter, sampler, gen, record, totals
    new: list[int] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)


def batch_round(lm: BatchSlots, lanes: list[Lane], form=None, params=None) -> list[tuple[Round, list[int]]]:
    """One draft/verify round for every active lane (lanes[b] is cache row b) under the rule `form`
    (acceptance.Form; None: exact) reading `params`. Returns, per lane, its record and the
    committed tokens (path + emitted)."""
    form = form or get_rule("exact").form
    trees, draft_s = [], []
    for lane in lanes:                                                              # 1. propose
        t = time.perf_counter()
        tree = lane.s.drafter.propose(lane.ctx)
        tree.validate(lane.s.vocab_size)
        trees.append(tree)
        draft_s.append(time.perf_counter() - t)
    t1 = time.perf_counter()
    pending = [lane.ctx.ids[len(lane.ctx.ids) - lane.ctx.pending:] for lane in lanes]
    to_keep = [0 if lane.s.drafter.all_rows else 1 + len(tree) for lane, tree in zip(lanes, trees)]
    logits = lm.forward([(p + tree.tokens, tree.parents, len(p))                   # 2. verify
                         for p, tree in zip(pending, trees)], to_keep)              # (B, T, V)
    sampler = lanes[0].s.sampler
    top = greedy_ids(logits).tolist() if sampler.greedy else None   # one host transfer per round, whole batch
    verify_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    rows, verifies = [], []
    for b, (lane, tree, pend) in enumerate(zip(lanes, trees, pending)):
        k = to_keep[b] or len(pend) + len(tree)     # this lane's rows: after its last k inputs
        rows.append(logits[b, :k])                                                  # (k, V)
        own = rows[b][k - 1 - len(tree):]           # (1+N, V): after the last pending token, then per node
        gen = lane.s.gen
        verifies.append(Verify(tree.children(), tree.tokens, tree.q_map(), lambda node, own=own: own[node + 1], gen,
                               lambda gen=gen: torch.rand((), generator=gen, device=gen.device).item(),
                               (lambda node, t=top[b][k - 1 - len(tree): k]: t[node + 1]) if top is not None else None))
    walked = walk(form, params, verifies, sampler)                                  # 3. accept, every lane
    accept_s = (time.perf_counter() - t2) / len(lanes)
    results = []
    for b, (lane, tree, pend, (path, emitted, dist, tries)) in enumerate(zip(lanes, trees, pending, walked)):
        t2 = time.perf_counter()
        s, P, k = lane.s, len(pend), len(rows[b])
        lm.keep(b, P, path)                                                         # 4. commit
        out = Outcome(tree, path, emitted, len(lane.ctx.ids), rows[b], pend + tree.tokens, P, P + len(tree) - k)
        t3 = time.perf_counter()
        s.drafter.observe(out)
        t4 = time.perf_counter()
        rnd = record_round(s, out, tries, dist, verifies[b].p_at)                   # 5. record
        rnd.draft_s, rnd.verify_s = draft_s[b] + (t4 - t3), verify_s + accept_s + (t3 - t2)
        results.append((rnd, out.accepted_tokens + [emitted]))
    return results


def decode_batch(model, drafters: list[Drafter], prompts_ids: list[list[int]], max_new_tokens: int,
                 sampler: Sampler, seeds: list[int], record: str | None = "light", eos_id: int | None = None,
                 progress=None, backend: str = "auto", rule: str = "exact",
                 rule_params: dict | None = None) -> tuple[list[tuple[list[int], list[Round], Totals]], BatchSlots]:
    """Run rounds until every lane reached max_new_tokens or EOS, verifying with acceptance `rule`
    (its parameters). Returns, per prompt in order, (new ids, rounds, totals), and the batch LM
    (its `forwards` = batch forwards run)."""
    row = get_rule(rule)
    why = row.batch_refusal()
    if why:
        raise ValueError(why)
    form, params = row.form, row.prepared(resolve_rule_params(rule, rule_params), model)
    lm = make_batch_lm(model, len(prompts_ids), backend)
    view, dev = LaneTarget(lm), lm.device
    lanes = []
    for ids, drafter, seed in zip(prompts_ids, drafters, seeds):
        gen = torch.Generator(device=dev).manual_seed(seed)
        ctx = Context(list(ids), len(ids), len(ids), dev)
        lanes.append(Lane(ctx, RunState(view, drafter, sampler, gen, record, model.config.vocab_size, rule=rule)))
        drafter.begin(ctx, view, sampler, gen, record)
    d_forwards0 = [lane.s.drafter.forwards for lane in lanes]
    active = list(lanes)
    t0 = time.perf_counter()
    while active:
        for lane, (rnd, committed) in zip(active, batch_round(lm, active, form, params)):
            commit_round(lane.s, lane.ctx, rnd, committed, lane.new, lane.rounds, max_new_tokens, eos_id, progress)
        done = [len(ln.new) >= max_new_tokens or (eos_id is not None and ln.new[-1:] == [eos_id]) for ln in active]
        if any(done):                                       # finished lanes leave the batch
            for lane in (ln for ln, d in zip(active, done) if d):
                lane.s.drafter.end()
            rows = [b for b, d in enumerate(done) if not d]
            active = [active[b] for b in rows]
            if rows:
                lm.retain(rows)
        if active and lm.crowded():
            lm.compact()
    wall = time.perf_counter() - t0
    out = []
    for lane, d0 in zip(lanes, d_forwards0):
        tot = lane.s.totals
        tot.wall_s = wall                                   # the batch's wall time: lanes ran together
        tot.target_forwards = len(lane.rounds)              # the batch forwards this lane took part in
        tot.draft_forwards = lane.s.drafter.forwards - d0
        tot.new_tokens = len(lane.new)
        out.append((lane.new, lane.rounds, tot))
    return out, lm


def run_batch(model, drafters: list[Drafter], tok, prompts_ids: list[list[int]], max_new_tokens: int,
              sampler: Sampler, seeds: list[int], record: str | None, method: str, params: dict, models: dict,
              progress=None, backend: str = "auto", rule: str = "exact", rule_params: dict | None = None) -> list[Trace]:
    """The batch seam: decode_batch, then one trace per prompt (its lane), in order; a rule other
    than `exact` recorded with its parameters, as a single run records it."""
    lanes, lm = decode_batch(model, drafters, prompts_ids, max_new_tokens, sampler, seeds, record,
                             tok.eos_token_id, progress, backend, rule, rule_params)
    if rule != "exact":
        params = dict(params, rule=rule, rule_params=resolve_rule_params(rule, rule_params))
    # per role, the forward that ran it (a lean batch's own forward: LeanLM or StaticLM) and whether
    # CUDA graphs replayed it, as a single run records them; every lane's drafter has the same kind
    draft_lm = getattr(getattr(drafters[0], "inner", drafters[0]), "lm", None) if drafters else None
    models = with_runners(models, getattr(lm, "lm", lm), draft_lm)
    return [trace_of(tok, method, dict(params, backend=type(lm).__name__, batch_size=len(lanes), lane=b), models,
                     sampler, seed, record, ids, new, rounds, totals)
            for b, (ids, (new, rounds, totals), seed) in enumerate(zip(prompts_ids, lanes, seeds))]


def unsupported(method: str) -> str | None:
    """None if `method` runs in a batch (its registry row says `batchable`: its drafter sees only its
    own lane's text, logits and draft model), else the one-line reason."""
    if get_method(method).batchable:
        return None
    return (f"method {method!r} does not run in a batch yet: batches support {', '.join(batch_methods())}; "
            f"decode with {method!r} one prompt at a time")

