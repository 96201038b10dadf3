"""Clover (Xiao et al. 2024): Medusa-style heads on the target's hidden state, made regressive
(speclab.models.clover has the heads' math).

Each round: the augmenting block reads the committed rows' hidden states the last verify captured
(its K / V kept, like a cache), once, giving a_t at the last committed position t. Head 1 reads a_t
and the pending token; the children of a node at depth d come from head d+1 reading that node's
state and token, so each depth is one call over the nodes the tree added at the depth before. The
tree is grown by cumulative head probability under a node budget (`grow_dynamic`: EAGLE-2's rule,
which is how Clover's own code picks its tree), or, with `paths`, a static pattern of ranks
(Medusa's shape, the same rank pattern as a `medusa` run for a like-for-like comparison). The
target verifies the tree in one forward: lossless, greedy or sampled (the nodes are point-mass
drafts, verified by recursive rejection).

Record: a node's source is "clover{k}@h{t}" (head k, fed by the hidden state at t); with recording
on, every row a head expanded is a Decision "clover": the head, the token it read, its top `width`
candidates with their head probabilities, and the ones the final tree kept.

Host reads per round: one per depth (the tree's, in grow_dynamic / grow_static), one more per depth
for the candidates when recording.
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.heads import FeatureReader, _name
from speclab.decoding.drafters.model import host_read
from speclab.decoding.drafters.trees import check_budget, check_paths, grow_dynamic, grow_static
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.models.clover import CloverHeads
from speclab.models.heads import check_base
from speclab.trace import Decision


def token_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Each node's tokens from the root down (siblings differ, so a path names a node)."""
    out: list[tuple[int, ...]] = []
    for tok, p in zip(tree.tokens, tree.parents):
        out.append((out[p] if p >= 0 else ()) + (tok,))
    return out


class CloverDrafter(FeatureReader, Drafter):
    name = "clover"

    def __init__(self, target_model, draft, budget: int = 8, width: int = 3, depth: int | None = None,
                 threshold: float | None = None, paths=None):
        super().__init__()
        if not isinstance(draft, CloverHeads):
            raise ValueError(f"method 'clover' needs Clover heads (e.g. smollm2-clover, code-clover) as its draft, got "
                             f"{_name(draft)}: train them with `speclab train clover --target ...`")
        check_base(draft.config, target_model.config, _name(draft), _name(target_model))
        self.heads = draft
        self.layers = (len(target_model.model.layers),)
        self.drafts_from(draft.lm_head.head_ids, draft.config.vocab_size)
        K = draft.n_heads
        depth = K if depth is None else depth
        check_budget(budget, width, depth, threshold)
        if depth > K:
            raise ValueError(f"clover depth {depth} needs {depth} heads but {_name(draft)} has {K}: use depth <= {K}")
        self.budget, self.width, self.depth, self.threshold = budget, width, depth, threshold
        self.paths = None if paths is None else check_paths(paths)
        if self.paths is not None and max(len(p) for p in self.paths) > K:
            raise ValueError(f"clover paths go {max(len(p) for p in self.paths)} deep but {_name(draft)} has {K} heads: "
                             f"use paths of at most {K} ranks")

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.kv, self.seen = None, 0             # the augmenting block's K / V over positions < seen

    def end(self):
        super().end()
        self.kv = None

    def augment(self) -> torch.Tensor:
        """The committed rows not yet seen into the augmenting block's K / V; a_t (1, C) at the last."""
        h = self.heads
        x = self.feats.to(h.w1[0].weight.dtype)                                     # (n, C)
        q, k, v = h.aug_qkv(x, torch.arange(self.seen, self.seen + len(x)))
        self.kv = (k, v) if self.kv is None else (torch.cat([self.kv[0], k], -2), torch.cat([self.kv[1], v], -2))
        self.seen += len(x)
        self.feats = None
        return h.aug_out(x[-1:], q[:, -1:], *self.kv, causal=False)

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        h = self.heads
        assert self.seen + len(self.feats) == t + 1
        W = h.lm_head.weight                                                        # (N, C)
        state = {"g": h.decode(self.augment(), torch.tensor([ctx.ids[-1]], device=W.device), 1),   # (1, C)
                 "q": None, "n": 0}
        rows = []                                # recorded expansions: (head, token read, parent path, cand.)

        def q_at(tree: DraftTree) -> torch.Tensor:
            """(1 + N, n_ids): head 1's distribution at the root, then head d+1's after each node at
            depth d; only the nodes added since the last call are new."""
            n0, n = state["n"], len(tree)
            if n == 0:
                k, g = 1, state["g"]
            else:
                k = tree.depths()[n - 1] + 1                                        # the new nodes' depth + 1
                par = torch.tensor([p + 1 for p in tree.parents[n0:n]], device=W.device)
                g = h.decode(state["g"].index_select(0, par), torch.tensor(tree.tokens[n0:n], device=W.device), k)
                state["g"] = torch.cat([state["g"], g])
            q = (h.block(g, k) @ W.t()).float().softmax(-1)                          # (new, n_ids)
            self.forwards += 1
            state["q"] = q if state["q"] is None else torch.cat([state["q"], q])
            state["n"] = n
            if self.record is not None:
                top = q.topk(min(self.width, q.shape[-1]), -1)
                ids, probs = host_read(h.lm_head.head_ids[top.indices], top.values)
                paths = token_paths(tree)
                for j, (i_, p_) in enumerate(zip(ids, probs)):
                    node = n0 + j if n else -1
                    rows.append((k, ctx.ids[-1] if node < 0 else tree.tokens[node], paths[node] if node >= 0 else (),
                                 [[i, round(p, 5)] for i, p in zip(i_, p_)]))
            return state["q"]

        label = lambda d: f"clover{d}@h{t}"                                           # noqa: E731
        if self.paths is None:
            tree = grow_dynamic(self.budget, self.width, self.depth, q_at, label=label, ids=h.lm_head.head_ids,
                                threshold=self.threshold)
        else:                                   # a static rank pattern: distributions over the whole vocabulary
            V = h.config.vocab_size

            def q_full(tree):
                q = q_at(tree)
                out = q.new_zeros(len(q), V)
                out[:, h.lm_head.head_ids] = q
                return out
            tree = grow_static(self.paths, q_full, info={"shape": "static", "nodes": len(self.paths)})
            tree.source = [label(d) for d in tree.depths()]
        tree.info["heads"] = h.n_heads
        if rows:
            kept: dict[tuple, list[int]] = {}
            for path in token_paths(tree):
                kept.setdefault(path[:-1], []).append(path[-1])
            tree.decisions = [Decision(self.name, {"head": k, "read": tok, "candidates": cand}, output=kept.get(path, []),
                                       at=k, note=f"head {k} after {len(path)} drafted token{'s' * (len(path) != 1)}")
                              for k, tok, path, cand in rows]
        return tree
