"""`spectr`: SpecTr's drafts (Sun et al., NeurIPS 2023): k chains of L tokens, each sampled
i.i.d. from the draft's distribution q (temperature, top-k, top-p applied, as the target's are).

The tree is the k chains side by side under the root, duplicates kept as separate nodes: the verify
is the `k-seq` rule (decoding/rules/kseq.py), and K-SEQ needs the candidates as a multiset drawn
i.i.d. from q. Chains whose tokens agree so far sample their next token from the same q row (the
first such chain's), so every candidate of one K-SEQ test comes from exactly the q it reads. One
draft forward per depth over the whole tree so far, as every tree drafter here. At temperature 0
the k chains would be k copies of the draft's greedy chain: it drafts one, and the greedy match
decides.

k: number of chains (4); L: tokens per chain (4): k * L = 16 nodes a verify. Each node's `source`
names its chain ("chain2"), so a view can draw the chains as lanes that drop out as they diverge.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.model import host_read
from speclab.decoding.drafters.trees import TreeDrafterBase
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.models.lean.archs import VERIFY_ROOM


def grow_chains(k: int, L: int, q_at, sampler: Sampler, gen: torch.Generator | None) -> DraftTree:
    """k chains of L tokens drawn i.i.d. from the warped q (greedy: one argmax chain). q_at(tree) ->
    (1 + N, V): the draft's probabilities after the committed prefix, then after each node."""
    k = 1 if sampler.greedy else k
    tree = DraftTree(info={"shape": "spectr", "k": k, "L": L})
    frontier, prefix = [-1] * k, [()] * k                  # chain i's last node and its tokens
    for _ in range(L):
        distinct = {}                                       # prefix -> its index among the distinct ones
        group = [distinct.setdefault(prefix[i], len(distinct)) for i in range(k)]
        rows = [frontier[prefix.index(pre)] + 1 for pre in distinct]      # its first chain's row
        probs = q_at(tree)[rows]                                            # (distinct, V)
        if sampler.greedy:
            ids, q = probs.argmax(-1), None
        else:
            q = warp(probs.clamp_min(1e-30).log(), sampler)[group]          # (k, V): the draft warped as the target
            ids = torch.multinomial(q, 1, generator=gen)[:, 0]               # (k,) one draw per chain
        q_tok = q.gather(-1, ids[:, None])[:, 0] if q is not None else torch.ones(k)
        ids_h, q_h = host_read(ids, q_tok.to(ids.device))
        for i in range(k):
            if q is not None:
                tree.set_q(frontier[i], q[i])
            frontier[i] = tree.add(ids_h[i], frontier[i], q_h[i] if q is not None else None, f"chain{i}")
            prefix[i] += (ids_h[i],)
    return tree


class SpecTrDrafter(TreeDrafterBase):
    name = "spectr"

    def __init__(self, draft, k: int = 4, L: int = 4, backend: str = "auto"):
        super().__init__(draft, backend)
        for name, v in (("k", k), ("L", L)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1 (k: draft chains, L: tokens per chain), got {v!r}")
        if k * L >= VERIFY_ROOM:
            raise ValueError(f"k * L = {k * L} draft nodes: a verify holds fewer than {VERIFY_ROOM}; "
                             "lower k (chains) or L (tokens per chain)")
        self.k, self.L = k, L

    def propose(self, ctx: Context) -> DraftTree:
        return grow_chains(self.k, self.L, self.q_at(ctx), self.sampler, self.gen)
