"""Falcon (Gao et al., AAAI 2025): EAGLE's head drafting k tokens a forward, semi-autoregressively
(speclab.models.falcon has the head's math).

Each round: one forward writes the committed rows the last verify captured into the head's cache as
real entries (their K / V kept, like EAGLE's) and runs k-1 mask entries after them: slot 1 (the last
real entry) guesses depth 1, mask slot j depth 1+j. The tree then grows by cumulative draft
probability under a node budget (`grow_dynamic`, EAGLE-2's rule, so a run matches an `eagle` run
of the same budget): the children of a node at depth d come from the forward that drafted depth d+1,
with no new forward unless d is a multiple of k; then one forward over those nodes writes the k
tokens on each one's path since that forward as real entries (features: the slots' outputs) and
runs k-1 new masks, for depths d+1..d+k. Draft entries are dropped at the end of the round (the
verify's features replace them). Falcon's own tree is a static choice list tuned for its targets;
speclab's dynamic tree is the same one `eagle` and `clover` grow. The target verifies the tree in
one forward: lossless, greedy or sampled (the nodes are point-mass drafts, verified by recursive
rejection over siblings).

Record: a node's source is "falcon{f}.{s}@h{t}" (forward f of the round, slot s of it, fed by the
target's hidden state at t); with recording on, each node has a Decision "falcon" with its forward,
its slot and whether that slot was a mask entry, and the round's info has k and the forwards run.

Host reads per round: one per depth (grow_dynamic's).
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.heads import FeatureReader, _name
from speclab.decoding.drafters.trees import check_budget, grow_dynamic
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.models.falcon import FalconHead
from speclab.models.heads import check_base, eagle_layers
from speclab.trace import Decision


def forward_and_slot(depth: int, k: int) -> tuple[int, int]:
    """Which forward of the round (1-based) and which of its k slots drafts a node at `depth`."""
    return (depth - 1) // k + 1, (depth - 1) % k + 1


class FalconDrafter(FeatureReader, Drafter):
    name = "falcon"

    def __init__(self, target_model, draft, budget: int = 5, width: int = 3, depth: int = 4,
                 threshold: float | None = 0.2):
        super().__init__()
        if not isinstance(draft, FalconHead):
            raise ValueError(f"method 'falcon' needs a Falcon head (e.g. code-falcon) as its draft, got {_name(draft)}: "
                             f"train one with `speclab train falcon --target ...`")
        check_base(draft.config, target_model.config, _name(draft), _name(target_model))
        check_budget(budget, width, depth, threshold)
        n = len(target_model.model.layers)
        self.layers = eagle_layers(draft.config, n)
        if self.layers[-1] != n:
            raise ValueError(f"the head {_name(draft)} reads target layers {list(self.layers)}, not ending at the "
                             f"last of {_name(target_model)}'s {n}: train a head for this target")
        self.head, self.k = draft, draft.k
        self.drafts_from(draft.lm_head.head_ids, draft.config.vocab_size)
        self.budget, self.width, self.depth, self.threshold = budget, width, depth, threshold

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.cache, self.seen = None, 0         # the committed real entries' K / V per layer, positions < seen

    def end(self):
        super().end()
        self.cache = None

    def prepare(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.head.feature([x.to(self.head.fc.weight.dtype) for x in xs])          # post-norm f

    def dists(self, o: torch.Tensor) -> torch.Tensor:
        """(..., k, C) slot outputs -> (..., k, N) draft distributions over the kept ids."""
        return self.head.logits(o).float().softmax(-1)

    def root(self, ctx: Context):
        """The committed rows into the cache and k-1 masks after them: slot outputs (k, C)."""
        h, k, n = self.head, self.k, len(ctx.ids)
        f = self.feats                                                            # (m, C) positions seen..n-2
        m = len(f)
        assert self.seen + m == n - 1
        real = h.real(f, torch.tensor(ctx.ids[self.seen + 1:n], device=f.device))
        x = torch.cat([real, h.mask[:k - 1].to(real.dtype)])                      # (m + k-1, C)
        pos = torch.arange(self.seen, n - 2 + k)
        S = self.seen
        vis = torch.zeros(m + k - 1, S + m + k - 1, dtype=torch.bool)
        vis[:, :S] = True
        vis[:m, S:S + m] = torch.ones(m, m, dtype=torch.bool).tril()
        vis[m:, S:S + m] = True
        vis[m:, S + m:] = torch.ones(k - 1, k - 1, dtype=torch.bool).tril()
        out, new = h.run(x, pos, vis.to(f.device), self.cache)
        kept = [(kk[:, :m], vv[:, :m]) for kk, vv in new]
        self.cache = kept if self.cache is None else [(torch.cat([c[0], a], -2), torch.cat([c[1], b], -2))
                                                       for c, (a, b) in zip(self.cache, kept)]
        self.seen, self.feats = n - 1, None
        self.forwards += 1
        return out[m - 1:]                                                        # (k, C)

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        h, k = self.head, self.k
        O = {-1: self.root(ctx)}                # expanded node (root -1) -> its forward's slot outputs (k, C)
        Q = {-1: self.dists(O[-1])}             # ... and its slots' distributions (k, N)
        draft_kv, entry_of = None, {}           # the round's real entries: per layer (Hkv, R, D); node -> index
        rows = [Q[-1][0]]                       # row 0: the root's children; row 1+i: node i's
        forwards = [1]

        def ancestors(tree, i):
            out = [i]
            while tree.parents[out[-1]] >= 0:
                out.append(tree.parents[out[-1]])
            return out[::-1]                    # root's child first

        def expand(tree, nodes: list[int], d: int):
            """One forward for the nodes at depth d (a multiple of k): per node its path's last k
            tokens as real entries, then k-1 masks."""
            nonlocal draft_kv
            R = 0 if draft_kv is None else draft_kv[0][0].shape[-2]
            xs, pos, groups = [], [], []
            for e in nodes:
                path = ancestors(tree, e)                                         # depths 1..d
                anchor = path[d - k - 1] if d > k else -1                         # the node whose forward drafted these
                toks = path[d - k:]
                f = h.rms(O[anchor])                                              # (k, C): features of depths d-k+1..d
                xs += [h.real(f, torch.tensor([tree.tokens[i] for i in toks], device=f.device)),
                       h.mask[:k - 1].to(f.dtype)]
                pos.append(torch.arange(t + d - k + 1, t + d + k))
                groups.append((e, toks, set(path[:d - k])))
            x, G = torch.cat(xs), 2 * k - 1
            vis = torch.zeros(len(x), self.seen + R + len(x), dtype=torch.bool)
            vis[:, :self.seen] = True
            block = torch.zeros(G, G, dtype=torch.bool)
            block[:k, :k] = torch.ones(k, k, dtype=torch.bool).tril()
            block[k:, :k] = True
            block[k:, k:] = torch.ones(k - 1, k - 1, dtype=torch.bool).tril()
            for g, (e, toks, older) in enumerate(groups):
                rows_g = slice(g * G, (g + 1) * G)
                for a in older:                                                   # earlier forwards' entries
                    vis[rows_g, self.seen + entry_of[a]] = True
                vis[rows_g, self.seen + R + g * G:self.seen + R + (g + 1) * G] = block
            cache = [(torch.cat([c[0], dk[0]], -2), torch.cat([c[1], dk[1]], -2)) for c, dk in
                     zip(self.cache, draft_kv)] if draft_kv is not None else self.cache
            out, new = h.run(x, torch.cat(pos), vis.to(x.device), cache)
            self.forwards += 1
            forwards[0] += 1
            keep = []
            for g, (e, toks, _) in enumerate(groups):
                O[e] = out[g * G + k - 1:(g + 1) * G]                             # slot 1 = e's real entry, then masks
                for j, i in enumerate(toks):
                    if i not in entry_of:
                        entry_of[i] = R + len(keep)
                        keep.append(g * G + j)
            idx = torch.tensor(keep, device=x.device)
            add = [(kk.index_select(-2, idx), vv.index_select(-2, idx)) for kk, vv in new]
            draft_kv = add if draft_kv is None else [(torch.cat([a[0], b[0]], -2), torch.cat([a[1], b[1]], -2))
                                                     for a, b in zip(draft_kv, add)]
            q = self.dists(torch.stack([O[e] for e in nodes]))                    # (nodes, k, N)
            for j, e in enumerate(nodes):
                Q[e] = q[j]

        def q_at(tree) -> torch.Tensor:
            n_old = len(rows) - 1
            new = list(range(n_old, len(tree)))
            if new:
                d = tree.depths()[new[0]]
                if d % k == 0:
                    expand(tree, new, d)
                for e in new:                   # its children: slot d mod k + 1 of the forward that drafted it
                    path = ancestors(tree, e)
                    anchor = e if d % k == 0 else (path[d - d % k - 1] if d > k else -1)
                    rows.append(Q[anchor][d % k])
            return torch.stack(rows)

        def label(d: int) -> str:
            f, s = forward_and_slot(d, k)
            return f"falcon{f}.{s}@h{t}"
        tree = grow_dynamic(self.budget, self.width, self.depth, q_at, label=label, ids=h.lm_head.head_ids,
                            threshold=self.threshold)
        tree.info["k"] = k
        tree.info["head_forwards"] = forwards[0]
        if self.record is not None:
            tree.decisions = []
            for i, d in enumerate(tree.depths()):
                f, s = forward_and_slot(d, k)
                tree.decisions.append(Decision(self.name, {"forward": f, "slot": s, "mask": s > 1,
                                                           "q": round(float(tree.q_tok[i]), 5)},
                                               output=tree.tokens[i], at=i,
                                               note=f"node {i}: forward {f}, slot {s} of {k}" +
                                               (" (a mask entry)" if s > 1 else "")))
        return tree
