"""Token Recycling: an adjacency matrix of each token's top-k successors, rewritten from EVERY
verify forward (the candidates the target saw but did not keep are "recycled"). The draft follows
the top successor from the last committed token (a chain; `width` > 1 makes a BFS tree).
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.model import check_k
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree


class RecyclingDrafter(Drafter):
    name = "recycling"
    all_rows = True                 # the prompt's rows too: its successors seed the matrix

    def __init__(self, k: int = 6, topk: int = 8, width: int = 1, budget: int | None = None):
        super().__init__()
        check_k(k)
        check_k(width, "width")
        if type(topk) is not int or topk < 1:
            raise ValueError(f"topk must be an integer >= 1 (successors kept per token), got {topk!r}")
        self.k, self.topk, self.width = k, topk, width
        self.budget = budget or k * width

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        V = target.config.vocab_size
        self.succ = torch.zeros(V, self.topk, dtype=torch.long)   # (V, topk) on host: tiny lookups
        self.known = torch.zeros(V, dtype=torch.bool)

    def propose(self, ctx: Context) -> DraftTree:
        tree = DraftTree(info={"width": self.width})
        frontier = [(-1, ctx.ids[-1])]                          # BFS over the adjacency matrix
        for depth in range(self.k):
            nxt = []
            for parent, tok in frontier:
                if not self.known[tok]:
                    continue
                for succ in self.succ[tok, : self.width].tolist():
                    if len(tree) >= self.budget:
                        break
                    nxt.append((tree.add(succ, parent, 1.0, "recycled"), succ))
            frontier = nxt
            if not frontier:
                break
        return tree

    def observe(self, out: Outcome):
        # every row of the verify forward (all_rows): input token -> its top-k next tokens
        top = out.logits.topk(self.topk, dim=-1).indices.cpu()      # (P+N, topk)
        rows = torch.tensor(out.inputs[out.logits_from:])
        self.succ[rows] = top
        self.known[rows] = True
