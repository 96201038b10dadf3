"""PPD: hardware-aware Parallel Prompt Decoding (Chen et al. 2024, "Hardware-Aware Parallel Prompt
Decoding for Memory-Efficient Acceleration of LLM Inference"; the authors' code,
hmarkc/parallel-prompt-decoding). The draft is m trained prompt vectors (speclab.models.ppd); the
target, frozen, drafts for itself.

The prompt tokens ride inside the verify: each round's ONE target forward runs the pending token,
the candidate tree and, after the root and after each of the `attach` candidates most likely to be
the last accepted, a chain of m prompt rows (positions depth+1 .. depth+m, each seeing its anchor's
path and the prompt rows before it). After the walk, the prompt rows of the last accepted node (the
root when none was) give, per offset j, the target's guess for token j+1 past the emitted one: the
next round's candidates at depth j, a static tree of top-k products (Medusa's) over these m
distributions. No draft forward runs: drafting costs the extra verify rows, nothing else. Where the
last accepted node carried no prompt rows, the next round verifies the root alone (plus its prompt
rows), so the round after has guesses again.

Hardware-aware sizing (budget="auto", the paper's point): with each offset's held-out rank
accuracies (`ppd_rank_acc`, written by `speclab train ppd`), the N best candidate paths
(trees.calibrated_paths) and the A attached nodes (most likely last-accepted first) are chosen once
per run to maximise tokens per unit of verify cost on this machine, c(T) measured by
decoding.costs (T = 1 + N + m (1 + A) rows). Rounds alternate between a tree (E tokens expected,
cost c_T) and, where the last accepted node had no prompt rows, the root alone (1 token, c(1 + m));
with coverage v (the chance the last accepted node is attached), the rate is

    (E + (1 - v)) / (c_T + (1 - v) c(1 + m))

The choice and every alternative weighed go into the first round's PpdFit record; each round's
PromptGuess record has the per-offset guesses its tree came from.

The verify is the engine's (speculative.accept, record_round, own_rounds), in this drafter's own
loop (`decode_loop`) because its forward takes input vectors beside token ids: speclab's lean forward
(LeanLM, StaticLM eagerly) does; transformers' path (backend="hf") is refused. Lossless, greedy or
sampled: the candidates are point-mass drafts (recursive rejection over siblings), and the prompt
rows sit after every candidate row and are seen by none, so they change no candidate's logits.
"""
from __future__ import annotations

import math
import time

import torch

from speclab.decoding.acceptance import greedy_ids
from speclab.decoding.costs import given_curve
from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import host_read
from speclab.decoding.drafters.trees import calibrated_paths, check_paths
from speclab.decoding.rules import get_rule
from speclab.decoding.rules import rule_params as resolve_rule_params
from speclab.decoding.speculative import Context, Drafter, Outcome, RunState, accept, own_rounds, record_round
from speclab.decoding.tree import DraftTree
from speclab.models.heads import check_base
from speclab.records import PpdFit, PromptGuess

MAX_NODES = 12          # budget="auto" weighs trees of up to this many candidates
DEFAULT_ACC = [[0.5, 0.1, 0.05, 0.03]]      # an untrained directory's guess: offset j's rate decays as 0.5^j


def path_chances(paths, acc) -> list[float]:
    """Each path's chance to be accepted: the product of acc[d][r] over its ranks (acc made
    non-increasing in rank), the offsets taken as independent (as calibrated_paths does)."""
    from itertools import accumulate
    acc = [list(accumulate(a, min)) for a in acc]
    return [math.prod(acc[d][r] for d, r in enumerate(p)) for p in paths]


def last_chances(paths, chance) -> list[float]:
    """P(the walk stops at a node): its chance less its children's (greedy: one child at most
    matches); index 0 = the root, then the paths in order."""
    index = {p: i for i, p in enumerate(paths)}
    out = [1.0] + list(chance)
    for p, c in zip(paths, chance):
        out[index[p[:-1]] + 1 if len(p) > 1 else 0] -= c
    return [max(v, 0.0) for v in out]


def weigh(paths, acc, m: int, A: int, cost) -> dict:
    """One candidate shape: the paths, A attached nodes (most likely last first) -> its expected
    tokens, coverage, rows, cost and rate (the module's formula)."""
    chance = path_chances(paths, acc)
    last = last_chances(paths, chance)
    order = sorted(range(len(paths)), key=lambda i: -last[i + 1])[:A]
    cover = last[0] + sum(last[i + 1] for i in order)
    E = 1.0 + sum(chance)
    rows = 1 + len(paths) + m * (1 + A)
    c_tree, c_root = cost(rows), cost(1 + m)
    miss = 1.0 - min(cover, 1.0)
    reach = [sum(c for p, c in zip(paths, chance) if len(p) == d) for d in range(1, max(map(len, paths), default=0) + 1)]
    return {"nodes": len(paths), "attach": sorted(order), "rows": rows, "expect": E, "cover": min(cover, 1.0),
            "cost": c_tree, "rate": (E + miss) / (c_tree + miss * c_root), "reach": reach}


