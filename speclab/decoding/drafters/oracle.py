"""The oracle: a drafter that knows the answer. What a perfect draft of length k would reach.

oracle   drafts the next k tokens of a reference continuation of the prompt: by default `ar`'s own
         output, decoded first (speclab.generate does it, outside the run's timing). Under greedy
         decoding every draft is then the target's own choice, so each round commits k + 1 tokens
         and the run's speed-up over `ar` is the engine's ceiling at that draft length on this
         machine: one verify of k + 1 rows and the round's own overhead per k + 1 tokens, with no
         draft cost. A real drafter's speed-up divided by it says how much of the ceiling its
         agreement reaches. Under sampling its drafts are point masses on the reference's tokens,
         accepted with the target's probability of them, like any copying drafter's: lossless.

If the text leaves the reference (another backend or dtype rounded a near-tie the other way), the
oracle stops drafting for the rest of the run: it has nothing right to offer.
"""
from __future__ import annotations

from speclab.decoding.drafters.model import check_k
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree


class OracleDrafter(Drafter):
    name = "oracle"

    def __init__(self, reference: list[int], k: int = 5):
        super().__init__()
        check_k(k)
        if not isinstance(reference, (list, tuple)) or not all(isinstance(t, int) and t >= 0 for t in reference):
            raise ValueError("reference must be a list of token ids (the continuation to draft, e.g. ar's output "
                             f"ids), got {type(reference).__name__}")
        self.reference, self.k = list(reference), k

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.checked = 0                    # new tokens compared with the reference so far
        self.off = False                    # the text left the reference

    def propose(self, ctx: Context) -> DraftTree:
        new = ctx.ids[ctx.n_prompt:]        # committed new tokens, the pending one included
        if not self.off:
            self.off = new[self.checked:] != self.reference[self.checked:len(new)]
            self.checked = len(new)
        if self.off:
            return DraftTree(info={"off_reference": True})
        cont = self.reference[len(new):len(new) + self.k]
        return DraftTree.chain(cont, [1.0] * len(cont), f"reference@{len(new)}")
