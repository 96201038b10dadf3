"""Lookahead decoding (Fu et al.): Jacobi iteration in a lookahead branch fills an n-gram pool;
n-grams from the pool that start with the last committed token are verified.

Each round's tree has two kinds of branches from the root, all verified in the same forward:
  - pool candidates: up to `guesses` n-grams (n - 1 tokens each) keyed by the last token;
  - the Jacobi window: W guess tokens as a chain. Its target argmaxes are the next Jacobi
    iterate, and diagonals through the last `n - 1` iterates become new n-grams (as LADE does).
The window is also verified like any branch, so a converged Jacobi guess is accepted directly.
Drafts are point masses (q = 1).
"""
from __future__ import annotations

from collections import deque

from speclab.decoding.acceptance import greedy_ids
from speclab.decoding.drafters.model import check_k
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree


class LookaheadDrafter(Drafter):
    name = "lookahead"

    def __init__(self, window: int = 5, ngram: int = 4, guesses: int = 2, pool_size: int = 8):
        super().__init__()
        check_k(window, "window")
        if type(ngram) is not int or ngram < 2:
            raise ValueError(f"ngram must be an integer >= 2, got {ngram}")
        for name, v in (("guesses", guesses), ("pool_size", pool_size)):
            if type(v) is not int or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        self.W, self.N, self.G, self.pool_size = window, ngram, guesses, pool_size

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        # initial Jacobi window: tokens from the prompt (any guess works; better ones converge sooner)
        tail = ctx.ids[-self.W:]
        self.window = (tail * self.W)[: self.W]
        self.levels: deque[list[int]] = deque(maxlen=self.N - 1)
        self._add_output_ngrams(ctx.ids, 0)

    def _add(self, key: int, gram: tuple[int, ...]):
        grams = self.pool.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        grams.insert(0, gram)            # most recent first
        del grams[self.pool_size:]

    def _add_output_ngrams(self, ids: list[int], start: int):
        for j in range(max(0, start - self.N + 1), len(ids) - self.N + 1):
            self._add(ids[j], tuple(ids[j + 1: j + self.N]))

    def propose(self, ctx: Context) -> DraftTree:
        tree = DraftTree(info={"window": self.W, "ngram": self.N})
        self.ctx = ctx
        last = ctx.ids[-1]
        for gram in self.pool.get(last, [])[: self.G]:           # candidates, merged into a trie
            parent = -1
            for tok in gram:
                kids = [i for i, p in enumerate(tree.parents) if p == parent and tree.tokens[i] == tok]
                parent = kids[0] if kids else tree.add(tok, parent, 1.0, "pool")
        self.window_nodes = []
        parent = -1
        for tok in self.window:                                  # the Jacobi branch
            parent = tree.add(tok, parent, 1.0, "jacobi")
            self.window_nodes.append(parent)
        return tree

    def observe(self, out: Outcome):
        # next Jacobi iterate: argmax after the root, then after each window node but the last
        rows = [out.n_pending - 1] + [out.n_pending + i for i in self.window_nodes[:-1]]
        new = greedy_ids(out.logits_at(rows)).tolist()
        self.levels.append(new)
        if len(self.levels) == self.N - 1:                       # diagonals -> n-grams
            lv = list(self.levels)
            for i in range(self.W - self.N + 2):
                gram = [lv[j][i + j] for j in range(self.N - 1)]
                if i + self.N - 1 < len(new):
                    gram.append(new[i + self.N - 1])
                if len(gram) == self.N:
                    self._add(gram[0], tuple(gram[1:]))
        committed = len(out.path) + 1
        self.window = new[committed:] + new[-1:] * committed    # shift past what was committed
        full = self.ctx.ids + out.accepted_tokens + [out.emitted]   # committed text feeds the pool
        self._add_output_ngrams(full, len(self.ctx.ids))