def fit_shape(acc, m: int, curve: dict[int, float], max_nodes: int = MAX_NODES) -> tuple[dict, list[dict]]:
    """The shape of best rate over N = 0..max_nodes candidates and A = 0..N attached; also the best
    per N (what the record keeps as the alternatives weighed)."""
    top = max(curve)
    slope = max(curve[top] - curve.get(top - 1, curve[top]), 0.0)

    def cost(T):
        return curve[T] if T in curve else curve[top] + (T - top) * slope
    per_n = [weigh([], acc, m, 0, cost)]
    for N in range(1, max_nodes + 1):
        paths = calibrated_paths(acc, N)
        per_n.append(max((weigh(paths, acc, m, A, cost) for A in range(N + 1)), key=lambda w: w["rate"]))
    return max(per_n, key=lambda w: w["rate"]), per_n


class PPDDrafter(Drafter):
    name = "ppd"

    def __init__(self, target_model, draft, budget: int | str = "auto", attach: int | None = None,
                 costs: list | None = None):
        super().__init__()
        from speclab.models.ppd import PromptTokens
        if not isinstance(draft, PromptTokens):
            raise ValueError(f"method 'ppd' needs trained prompt tokens (e.g. code-ppd) as its draft, got {_name(draft)}: "
                             f"train them with `speclab train ppd --target ...`")
        check_base(draft.config, target_model.config, _name(draft), _name(target_model))
        if not (budget == "auto" or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0)):
            raise ValueError(f"ppd: budget must be a candidate count >= 0 or 'auto' (sized to this machine's verify "
                             f"costs), got {budget!r}")
        if attach is not None and (not isinstance(attach, int) or attach < 0 or budget == "auto"):
            raise ValueError("ppd: attach is how many candidates (>= 0) carry prompt tokens, with a fixed budget "
                             "(budget='auto' chooses it)")
        self.given_costs = given_curve(costs, budget == "auto", "ppd")
        self.prompts, self.m = draft, draft.m
        self.acc = (draft.rank_acc or DEFAULT_ACC * self.m)[:self.m]
        self.budget, self.attach_n, self.cost_model = budget, attach, target_model

    # -- the shape, once per run -------------------------------------------------------------------
    def shape(self) -> dict:
        if self.budget == "auto":
            from speclab.decoding.costs import machine_curve
            curve = self.given_costs or machine_curve(self.cost_model)[0]
            best, per_n = fit_shape(self.acc, self.m, curve)
            best["curve"] = [curve[T] for T in sorted(curve)]
            best["weighed"] = [[w["nodes"], len(w["attach"]), w["rows"], round(w["expect"], 3), round(w["cost"], 3),
                                round(w["rate"], 4)] for w in per_n]
            return best
        paths = calibrated_paths(self.acc, self.budget) if self.budget else []
        A = len(paths) if self.attach_n is None else min(self.attach_n, len(paths))
        fixed = weigh(paths, self.acc, self.m, A, lambda T: float(T))
        fixed["rate"] = None                              # not weighed: no costs were measured
        return fixed

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        if not hasattr(target, "embed_ids"):
            raise ValueError("ppd's prompt tokens ride in the verify forward as input vectors, which only speclab's "
                             "lean forward takes: use backend='lean' (or 'auto'), not 'hf'")
        fit = self.shape()
        self.paths = check_paths(calibrated_paths(self.acc, fit["nodes"])) if fit["nodes"] else []
        self.attached = [-1] + list(fit["attach"])        # nodes (paths' order, -1 the root) with prompt rows
        self.fit = fit
        self.guess = None                                 # (ids, probs) per offset, top ranks, for the next tree
        self.vecs = self.prompts.prompt.detach().to(target.device, target.dtype)

    # -- a round ---------------------------------------------------------------------------------
    def propose(self, ctx: Context) -> DraftTree:
        tree = DraftTree(info={"shape": "static", "nodes": len(self.paths)})
        if self.guess is None or not self.paths:
            return tree
        ids, probs, src = self.guess
        node_of = {(): -1}
        for path in self.paths:
            d, r = len(path) - 1, path[-1]
            node_of[path] = tree.add(ids[d][r], node_of[path[:-1]], probs[d][r], f"ppd{d + 1}@{src}")
        return tree

    def verify_rows(self, tree: DraftTree) -> tuple[list[int], list[int]]:
        """Which nodes get prompt rows this round (-1: the root) and the extended parents list."""
        anchors = [-1] + [a for a in self.attached[1:] if a < len(tree)] if len(tree) == len(self.paths) else [-1]
        parents = list(tree.parents)
        for a in anchors:
            prev = a
            for _ in range(self.m):
                parents.append(prev)
                prev = len(parents) - 1
        return anchors, parents

    def round(self, s: RunState, ctx: Context):
        t0 = time.perf_counter()
        base = s.target.length
        tree = self.propose(ctx)
        t1 = time.perf_counter()
        pending = ctx.ids[len(ctx.ids) - ctx.pending:]
        anchors, parents = self.verify_rows(tree)
        inputs = pending + tree.tokens
        x = torch.cat([s.target.embed_ids(torch.tensor(inputs, device=s.target.device)),
                       self.vecs.repeat(len(anchors), 1)])
        n_rows = 1 + len(tree) + len(anchors) * self.m
        logits = s.target.forward(None, embeds=x, parents=parents, n_prefix=len(pending), logits_to_keep=n_rows)
        rows, prompt_rows = logits[:1 + len(tree)], logits[1 + len(tree):]
        top = greedy_ids(rows).tolist() if s.sampler.greedy else None                # one host transfer
        (path, emitted, dist, tries), p_at = accept(s, tree, rows, top)
        s.target.keep_positions(base + len(pending), path)
        last = path[-1] if path else -1
        out = Outcome(tree, path, emitted, len(ctx.ids) - ctx.pending + len(pending), rows, inputs, len(pending),
                      len(pending) - 1)
        t2 = time.perf_counter()
        self.next_guess(prompt_rows, anchors, last)
        t3 = time.perf_counter()
        rnd = record_round(s, out, tries, dist, p_at)
        rnd.draft_s, rnd.verify_s = (t1 - t0) + (t3 - t2), t2 - t1
        return rnd, out.accepted_tokens + [emitted]

    def next_guess(self, prompt_rows: torch.Tensor, anchors: list[int], last: int):
        """The next tree's guesses: the last accepted node's prompt rows, top ranks per offset."""
        if last not in anchors:
            self.guess = None
            return
        g = anchors.index(last)
        ranks = max((p[d] for p in self.paths for d in range(len(p))), default=0) + 1
        p = prompt_rows[g * self.m:(g + 1) * self.m].float().softmax(-1)            # (m, V)
        top = p.topk(ranks, -1)
        ids, probs = host_read(top.indices, top.values)                            # the round's one read
        self.guess = (ids, probs, "root" if last < 0 else f"n{last}")

    def guess_record(self) -> dict:
        if self.guess is None:
            return {}
        ids, probs, src = self.guess
        return PromptGuess(ppd_guess=[[int(i[0]), round(float(q[0]), 4)] for i, q in zip(ids, probs)],
                           ppd_from=src).info()

    # -- the loop: the engine's round with this forward -----------------------------------------------
    def decode_loop(self, target, prompt_ids: list[int], max_new_tokens: int, sampler, seed: int = 0,
                    record: str | None = "light", eos_id: int | None = None, progress=None, rule: str = "exact"):
        """Rounds until max_new_tokens or EOS, as speculative.decode runs them, each verify carrying
        the prompt rows. Returns (new ids, rounds, totals)."""
        dev = target.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        target.reset()
        tf0 = target.forwards
        ctx = Context(list(prompt_ids), len(prompt_ids), len(prompt_ids), dev)
        if rule != "exact":
            raise ValueError(f"ppd verifies with the exact rule only (its loop passes no rule parameters), got "
                             f"rule={rule!r}")
        walk = get_rule(rule).make(resolve_rule_params(rule, None), None)
        s = RunState(target, self, sampler, gen, record, target.config.vocab_size, walk, rule)
        self.begin(ctx, target, sampler, gen, record)

        def one_round(rounds):
            guess = self.guess_record()
            rnd, committed = self.round(s, ctx)
            rnd.info.update(guess)
            if not rounds:
                rnd.info.update(PpdFit(ppd_nodes=self.fit["nodes"], ppd_attach=self.fit["attach"],
                                       ppd_rows=self.fit["rows"], ppd_expect=round(self.fit["expect"], 3),
                                       ppd_cover=round(self.fit["cover"], 3),
                                       ppd_rate=None if self.fit["rate"] is None else round(self.fit["rate"], 4),
                                       ppd_reach=[round(v, 4) for v in self.fit["reach"]],
                                       ppd_paths=[list(p) for p in self.paths], ppd_curve=self.fit.get("curve"),
                                       ppd_weighed=self.fit.get("weighed")).info())
            return rnd, committed
        return own_rounds(s, ctx, one_round, target, max_new_tokens, eos_id, progress, self.end, tf0)
