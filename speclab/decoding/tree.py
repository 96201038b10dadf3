"""Draft trees: what a Drafter proposes. A chain is a tree of width one.

Nodes are stored in topological order (a parent before its children); parent -1 means a child of
the last committed token. `q` holds, per node, the draft distribution (V,) that node's CHILDREN were
sampled from (None for point-mass children: n-gram, lookup, argmax drafts).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q_root: torch.Tensor | None = None            # (V,) dist the root's children came from
    q_children: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> (V,) dist
    q_tok: list[float | None] = field(default_factory=list)  # draft prob of each node's token
    source: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)       # policy decisions for the trace (k, layer, ...)
    decisions: list = field(default_factory=list)  # trace.Decision records of the drafter's own choices

    def __len__(self):
        return len(self.tokens)

    def add(self, token: int, parent: int = -1, q: float | None = None, source: str = "") -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.q_tok.append(q)
        self.source.append(source)
        return len(self.tokens) - 1

    @classmethod
    def chain(cls, tokens, q_tok=None, source: str = "", q_dists: torch.Tensor | None = None, **info):
        """A chain; q_dists (k, V): the draft distribution each token was sampled from."""
        t = cls(info=info)
        for i, tok in enumerate(tokens):
            t.add(tok, i - 1, None if q_tok is None else q_tok[i], source)
        if q_dists is not None:
            for i in range(len(tokens)):
                t.set_q(i - 1, q_dists[i])
        return t

    def set_q(self, node: int, dist: torch.Tensor):
        if node < 0:
            self.q_root = dist
        else:
            self.q_children[node] = dist

    def q_map(self) -> dict[int, torch.Tensor]:
        m = dict(self.q_children)
        if self.q_root is not None:
            m[-1] = self.q_root
        return m

    def children(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            kids.setdefault(p, []).append(i)
        return kids

    def depths(self) -> list[int]:
        d = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def validate(self, vocab_size: int):
        """Clear errors for malformed trees from user drafters."""
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"draft tree has {len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, (tok, p) in enumerate(zip(self.tokens, self.parents)):
            if not -1 <= p < i:
                kind = "a cycle or forward reference" if p >= i else "a dangling parent"
                raise ValueError(f"draft tree node {i} has parent {p} ({kind}): parents must be -1 "
                                 "or the index of an earlier node")
            if not 0 <= tok < vocab_size:
                raise ValueError(f"draft tree node {i} has token {tok}, outside the vocabulary (0..{vocab_size - 1})")

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]
