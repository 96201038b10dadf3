"""flexdraft: the target drafts a block itself, mask rows tuned in its last layers' attention
(FlexDraft, Zhang et al. 2026; the model side and what stays exact: speclab/models/flexdraft.py).

    draft    ONE forward of the target over the pending tokens and k - 1 mask rows, on its own
             cache (models.flexdraft.draft_logits): slot 1 is the target's own next-token
             distribution, slots 2..k the mask rows' guesses, all set in that one forward
    length   FlexDraft's confidence-set verify length: V = #{j : prod_{i <= j} top_i >= theta},
             at least 1, top_i slot i's top probability (`pruning_strategy=cumulative_product`,
             `draft_confidence_threshold` theta, 0.01 by default); the block is cut to V slots
    verify   the target's usual verify of the chain, or `tree=True`: the chain plus each slot's
             next `width - 1` candidates as point-mass leaves (drafters.dllm.slot_candidates)

Lossless: the verify is the target's own, whatever the draft. Under sampling every slot's token is
drawn from its own row's distribution, which depends on the committed text only (the rows are
computed together, none reads another's draw), so each carries its q and the exact rule holds;
slot 1's q is p itself (to rounding), accepted with probability 1.

FlexDraft's parallel form folds the next block's mask rows into the verify forward (a group of masks
per hypothesis "accepted length = g") and recalibrates the chosen group's logits with an MLP over
the bonus token it could not see. speclab runs the sequential form (draft, then verify: the form
FlexDraft's Flex Decoding takes at large batch sizes), where the bonus token is an input row of the
draft forward, so nothing needs recalibrating; the parallel form needs its own verify and is not
built.

Recorded per round: Decision("flexdraft", {"slot", "confidence", "step", "from"}, output=token, at=slot)
per slot ("from": "target" for slot 1, "mask" for the others; step is always 1: one forward fills
the block), and Decision("flexdraft-length", {"cumulative": the products}, theta, output=V).
figures.dllm_draft draws the block above the verify's verdicts, with the round cost and break-even
tau (the view spec's "block filling", shared with dllm-draft).
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import warp
from speclab.decoding.drafters.dllm import slot_candidates
from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import host_read
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision



class FlexDraftDrafter(Drafter):
    name = "flexdraft"

    def __init__(self, target_model, draft, k: int | None = None, theta: float = 0.01, tree: bool = False,
                 width: int = 2):
        super().__init__()
        from speclab.models.flexdraft import FlexDraftAdapter
        if not isinstance(draft, FlexDraftAdapter):
            raise ValueError(f"method 'flexdraft' needs a FlexDraft adapter as its draft (e.g. smollm2-flexdraft), "
                             f"got {_name(draft)}: train one with `speclab train flexdraft --target ...`")
        draft.check_target(target_model, _name(target_model))
        k = draft.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= draft.k:
            raise ValueError(f"flexdraft: k must be an integer in 2..{draft.k} (the target's token plus up to "
                             f"{draft.k - 1} mask slots, the block this adapter was trained for), got {k!r}")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 <= theta < 1:
            raise ValueError(f"flexdraft: theta must be a number in [0, 1) (the verify length's confidence "
                             f"threshold; 0 verifies the whole block), got {theta!r}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"flexdraft: width must be an integer >= 1 (candidates per slot with tree=True), "
                             f"got {width!r}")
        self.adapter, self.k, self.theta, self.tree, self.width = draft, k, float(theta), bool(tree), width

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        if not hasattr(target, "kv") or not hasattr(target, "layers"):
            raise ValueError("flexdraft drafts inside the target on speclab's lean forward (a plain Llama-family "
                             f"target); this target runs on {type(target).__name__}: use backend='auto' or 'lean'")

    @torch.inference_mode()
    def propose(self, ctx: Context) -> DraftTree:
        from speclab.models.flexdraft import draft_logits
        greedy, k = self.sampler.greedy, self.k
        clean = torch.tensor(ctx.ids[len(ctx.ids) - ctx.pending:], device=ctx.device)
        rows = draft_logits(self.target, self.adapter, clean, k - 1)   # (k, V): ONE forward, nothing committed
        self.forwards += 1
        q = rows.softmax(-1) if greedy else warp(rows, self.sampler)
        top = q.max(-1).values
        tok = q.argmax(-1) if greedy else torch.multinomial(q, 1, generator=self.gen)[:, 0]
        tokens, conf, q_tok = host_read(tok, top, top if greedy else q.gather(1, tok[:, None])[:, 0])
        cum, n = 1.0, 0
        products = []
        for c in conf:                          # the confidence set: the longest prefix above theta
            cum *= c
            products.append(round(cum, 5))
            if cum >= self.theta:
                n += 1
            else:
                break
        n = max(1, n)
        tree = DraftTree.chain(tokens[:n], q_tok[:n], "flexdraft", None if greedy else q[:n], k=k, steps=1)
        if self.tree and self.width > 1:
            slot_candidates(tree, q[:n], tokens[:n], self.width)
        if self.record is not None:
            tree.decisions = [Decision(self.name, {"slot": i, "confidence": round(conf[i], 5), "step": 1,
                                                   "from": "target" if i == 0 else "mask"}, output=tokens[i], at=i)
                              for i in range(n)]
            tree.decisions.append(Decision("flexdraft-length", {"cumulative": products}, self.theta, n))
        return tree
