"""hidden-transfer: pseudo hidden states for the next positions, run through the target's own upper
layers (Hidden Transfer, Wu et al. 2024; the transfer layers' math: speclab/models/hidden_transfer.py).

    capture  every verify forward keeps the target's state h_l after its first l layers at the
             rows it commits (capture_layers: reading it costs nothing)
    transfer K linear maps turn h_l[t], t the last committed position, into pseudo states for
             positions t+1..t+K
    draft    ONE forward of the target's layers l+1..L over the K pseudo rows (a skip set of layers
             1..l, the rows as input vectors), on the target's own cache: each row attends to the
             committed text's keys and values in those layers and to the rows before it; the slots
             it writes are dropped before the verify. Row j's logits predict token t+1+j (token t+1
             is the one the target wrote, pending)
    tree     grown by cumulative draft probability under a node budget (grow_dynamic, EAGLE-2's
             rule): a node at depth d takes its children from row d+1, whatever its own token (the
             rows read no drafted token, as Medusa's heads read none)
    verify   the target's usual tree verify: lossless, greedy or sampled (the children are top-k
             choices, point-mass drafts, verified by recursive rejection)

The paper runs the pseudo rows inside the verify forward itself (each tree node gets its own pseudo
rows, so one forward verifies this round and drafts the next). speclab runs them as a separate
draft step after the verify: the same inputs (h_l at the last accepted position, the committed text
in the upper layers' cache), one extra forward of L - l layers over K rows per round, and no change
to the engine's verify.

Recorded: TransferPrediction per round (speclab.records: the layer, the output index offset 1
predicts, each offset's top-1 [token, probability] with recording on); figures.hidden_transfer draws
each offset's top-1 agreement with what the target then wrote.
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import host_read
from speclab.decoding.drafters.trees import check_budget, grow_dynamic
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree
from speclab.models.lean.skips import SkipSet
from speclab.records import TransferPrediction


class HiddenTransferDrafter(Drafter):
    name = "hidden-transfer"

    def __init__(self, target_model, draft, budget: int = 5, width: int = 3, depth: int | None = None,
                 threshold: float | None = None):
        super().__init__()
        from speclab.models.hidden_transfer import HiddenTransfer
        if not isinstance(draft, HiddenTransfer):
            raise ValueError(f"method 'hidden-transfer' needs transfer layers as its draft (e.g. "
                             f"code-hidden-transfer), got {_name(draft)}: train them with `speclab train hidden-transfer --target ...`")
        draft.check_target(target_model, _name(target_model))
        depth = draft.k if depth is None else depth
        check_budget(budget, width, depth, threshold)
        if depth > draft.k:
            raise ValueError(f"hidden-transfer depth {depth} needs {depth} future positions but {_name(draft)} "
                             f"transfers {draft.k}: use depth <= {draft.k}")
        self.transfer, self.layer = draft, draft.layer
        self.budget, self.width, self.depth, self.threshold = budget, width, depth, threshold
        self.skip = SkipSet.layers(range(draft.layer))          # the pseudo rows start at layer l+1

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        if not hasattr(target, "kv") or not hasattr(target, "layers"):
            raise ValueError("hidden-transfer runs the target's upper layers on speclab's lean forward (a plain "
                             f"Llama-family target); this target runs on {type(target).__name__}: use backend='auto' "
                             "or 'lean'")
        self.captures = target.capture_layers
        if self.layer not in self.captures:
            target.capture_layers = (*self.captures, self.layer)
        self.h = None                           # (1, C): the state after layer l at the last committed position

    def end(self):
        self.target.capture_layers = self.captures
        self.h = None

    def observe(self, out: Outcome):
        h = self.target.captured.get(self.layer)
        if h is None:
            raise RuntimeError("the target forward did not capture its state after layer "
                               f"{self.layer}; its backend must support capture_layers")
        last = out.n_pending + out.path[-1] if out.path else out.n_pending - 1     # the last committed row
        self.h = h[0, last:last + 1]

    def pseudo_logits(self) -> torch.Tensor:
        """(K, V) float32: the K pseudo rows through layers l+1..L, on the target's cache (its slots
        past the committed text written, then dropped; its forward count unchanged: a draft call)."""
        tgt = self.target
        base, counted = tgt.length, tgt.forwards
        s = self.transfer(self.h.to(self.transfer.weight.dtype))[0]                 # (K, C)
        logits = tgt.forward(None, embeds=s, skip=self.skip)
        tgt.keep(base)
        tgt.forwards = counted
        self.forwards += 1
        return logits

    @torch.inference_mode()
    def propose(self, ctx: Context) -> DraftTree:
        if self.h is None:                      # first round: the prompt has no states yet
            return DraftTree()
        P = self.rows = self.pseudo_logits().softmax(-1)                             # (K, V)
        last = P.shape[0] - 1

        def q_at(tree: DraftTree) -> torch.Tensor:
            """(1 + N, V): the root's children from row 1, a depth-d node's from row d+1."""
            rows = [0] + [min(d, last) for d in tree.depths()]
            return P[torch.tensor(rows, device=P.device)]
        t = len(ctx.ids) - 2                                                         # the state's position
        tree = grow_dynamic(self.budget, self.width, self.depth, q_at, label=lambda d: f"transfer{d}@h{t}",
                            threshold=self.threshold)
        rec = TransferPrediction(transfer_layer=self.layer)
        if self.record is not None:
            top = P.max(-1)
            toks, probs = host_read(top.indices, top.values)
            rec = TransferPrediction(transfer_layer=self.layer, transfer_at=len(ctx.ids) - ctx.n_prompt,
                                     transfer_pred=[[int(a), round(float(b), 5)] for a, b in zip(toks, probs)])
        tree.info.update(rec.info())
        return tree
