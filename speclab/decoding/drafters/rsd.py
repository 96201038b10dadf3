"""`tree-rsd`: Recursive Speculative Decoding's draft tree (Jeon et al. 2024), siblings sampled
without replacement.

Each node's children are the first b_d tokens of the draft's distribution q(.|node) (temperature,
top-k, top-p applied, as the target's are) ranked by a Gumbel-perturbed score
log q(x) + G, G ~ Gumbel(0, 1) from the run's generator: b_d draws without replacement, in key
order (Gumbel-Top-k). The j-th sibling then follows q renormalised without the earlier ones, so the
verify is the `rsd` rule (decoding/rules/rsd.py): recursive rejection where sibling j is tested
against that renormalised q. Lossless under sampling; at temperature 0 the children are the draft's
top-b (point masses) and the greedy match decides, as for `tree-static`.

branches: children per node at each depth, e.g. (3, 2, 1): 3 at the root, 2 under each, then 1:
3 + 6 + 6 = 15 nodes, one draft forward per depth. Each node's `source` names its Gumbel key
("g1:-2.31" = second sibling, key -2.31), so a view shows which candidate survived.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import warp
from speclab.decoding.drafters.model import host_read
from speclab.decoding.drafters.trees import TreeDrafterBase
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree


def gumbel_top(q: torch.Tensor, b: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """b tokens of q (rows, V) drawn without replacement per row, in draw order: the top b of
    log q + Gumbel noise (Kool et al. 2019). Returns (ids, keys), each (rows, b); tokens q gives no
    mass come last with key -inf."""
    u = torch.rand(q.shape, generator=gen, device=q.device, dtype=torch.float64).clamp_min(1e-300)
    keys = q.double().log() - (-u.log()).log()
    top = keys.topk(b, -1)
    return top.indices, top.values


class RSDDrafter(TreeDrafterBase):
    name = "tree-rsd"

    def __init__(self, draft, branches=(3, 2, 1), backend: str = "auto"):
        super().__init__(draft, backend)
        if not isinstance(branches, (list, tuple)) or not branches or any(
                type(b) is not int or b < 1 for b in branches):
            raise ValueError(f"branches must be a non-empty list of integers >= 1 (children per node at each depth), "
                             f"got {branches!r}")
        self.branches = tuple(branches)

    def propose(self, ctx: Context) -> DraftTree:
        q_at = self.q_at(ctx)
        tree, frontier = DraftTree(info={"shape": "rsd", "branches": list(self.branches)}), [-1]
        for b in self.branches:
            rows = q_at(tree)[[f + 1 for f in frontier]]                       # (frontier, V)
            if self.sampler.greedy:
                top = rows.topk(b, -1)
                ids, keys, q = top.indices, top.values, None
            else:
                q = warp(rows.clamp_min(1e-30).log(), self.sampler)            # the draft as the target is warped
                ids, keys = gumbel_top(q, min(b, int((q > 0).sum(-1).min())), self.gen)
            q_tok = q.gather(-1, ids) if q is not None else torch.ones_like(ids, dtype=torch.float32)
            ids_h, keys_h, q_h = host_read(ids, keys, q_tok)
            nxt = []
            for r, parent in enumerate(frontier):
                if q is not None:
                    tree.set_q(parent, q[r])
                for j, (tok, key, qx) in enumerate(zip(ids_h[r], keys_h[r], q_h[r])):
                    label = f"g{j}:{key:.2f}" if q is not None else f"rank{j}"
                    nxt.append(tree.add(tok, parent, qx if q is not None else None, label))
            frontier = nxt
        return tree
