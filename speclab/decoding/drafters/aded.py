"""ADED (Liu et al., AAAI 2025, *Adaptive Draft-Verification for Efficient Large Language Model
Decoding*): a tri-gram table stands in for the target, and each round a small tree is searched over
it, weighing the most frequent continuation (exploit) against less visited ones (explore).

    table    T[a, b] = {c: count}: how often c followed the bigram (a, b) in the committed text.
             Seeded from the prompt, fed every token committed since (read from ctx.ids at each
             propose, so exactly what the run kept). At most `keep` continuations per bigram, as the
             paper prunes its table to the top 12: a new token in a full row evicts the least
             frequent one (the least recent among ties). Memory grows with the text, never as V^3.
    search   until the tree holds `budget` nodes: a walk from the root (the last two committed
             tokens) down the tree, at each node scoring its `width` most frequent continuations
                 score(c) = P(c | a, b) + c_explore * sqrt(ln(1 + N(node)) / (1 + N(child c)))
             (UCB1; P = count / row total; N = walks through a node in this round's search), then
             descending into the best child already in the tree, or adding it and ending the walk.
             A node at depth k, or whose bigram has no continuation left, is closed to walks.
    choice   a node added is "exploit" when it is its parent's most frequent continuation and
             "explore" otherwise; one trace Decision per node records the bigram, the candidates'
             counts and scores (threshold: the most frequent one's score).

The paper selects with MCTS but its formula and constants are not in what could be read (its code
was not retrievable): the UCB1 score above is speclab's own. The paper's table is built ahead from a
corpus the model generated; here each request starts from its own prompt. Drafts are point masses
(q = 1): the exact rule accepts a node when it is the target's argmax (greedy) or with probability
p(x) (sampling), so the output is identical to `ar`'s.
"""
from __future__ import annotations

import math

from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision

EXPLOIT, EXPLORE = "exploit", "explore"


def _positive_int(name: str, v, what: str):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"aded: {name} must be an integer >= 1 ({what}), got {v!r}")


class AdedDrafter(Drafter):
    name = "aded"

    def __init__(self, k: int = 5, width: int = 3, budget: int | None = None, c_explore: float = 1.0,
                 keep: int = 12):
        super().__init__()
        _positive_int("k", k, "the tree's depth")
        _positive_int("width", width, "continuations scored per node")
        _positive_int("keep", keep, "continuations kept per bigram; the paper keeps 12")
        if budget is not None:
            _positive_int("budget", budget, "draft nodes per round; None for k")
        if isinstance(c_explore, bool) or not isinstance(c_explore, (int, float)) or not 0 <= c_explore < math.inf:
            raise ValueError(f"aded: c_explore must be a finite number >= 0 (0 always drafts the most frequent "
                             f"continuation), got {c_explore!r}")
        if width > keep:
            raise ValueError(f"aded: width ({width}) must be <= keep ({keep}): a node scores at most the "
                             f"continuations its bigram keeps; raise keep or lower width")
        self.k, self.width, self.keep, self.c = k, width, keep, float(c_explore)
        self.budget = budget or k          # a verify of 1 + k rows, as a chain of k would cost

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.table: dict[tuple[int, int], dict[int, int]] = {}
        self.fed = 0
        self.learn(ctx.ids)                                     # seeded from the prompt

    def count(self, a: int, b: int, c: int):
        """One tri-gram (a, b) -> c seen: its row keeps insertion order = least recent first."""
        row = self.table.setdefault((a, b), {})
        n = row.pop(c, 0)
        if not n and len(row) >= self.keep:
            del row[min(row, key=row.get)]                      # least frequent; least recent among ties
        row[c] = n + 1

    def learn(self, ids: list[int]) -> int:
        """Count the tri-grams ending in tokens not yet fed; returns how many."""
        start = max(2, self.fed)
        for i in range(start, len(ids)):
            self.count(ids[i - 2], ids[i - 1], ids[i])
        self.fed = len(ids)
        return max(0, len(ids) - start)

    def candidates(self, bigram: tuple[int, int]) -> tuple[list[tuple[int, int]], int]:
        """The bigram's `width` most frequent continuations [(token, count)] (most recent first among
        ties) and the row's total count."""
        row = self.table.get(bigram, {})
        top = sorted(reversed(row.items()), key=lambda tc: tc[1], reverse=True)[: self.width]
        return top, sum(row.values())

    def propose(self, ctx: Context) -> DraftTree:
        learned = self.learn(ctx.ids)
        tree = DraftTree(info={"learned": learned, "bigrams": len(self.table)})
        if len(ctx.ids) < 2:
            return tree
        bigram, depth = {-1: (ctx.ids[-2], ctx.ids[-1])}, {-1: 0}      # node -> its last two tokens
        kids: dict[int, dict[int, int]] = {}                              # node -> {token: child node}
        visits: dict[int, int] = {-1: 0}
        closed: set[int] = set()
        while len(tree) < self.budget and -1 not in closed:
            node = -1
            while True:                                                   # one walk
                cands, total = self.candidates(bigram[node])
                child_of = kids.setdefault(node, {})
                open_ = [(c, n) for c, n in cands if child_of.get(c) not in closed]
                if depth[node] == self.k or not open_:
                    closed.add(node)
                    break
                scores = {c: n / total + self.c * math.sqrt(math.log(1 + visits[node]) /
                                                           (1 + visits.get(child_of.get(c), 0)))
                          for c, n in cands}
                c = max(open_, key=lambda cn: scores[cn[0]])[0]          # ties: the more frequent
                visits[node] += 1
                if c in child_of:                                         # descend
                    node = child_of[c]
                    continue
                choice = EXPLOIT if c == cands[0][0] else EXPLORE         # expand, and end the walk
                new = tree.add(c, node, 1.0, choice)
                child_of[c] = new
                bigram[new], depth[new], visits[new] = (bigram[node][1], c), depth[node] + 1, 1
                if self.record is not None:
                    tree.decisions.append(Decision(
                        self.name, {"score": round(scores[c], 6), "bigram": list(bigram[node]),
                                    "counts": [[t, n] for t, n in cands],
                                    "scores": [[t, round(scores[t], 6)] for t, _ in cands],
                                    "visits": visits[node] - 1},
                        threshold=round(scores[cands[0][0]], 6), output=choice, at=new,
                        note="" if child_of.get(cands[0][0]) not in closed else "most frequent closed"))
                break
        tree.info |= {EXPLOIT: tree.source.count(EXPLOIT), EXPLORE: tree.source.count(EXPLORE)}
        return tree
