"""B sequences in ONE lean-forward cache: the batch backend for plain Llama models.

BatchCausalLM (models/causal.py) gives each sequence a row of a (B, S) cache and pads every
forward to the longest row's input. Here the sequences share one slot space instead: a forward
appends only the rows' real inputs (no padding rows), each at its own sequence's position, and each
row attends to its own sequence's committed slots and, for a draft node, its ancestors (an explicit
visibility mask). Sequence b's committed slots stay in the order it wrote them, so with the fused
bf16 kernel (row by row, every row's keys summed in cache order) a sequence decoded in a batch gets
bit for bit the logits it gets decoded alone, whatever the other sequences do.

Same interface as BatchCausalLM: forward(rows) -> (B, T, V), keep, retain, compact, crowded.
"""
from __future__ import annotations

import torch

from speclab.models import causal
from speclab.models.causal import is_chain, tree_depths_and_visibility
from speclab.models.fast_llama import FastLlama


class FastBatchLM:
    def __init__(self, model, rows: int, name: str = "target", exact: bool = False):
        # the slot space starts at 512 a sequence and grows (doubling) when compaction is not enough
        self.lm = FastLlama(model, name, max_len=512 * rows, exact=exact)
        self.model, self.name, self.device, self.dtype = model, name, self.lm.device, self.lm.dtype
        self.slots: list[list[int]] = [[] for _ in range(rows)]   # sequence b's committed slots, in order
        self.first: list[int] = [0] * rows      # the first slot sequence b's inputs took in the last forward
        self.forwards = 0

    @property
    def config(self):
        return self.model.config

    @property
    def width(self) -> int:
        """Slots in use, committed or hidden, over every sequence."""
        return self.lm.n

    def length(self, row: int) -> int:
        return len(self.slots[row])

    def crowded(self) -> bool:
        """Hidden slots (rejected drafts, finished sequences) outnumber the committed ones."""
        return self.width > causal.COMPACT_AT * sum(map(len, self.slots)) + 64

    @torch.inference_mode()
    def forward(self, rows: list[tuple[list[int], list[int] | None, int]]) -> torch.Tensor:
        """rows[b] = (ids, parents, n_prefix) as in CausalLM.forward, one per sequence, each after
        that sequence's committed tokens. Returns logits (B, T, V); row b's first len(ids) are its own."""
        N = sum(len(ids) for ids, _, _ in rows)
        if self.width + N > self.lm.max_len:
            self.compact()
            if self.width + N > self.lm.max_len:
                self.lm.resize(max(2 * self.lm.max_len, self.width + N))
        S = self.width
        ids_all = torch.tensor([t for ids, _, _ in rows for t in ids], dtype=torch.long)
        pos = torch.zeros(N, dtype=torch.long)
        vis = torch.zeros(N, S + N, dtype=torch.bool)                     # True = may attend
        o = 0
        for b, (ids, parents, n_prefix) in enumerate(rows):
            n, past = len(ids), len(self.slots[b])
            vis[o:o + n, self.slots[b]] = True                            # its committed keys only
            if parents is None or is_chain(parents):
                pos[o:o + n] = past + torch.arange(n)
                vis[o:o + n, S + o:S + o + n] = torch.ones(n, n, dtype=torch.bool).tril()
            else:
                depth, see = tree_depths_and_visibility(parents, n_prefix, 0)      # see (n, n)
                pos[o:o + n] = past + torch.cat([torch.arange(n_prefix), n_prefix - 1 + depth])
                vis[o:o + n, S + o:S + o + n] = see
            self.first[b] = S + o
            o += n
        logits = self.lm.forward_rows(ids_all.to(self.device), pos, vis)          # (N, V)
        T = max(len(ids) for ids, _, _ in rows)
        out = logits.new_zeros(len(rows), T, logits.shape[-1])
        o = 0
        for b, (ids, _, _) in enumerate(rows):
            out[b, :len(ids)] = logits[o:o + len(ids)]
            o += len(ids)
        self.forwards += 1
        return out

    def keep(self, row: int, n_prefix: int, path: list[int]):
        """Commit, for `row`, the first n_prefix inputs of the last forward and the tree slots `path`."""
        f = self.first[row]
        self.slots[row] += [f + i for i in range(n_prefix)] + [f + n_prefix + i for i in path]

    def retain(self, rows: list[int]):
        """Keep only these sequences (finished ones leave; their slots are hidden until compact)."""
        self.slots = [self.slots[r] for r in rows]
        self.first = [self.first[r] for r in rows]

    def compact(self):
        """Gather every sequence's committed slots to the front, each in its own order."""
        idx = torch.tensor([s for slots in self.slots for s in slots], dtype=torch.long, device=self.device)
        kv = self.lm.kv
        kv[:, :, :, :len(idx)] = kv[:, :, :, idx]
        self.lm.n = len(idx)
        start = 0
        for b, slots in enumerate(self.slots):
            self.slots[b] = list(range(start, start + len(slots)))
            start += len(slots)
