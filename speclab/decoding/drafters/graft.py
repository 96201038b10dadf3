"""Graft ("draft less, retrieve more"): prune the head's dense draft tree, then spend the freed
budget on grafting retrieved tokens into the positions pruning opened up (prune-then-graft).

EAGLE-2's dynamic tree (drafters/heads.py, `EagleDrafter`) fills its budget with the head's
guesses; `eagle[lookup=K]` lays prompt lookup's copy ON TOP of it, so a round verifies up to
budget + K rows. Graft keeps the verify at the budget: it scores every leaf of the head's tree by
its path's draft probability (the product of q along the path, the tree's own acceptance
estimate), prunes the least likely leaves whose path probability is below `keep` (a leaf's parent
can become a leaf and go too), as many as the copy needs new nodes, and grafts the copy into the
room made: the copied tokens share the tree's nodes where they agree, and the rest hang below.
A copy with no room left is cut to the room there is. Greedy only, like `eagle[lookup=K]` (a
copied node has no draft distribution to correct against), and lossless there: the target's
verify decides every token.

Recorded per round: `grafted` and `pruned` (HeadCoverage records), each node's `source` (the head's
hidden state, or the copy's n-gram match), and one Decision "graft" with its inputs (the budget,
the tree's size, the copy's length and how many nodes it needs, the pruned leaves' path
probabilities), its threshold `keep` and its output (pruned, grafted).
"""
from __future__ import annotations

import math

from speclab.decoding.drafters.heads import EagleDrafter, graft
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision


def path_probs(tree: DraftTree) -> list[float]:
    """Each node's path probability under the draft: the product of its ancestors' and its own q
    (a node with no q, a copied one, counts 1)."""
    out: list[float] = []
    for i, p in enumerate(tree.parents):
        q = tree.q_tok[i]
        out.append((1.0 if p < 0 else out[p]) * (1.0 if q is None else float(q)))
    return out


def needed(tree: DraftTree, chain: DraftTree) -> tuple[int, list[int]]:
    """How many new nodes the chain needs on `tree`, and the tree nodes it shares (its prefix)."""
    kids, node, shared = tree.children(), -1, []
    for i, tok in enumerate(chain.tokens):
        same = [c for c in kids.get(node, []) if tree.tokens[c] == tok]
        if not same:
            return len(chain.tokens) - i, shared
        node = same[0]
        shared.append(node)
    return 0, shared


def prune(tree: DraftTree, want: int, keep: float, protect: set[int]) -> tuple[DraftTree, list[float]]:
    """`tree` without up to `want` of its least likely leaves (path probability below `keep`, not in
    `protect`), a leaf's parent becoming a candidate once its children are gone; the pruned path
    probabilities, lowest first."""
    prob = path_probs(tree)
    kids = {i: 0 for i in range(len(tree))}
    for p in tree.parents:
        if p >= 0:
            kids[p] += 1
    gone: set[int] = set()
    dropped: list[float] = []
    while len(gone) < want:
        leaves = [i for i in range(len(tree)) if i not in gone and kids[i] == 0 and i not in protect
                  and prob[i] < keep]
        if not leaves:
            break
        worst = min(leaves, key=lambda i: (prob[i], -i))
        gone.add(worst)
        dropped.append(round(prob[worst], 6))
        if tree.parents[worst] >= 0:
            kids[tree.parents[worst]] -= 1
    if not gone:
        return tree, dropped
    new_id = {-1: -1}
    out = DraftTree(q_root=tree.q_root, info=dict(tree.info), decisions=list(tree.decisions))
    for i in range(len(tree)):
        if i in gone:
            continue
        new_id[i] = out.add(tree.tokens[i], new_id[tree.parents[i]], tree.q_tok[i], tree.source[i])
        if i in tree.q_children:
            out.q_children[new_id[i]] = tree.q_children[i]
    return out, dropped


class GraftDrafter(EagleDrafter):
    """EAGLE-2's tree pruned to make room for prompt lookup's copy, within the same budget (Graft)."""
    name = "graft"

    def __init__(self, target_model, draft, budget: int = 6, width: int = 3, depth: int = 3,
                 vocab: int | None = None, threshold: float | None = 0.2, lookup: int = 6, ngram: int = 2,
                 keep: float = 0.5):
        if not 0.0 <= keep <= 1.0 or not math.isfinite(keep):
            raise ValueError(f"graft's keep is a path probability in [0, 1], got {keep}")
        if not lookup:
            raise ValueError("graft grafts prompt lookup's copy: lookup must be at least 1 (eagle is graft "
                             "without a copy)")
        super().__init__(target_model, draft, budget=budget, width=width, depth=depth, vocab=vocab,
                         threshold=threshold, lookup=lookup, ngram=ngram)
        self.keep = keep

    def draft_at(self, ctx, t: int) -> DraftTree:
        copy, self.lookup = self.lookup, None      # the head's tree alone first
        try:
            tree = super().draft_at(ctx, t)
        finally:
            self.lookup = copy
        chain = copy.propose(ctx)
        if not len(chain):
            tree.info.update(grafted=0, pruned=0)
            return tree
        size, copied = len(tree), len(chain)
        new, shared = needed(tree, chain)
        room = self.budget - size
        tree, dropped = prune(tree, max(0, new - room), self.keep, protect=set(shared)) if new > room \
            else (tree, [])
        room = self.budget - len(tree)
        fit = min(len(chain), len(shared) + max(room, 0))             # the copy cut to the room there is
        if fit < len(chain):
            chain = DraftTree.chain(chain.tokens[:fit], source=chain.source[0] if chain.source else "")
        graft(tree, chain)
        tree.info["pruned"] = len(dropped)
        tree.decisions.append(Decision(
            "graft", {"budget": self.budget, "tree": size, "copy": copied, "new": new,
                      "pruned_p": dropped},
            threshold=self.keep, output={"pruned": len(dropped), "grafted": tree.info["grafted"]},
            note=("the copy fit without pruning" if not dropped else
                  f"{len(dropped)} leaf(s) below p = {self.keep} pruned for the copy")))
        return tree
