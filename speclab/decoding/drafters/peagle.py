"""P-EAGLE (Hui et al. 2026, "P-EAGLE: Parallel-Drafting EAGLE with Scalable Training", arXiv
2602.01469; vLLM's `parallel_drafting`): EAGLE's head drafts the round's k tokens in ONE forward
(speclab.models.peagle has the head's math).

Each round: one forward writes the committed rows the last verify captured into the head's cache as
real entries (their K / V kept, as EAGLE's are) and runs k-1 copies of the learned mask state after
them (Falcon's `root`, drafters/falcon.py): slot 1, the last real entry, guesses depth 1; slot d, a
mask entry at position t+d-1, guesses depth d without seeing the tokens drafted before it. The k
slots' tokens form a chain (greedy: each slot's argmax; sampling: one draw from each slot's
distribution, which the exact rule then tests as any chain's q), and the target verifies it in one
forward: lossless, greedy or sampled. Mask entries are never kept in the cache.

Against eagle-chain (k head forwards a round, each reading the token and the feature the step
before it drafted) the block costs one head forward over k entries, and its later slots guess
blind: where the tokens before them are uncertain they agree less with the target.

Record: a node's source is "peagle.{d}@h{t}" (slot d of the round's forward, fed by the target's
hidden state at t; d > 1 a mask slot); the round's info has DraftShape (shape "parallel", k,
head_forwards 1) and ParallelBlock (the slots' tokens, their q, which slot was a mask entry, the
forwards: 1).

Host reads per round: one (the tokens and their q together).
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import greedy_ids, sample, warp
from speclab.decoding.drafters.falcon import FalconDrafter
from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import check_k, host_read
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.models.peagle import PEagleHead
from speclab.records import DraftShape, ParallelBlock


class PEagleDrafter(FalconDrafter):
    name = "peagle"

    def __init__(self, target_model, draft, k: int = 4):
        if not isinstance(draft, PEagleHead):
            raise ValueError(f"method 'peagle' needs a P-EAGLE head (e.g. code-peagle) as its draft, got "
                             f"{_name(draft)}: train one with `speclab train peagle --target ...`")
        super().__init__(target_model, draft)
        check_k(k)
        if k > draft.k:
            raise ValueError(f"peagle: k={k} but the head {_name(draft)} drafts {draft.k} tokens a forward: use "
                             f"k <= {draft.k}, or train a head with `speclab train peagle --k {k}`")
        self.k = k                              # the round's draft length: the head's first k slots (K = 4 is
                                                # speculators' and code-peagle's block)

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        h, k = self.head, self.k
        o = self.root(ctx)[:k]                                                # (k, C): the one forward
        logits = h.logits(o).float()                                          # (k, N) over the kept ids
        ids = h.lm_head.head_ids
        dists = None
        if self.sampler.greedy:
            j = greedy_ids(logits)
            q = logits.softmax(-1)
            conf, tok = q.gather(-1, j[:, None])[:, 0], ids[j]
            if self.record == "full":                   # the V-wide q the views show
                dists = torch.zeros(k, h.config.vocab_size, device=q.device).index_copy_(1, ids, q)
        else:
            full = torch.full((k, h.config.vocab_size), float("-inf"), device=logits.device)
            dists = warp(full.index_copy_(1, ids, logits), self.sampler)      # (k, V): each slot's own q
            tok = torch.stack([sample(d, self.gen) for d in dists])
            conf = dists.gather(-1, tok[:, None])[:, 0]
        tokens, q_tok = host_read(tok, conf)                                  # the round's one read
        tree = DraftTree.chain(tokens, q_tok, "", dists)
        tree.source = [f"peagle.{d}@h{t}" for d in range(1, k + 1)]
        tree.info.update(DraftShape(shape="parallel", k=k, head_forwards=1).info())
        if self.record is not None:
            tree.info.update(ParallelBlock(pblock_tokens=tokens, pblock_q=[round(c, 5) for c in q_tok],
                                           pblock_mask=[d > 1 for d in range(1, k + 1)], pblock_forwards=1).info())
        return tree
