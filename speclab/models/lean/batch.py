"""B sequences in ONE lean-forward cache: the batch backend for the models the lean forward runs.

BatchCausalLM (models/hf.py) gives each sequence a row of a (B, S) cache and pads every
forward to the longest row's input. Here the sequences share one slot space instead: a forward
appends only the rows' real inputs (no padding rows), each at its own sequence's position, and each
row attends to its own sequence's committed slots and, for a draft node, its ancestors (an explicit
visibility mask). Sequence b's committed slots stay in the order it wrote them, so with the fused
bf16 kernel (row by row, every row's keys summed in cache order) a sequence decoded in a batch gets
bit for bit the logits it gets decoded alone, whatever the other sequences do.

Same interface as BatchCausalLM (both are BatchSlots): forward(rows, logits_to_keep) -> (B, T, V),
keep, retain, compact, crowded.
"""
from __future__ import annotations

import torch

from speclab.models.geometry import COMPACT_AT, BatchSlots, row_layout
from speclab.models.lean.forward import LeanLM


class LeanBatchLM(BatchSlots):
    def __init__(self, model, rows: int, name: str = "target", exact: bool = False, lm: LeanLM | None = None):
        super().__init__(model, rows, name)
        # the slot space starts at 512 a sequence and grows (doubling) when compaction is not enough;
        # lm: the forward to run on (the static-shape runner on a GPU), LeanLM by default
        self.lm = lm or LeanLM(model, name, max_len=512 * rows, exact=exact)

    @property
    def width(self) -> int:
        """Slots in use, committed or hidden, over every sequence."""
        return self.lm.n

    def crowded(self) -> bool:
        """Hidden slots (rejected drafts, finished sequences) outnumber the committed ones."""
        return self.width > COMPACT_AT * sum(map(len, self.slots)) + 64

    @torch.inference_mode()
    def forward(self, rows: list[tuple[list[int], list[int] | None, int]],
                logits_to_keep: list[int] | None = None) -> torch.Tensor:
        """rows[b] = (ids, parents, n_prefix) as in CausalLM.forward, one per sequence, each after
        that sequence's committed tokens. Returns logits (B, T, V): row b's first k_b are the logits
        after its last k_b inputs, k_b = logits_to_keep[b] (0, or no list: all len(ids) of them)."""
        lens = [len(ids) for ids, _, _ in rows]
        ks = [k or n for k, n in zip(logits_to_keep or [0] * len(rows), lens)]
        N = sum(lens)
        if self.width + N > self.lm.max_len:
            self.compact()
            if self.width + N > self.lm.max_len:
                self.lm.resize(max(2 * self.lm.max_len, self.width + N))
        S = self.width
        ids_all = torch.tensor([t for ids, _, _ in rows for t in ids], dtype=torch.long)
        pos = torch.zeros(N, dtype=torch.long)
        vis = torch.zeros(N, S + N, dtype=torch.bool)                     # True = may attend
        o, scored = 0, []                                                 # the rows whose logits are kept
        for b, ((_, parents, n_prefix), n, k) in enumerate(zip(rows, lens, ks)):
            vis[o:o + n, self.slots[b]] = True                            # its committed keys only
            offset, see = row_layout(parents, n_prefix, n)
            pos[o:o + n] = len(self.slots[b]) + offset
            vis[o:o + n, S + o:S + o + n] = see
            self.first[b] = S + o
            scored += range(o + n - k, o + n)
            o += n
        score = None if ks == lens else torch.tensor(scored)
        logits = self.lm.forward_rows(ids_all.to(self.device), pos, vis, score)   # (sum ks, V)
        self.forwards += 1
        T = max(ks)
        if min(ks) == T:                            # every sequence the same length (ar): no copy
            return logits.view(len(rows), T, -1)
        out = logits.new_zeros(len(rows), T, logits.shape[-1])
        for b, (start, k) in enumerate(zip(torch.tensor([0] + ks).cumsum(0).tolist(), ks)):
            out[b, :k] = logits[start:start + k]
        return out

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
