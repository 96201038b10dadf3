"""Draft trees from a draft model: static (Medusa / SpecInfer pattern) and dynamic (EAGLE-2 / DySpec).

tree-static   a fixed expansion pattern: each path is a list of ranks, e.g. [0, 1] = "the draft's
              2nd choice after its 1st choice". The default pattern spends the budget mostly on
              the top-1 chain with a few side branches.
tree-dynamic  grow the tree by cumulative draft probability: expand the `width` best nodes per
              depth, then keep the `budget` best nodes overall (a child never outscores its parent,
              so the kept set is a tree).
Children are the draft's top-k choices, deterministic, so under sampling they are point-mass drafts
verified by recursive rejection without replacement (EAGLE-2 style): lossless.

Each depth costs one draft forward over the whole tree so far (tree attention), after which the
draft cache is cut back to the committed prefix.

Host reads (a device -> host transfer waits for the device): ONE per depth. grow_dynamic ranks the
frontier's top-k children on the device (cumulative probabilities in float64, a stable sort: the
order a host sort of the same doubles gives) and reads the chosen nodes' tokens, parents,
probabilities and scores in one transfer; the tree's tokens and parents stay on the device too
(Growing), so the next depth's draft forward gathers its inputs there. grow_static reads one
top-k of every row per depth. What a draft forward itself syncs (its tree mask is built on the
host from the parents it read) belongs to the forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from speclab.decoding.drafters.model import OwnDraftLM, check_k, host_read
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree

DEFAULT_PATHS = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0, 0]]


@dataclass
class Growing(DraftTree):
    """A tree being grown, its tokens and parents also on the draft's device: the next depth's
    draft forward gathers its inputs (tokens, the parents' features) there, with no host copy."""
    dev_tokens: torch.Tensor | None = None          # (N,) long
    dev_parents: torch.Tensor | None = None         # (N,) long, -1 = a child of the root


def tokens_on(tree: DraftTree, device) -> torch.Tensor:
    """The tree's tokens (N,) on `device`: the grown copy where there is one."""
    dev = getattr(tree, "dev_tokens", None)
    if dev is not None and len(dev) == len(tree):
        return dev.to(device)
    return torch.tensor(tree.tokens, dtype=torch.long, device=device)


class TreeDrafterBase(OwnDraftLM, Drafter):
    def __init__(self, draft, backend: str = "auto"):
        super().__init__()
        self.attach_lm(draft, backend)

    def dists(self, pending: list[int], tree: DraftTree, device) -> torch.Tensor:
        """Draft probabilities (1 + N, V): after the committed prefix, then after each node.

        The first call of a round runs the pending tokens too (they stay cached); later calls
        run only the tree and reuse the root distribution.
        """
        base = self.lm.length
        ids = tokens_on(tree, device)
        if pending:
            ids = torch.cat([torch.tensor(pending, dtype=torch.long, device=device), ids])
        logits = self.lm.forward(ids, parents=tree.parents or None, n_prefix=len(pending))
        self.lm.keep(base + len(pending))          # tree nodes are never kept in the draft cache
        probs = logits.softmax(-1)
        if pending:
            self.root_q = probs[len(pending) - 1]
        return torch.cat([self.root_q[None], probs[len(pending):]])

    def pending(self, ctx: Context) -> list[int]:
        return ctx.ids[self.lm.length:]

    def q_at(self, ctx: Context):
        """tree -> dists (1 + N, V) for this round: the first call also runs the pending tokens."""
        pending = [self.pending(ctx)]

        def q_at(tree):
            q, pending[0] = self.dists(pending[0], tree, ctx.device), []
            return q
        return q_at

    def observe(self, out: Outcome):
        pass  # the draft cache holds exactly the committed prefix minus the pending tail


def check_paths(paths) -> list[tuple[int, ...]]:
    """A static expansion pattern, validated, sorted by depth then rank."""
    if paths is not None and not (isinstance(paths, (list, tuple))
                                  and all(isinstance(p, (list, tuple)) for p in paths)):
        raise ValueError(f"tree paths must be a list of paths of ranks, e.g. [[0], [1], [0, 0]], got {paths!r}")
    paths = DEFAULT_PATHS if paths is None else [list(p) for p in paths]
    if not paths:
        raise ValueError("a static tree needs at least one path, e.g. [[0], [1], [0, 0]]")
    pset = {tuple(p) for p in paths}
    for p in paths:
        if not p or any(not isinstance(r, int) or r < 0 for r in p):
            raise ValueError(f"tree path {p} must be a non-empty list of ranks >= 0")
        if len(p) > 1 and tuple(p[:-1]) not in pset:
            raise ValueError(f"tree path {p} has no parent path {p[:-1]} in the pattern")
    return sorted(pset, key=lambda p: (len(p), p))


def calibrated_paths(rank_acc: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """Medusa-1's calibrated tree: the `budget` paths most likely to be accepted, a path's chance
    estimated as the product of rank_acc[d][r] over its ranks (rank_acc[d][r]: how often head d+1's
    rank-r guess was the target's token on held-out text; the heads taken as independent, as the
    paper does). A path outscores its next sibling and its children, so the best `budget` paths
    form a tree, found best-first from [0]."""
    import heapq
    from itertools import accumulate
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"node budget must be an integer >= 1, got {budget!r}")
    acc = [list(accumulate(a, min)) for a in rank_acc]     # measured rates, made non-increasing in rank

    def chance(p):
        return math.prod(acc[d][r] for d, r in enumerate(p))
    heap, out = [(-chance((0,)), (0,))], []
    while heap and len(out) < budget:
        _, p = heapq.heappop(heap)
        out.append(p)
        nxt = [p[:-1] + (p[-1] + 1,)] if p[-1] + 1 < len(acc[len(p) - 1]) else []     # next sibling
        nxt += [p + (0,)] if len(p) < len(acc) else []                                 # first child
        for c in nxt:
            heapq.heappush(heap, (-chance(c), c))
    return sorted(out, key=lambda p: (len(p), p))


def grow_static(paths: list[tuple[int, ...]], q_at, info: dict | None = None) -> DraftTree:
    """The tree of a static pattern. q_at(tree) -> (1 + N, V): the draft's distribution after the
    committed prefix, then after each node of `tree` (called once per depth)."""
    tree, node_of = DraftTree(info=info or {"shape": "static", "nodes": len(paths)}), {(): -1}
    for depth in range(1, max(len(p) for p in paths) + 1):
        q = q_at(tree)                                             # (1 + N, V)
        level = [p for p in paths if len(p) == depth]
        k = max(p[-1] for p in level) + 1
        top = q.topk(k, -1)                                        # (1 + N, k): every row, one read
        toks, probs = host_read(top.indices, top.values)
        for p in level:
            parent = node_of[p[:-1]]
            node_of[p] = tree.add(toks[parent + 1][p[-1]], parent, probs[parent + 1][p[-1]], f"rank{p[-1]}")
    return tree


def grow_dynamic(budget: int, width: int, depth: int, q_at, label=lambda d: f"depth{d}",
                 ids: torch.Tensor | None = None, threshold: float | None = None, fit=None) -> DraftTree:
    """EAGLE-2's tree: expand the `width` best nodes per depth by cumulative draft probability,
    then keep the `budget` best overall (ancestor-closed). q_at as in grow_static; with `ids` (N,)
    its distributions are over those token ids only (a trimmed-vocabulary head).
    threshold: stop growing once the best node of the last depth has a cumulative probability
    below it. No deeper node can score higher, so by the draft's own estimate the next depth (one
    more draft forward) would rarely be accepted: the tree grows as deep as the draft is sure,
    shallow on open chat, deep on code.
    fit: None, or a function of the best `budget` scores (best first) -> how many of them to keep
    (decoding.costs.fit_nodes: the count this machine's verify costs favour)."""
    grown = Growing()
    score: list[float] = []                                        # cumulative draft probability
    frontier, levels = [-1], 0                                     # the last depth's nodes, best first
    base = dev_frontier = None                                     # their scores and ids on the device
    for d in range(depth):
        if d and threshold is not None and score[frontier[0]] < threshold:
            break                                                  # frontier[0]: the best of depth d
        q = q_at(grown)                                            # (1 + N, V)
        if base is None:                                           # the root: cumulative probability 1
            base = torch.ones(1, dtype=torch.float64, device=q.device)
            dev_frontier = torch.full((1,), -1, dtype=torch.long, device=q.device)
        n = len(grown)                                             # the frontier: the last nodes added
        top = q[n + 1 - len(frontier):n + 1].topk(width, -1)       # (frontier, width): one call per depth
        s = (base[:, None] * top.values.double()).flatten()        # what base * prob gives on the host
        # the best `width` candidates, ties in (frontier, rank) order: a stable sort, as the host's
        best = (-s).sort(stable=True).indices[:width]
        toks = (top.indices if ids is None else ids[top.indices]).flatten()[best]
        parents = dev_frontier[best // width]
        probs = top.values.flatten()[best]
        tok_h, par_h, prob_h, s_h = host_read(toks, best // width, probs.double(), s[best])   # the depth's one read
        frontier = [grown.add(tok, frontier[j], prob, label(d + 1)) for tok, j, prob in zip(tok_h, par_h, prob_h)]
        score += s_h
        base, dev_frontier = s[best], torch.arange(n, n + len(best), device=q.device)
        grown.dev_tokens = toks if n == 0 else torch.cat([grown.dev_tokens, toks])
        grown.dev_parents = parents if n == 0 else torch.cat([grown.dev_parents, parents])
        levels = d + 1
    keep = sorted(range(len(grown)), key=lambda i: -score[i])[:budget]
    if fit is not None:
        keep = keep[:fit([score[i] for i in keep])]
    keep = sorted(_ancestor_closed(grown, keep))
    tree = DraftTree(info={"shape": "dynamic", "budget": budget, "grown": len(grown), "levels": levels})
    new_id = {-1: -1}
    for i in keep:
        new_id[i] = tree.add(grown.tokens[i], new_id[grown.parents[i]], grown.q_tok[i], grown.source[i])
    return tree


def check_budget(budget, width, depth, threshold=None):
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"node budget must be an integer >= 1, got {budget!r}")
    check_k(width, "width")
    check_k(depth, "depth")
    if threshold is not None and not 0 < threshold < 1:
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}: the cumulative draft probability below "
                         f"which the tree stops growing")


class StaticTreeDrafter(TreeDrafterBase):
    name = "tree-static"

    def __init__(self, draft, paths=None, backend: str = "auto"):
        super().__init__(draft, backend)
        self.paths = check_paths(paths)

    def propose(self, ctx: Context) -> DraftTree:
        return grow_static(self.paths, self.q_at(ctx))


class DynamicTreeDrafter(TreeDrafterBase):
    name = "tree-dynamic"

    def __init__(self, draft, budget: int = 10, width: int = 3, depth: int = 5,
                 threshold: float | None = None, backend: str = "auto"):
        super().__init__(draft, backend)
        check_budget(budget, width, depth, threshold)
        self.budget, self.width, self.depth, self.threshold = budget, width, depth, threshold

    def propose(self, ctx: Context) -> DraftTree:
        return grow_dynamic(self.budget, self.width, self.depth, self.q_at(ctx), threshold=self.threshold)


def _ancestor_closed(tree: DraftTree, nodes: list[int]) -> set[int]:
    out = set()
    for n in nodes:
        out.update(tree.path_to(n))
    return out
