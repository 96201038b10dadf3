"""RASD (Retrieval-Augmented Speculative Decoding, Quan et al., Findings of ACL 2025): a retrieval
tree pruned by the draft's probabilities, fused with the draft's own tree into one tree to verify.

Each round, three steps after the EAGLE head has grown its dynamic tree (drafters/heads.py,
`EagleDrafter`, the draft here):

  retrieve  the longest suffix of the context seen before, in the prompt and the text so far or,
            given a `history` the caller owns, in its earlier requests (SuffixDrafter's automaton,
            drafters/lookup.py); the continuations seen after it form the retrieval tree, best-first
            by how often each followed its parent, up to `retrieval` nodes
  prune     the head's distribution q over the first new token (its root, which drafting computed
            anyway) judges each branch of the retrieval tree: a branch whose first token has
            q(x) < `prune` goes with everything below it; the rest are kept
  fuse      longest prefix matching: each kept retrieval path walks down the head's tree as far as
            its tokens are already there (those nodes become "both") and hangs its remaining tokens
            below (new "retrieval" nodes): one tree, one verify, no two siblings alike

Every node's source names its origin: "draft:h41+1" (the head, on the target's state at 41, one
step on), "retrieval:self" / "retrieval:history" (the automaton matched the request's own text or
the caller's history), "both:h41+1" (the head drafted it and retrieval found it too).

Lossless under greedy decoding and under sampling. The tree is a function of the committed text
only, and it tells the rule no q (the head's top-k children are not samples of q, and a retrieved
token has no draft distribution at all): every node is a point mass, so the verify walks it by
recursive rejection without replacement (accept x with the residual's p(x), else remove x and
renormalise; acceptance.py), whose law is the target's whatever candidates are tried
(tests/test_rasd.py draws it, and catches the variant that tests the root's children, drafted and
retrieved, as samples of the head's q).

Recorded per round: a RetrievalFusion record (nodes found, pruned, shared with the head's tree,
added), one Decision "rasd-prune" per retrieval branch (its first token, the head's q there and
the branch's size; threshold `prune`; output kept or pruned) and one Decision "rasd-fuse" (the
tree sizes in; shared and added out). The "retrieval fusion" figure draws the fused tree coloured
by source, with the pruned branches beside it.
"""
from __future__ import annotations

import math

import torch

from speclab.decoding.drafters.heads import EagleDrafter
from speclab.decoding.drafters.lookup import SuffixDrafter, SuffixHistory
from speclab.decoding.drafters.model import check_k
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.records import RetrievalFusion
from speclab.trace import Decision

DRAFT, RETRIEVAL, BOTH = "draft", "retrieval", "both"      # a fused node's origins (its source's prefix)


def origin(source: str) -> str:
    """A fused node's origin from its source: "draft", "retrieval" or "both" ("" for another)."""
    head = source.split(":", 1)[0]
    return head if head in (DRAFT, RETRIEVAL, BOTH) else ""


def branches(tree: DraftTree) -> dict[int, list[int]]:
    """Each child of the root -> its branch (itself and everything below it), in node order."""
    top: dict[int, int] = {}
    out: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        top[i] = i if p < 0 else top[p]
        out.setdefault(top[i], []).append(i)
    return out


def prune_retrieval(tree: DraftTree, q_first: dict[int, float], prune: float) -> tuple[set[int], list[Decision]]:
    """The retrieval tree's nodes kept, and one Decision per branch: a branch whose first token x has
    draft probability q_first[x] < prune is pruned whole (a token the draft cannot emit has q 0)."""
    kept: set[int] = set()
    decisions = []
    for first, nodes in branches(tree).items():
        x = tree.tokens[first]
        q = q_first.get(x, 0.0)
        keep = q >= prune
        if keep:
            kept.update(nodes)
        decisions.append(Decision("rasd-prune", {"token": x, "q": round(q, 6), "nodes": len(nodes)},
                                  threshold=prune, output="kept" if keep else "pruned"))
    return kept, decisions


def fuse(head: DraftTree, found: DraftTree, kept: set[int]) -> tuple[DraftTree, dict[int, int], int]:
    """Longest prefix matching: the head's tree with every kept path of `found` merged in. A
    retrieval node whose parent's fused node already has a child with its token becomes that node
    (its source "both"); otherwise it is added there ("retrieval"). Returns the fused tree, each kept
    retrieval node's fused node, and how many of them were shared."""
    out = DraftTree(q_root=head.q_root, info=dict(head.info), decisions=list(head.decisions))
    for i in range(len(head)):
        out.add(head.tokens[i], head.parents[i], head.q_tok[i], f"{DRAFT}:{head.source[i]}")
    kids = out.children()
    where, shared = {-1: -1}, 0
    for i in range(len(found)):                     # topological: a parent is placed before its children
        if i not in kept:
            continue
        par, tok = where[found.parents[i]], found.tokens[i]
        same = next((c for c in kids.get(par, []) if out.tokens[c] == tok), None)
        if same is not None:
            if origin(out.source[same]) == DRAFT:
                out.source[same] = BOTH + out.source[same][len(DRAFT):]
                shared += 1
            where[i] = same
        else:
            where[i] = out.add(tok, par, None, found.source[i].replace("suffix:", f"{RETRIEVAL}:"))
            kids.setdefault(par, []).append(where[i])
    return out, where, shared


class RASDDrafter(EagleDrafter):
    """EAGLE-2's tree fused with a retrieval tree that the head's q has pruned (RASD)."""
    name = "rasd"

    def __init__(self, target_model, draft, budget: int = 5, width: int = 3, depth: int = 3,
                 vocab: int | None = None, threshold: float | None = 0.2, retrieval: int = 8,
                 min_match: int = 2, prune: float = 0.05, history: SuffixHistory | None = None, key=None):
        if isinstance(prune, bool) or not isinstance(prune, (int, float)) or not math.isfinite(prune) \
                or not 0.0 <= prune <= 1.0:
            raise ValueError(f"rasd's prune is a draft probability in [0, 1] (a retrieved branch whose first token "
                             f"the head gives less is pruned), got {prune!r}")
        check_k(retrieval, "retrieval")
        check_k(min_match, "min_match")
        super().__init__(target_model, draft, budget=budget, width=width, depth=depth, vocab=vocab,
                         threshold=threshold)
        self.prune, self.retrieval = float(prune), retrieval
        # factor = retrieval: the tree is `retrieval` nodes whatever the match's length; min_prob 0: the
        # draft, not the frequencies, decides what is kept
        self.retriever = SuffixDrafter(max_k=retrieval, factor=float(retrieval), min_match=min_match,
                                       history=history, key=key, tree=True, min_prob=0.0)
        self.pos = torch.full((self.in_head.numel(),), -1, dtype=torch.long)   # token id -> its row in the head
        ids = self.lm.head_ids
        ids = torch.arange(len(self.pos)) if ids is None else ids.cpu()
        self.pos[ids] = torch.arange(len(ids))

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.retriever.begin(ctx, target, sampler, gen, None)     # its per-node decisions are not RASD's
        self.root_logits = None

    def end(self):
        super().end()
        self.retriever.end()                                       # this request joins the caller's history

    def feed(self, ctx: Context, **kw):
        logits, out = super().feed(ctx, **kw)
        self.root_logits = logits                  # (N,): the head over its own ids, the first new token
        return logits, out

    def q_first(self, tokens: list[int]) -> dict[int, float]:
        """The head's q at the root for `tokens` (0 for a token outside its vocabulary): one read."""
        rows = self.pos[torch.tensor(tokens, dtype=torch.long)]
        probs = self.root_logits.float().softmax(-1)
        got = probs[rows.clamp_min(0).to(probs.device)].tolist()
        return {t: (g if r >= 0 else 0.0) for t, r, g in zip(tokens, rows.tolist(), got)}

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        head = super().draft_at(ctx, t)
        found = self.retriever.propose(ctx)
        match = int(found.info.get("match", 0))
        if not len(found):
            out, _, _ = fuse(head, found, set())
            out.info.update(RetrievalFusion(rasd_match=match, rasd_found=0).info())
            return out
        firsts = sorted({found.tokens[i] for i, p in enumerate(found.parents) if p < 0})
        kept, decisions = prune_retrieval(found, self.q_first(firsts), self.prune)
        out, where, shared = fuse(head, found, kept)
        first_of = {found.tokens[i]: where.get(i) for i, p in enumerate(found.parents) if p < 0}
        for d in decisions:
            d.at = first_of.get(d.inputs["token"])       # the fused node a kept branch starts at
        added = len(out) - len(head)
        out.info.update(RetrievalFusion(rasd_match=match, rasd_found=len(found), rasd_pruned=len(found) - len(kept),
                                        rasd_shared=shared, rasd_added=added).info())
        if self.record is not None:
            out.decisions += decisions
            out.decisions.append(Decision(
                "rasd-fuse", {"draft": len(head), "retrieved": len(kept), "match": match},
                output={"shared": shared, "added": added, "tree": len(out)},
                note=f"{shared} retrieved node(s) already in the draft's tree, {added} hung below it"))
        return out
