"""dllm-draft: a block-diffusion LM drafts a block of k tokens, the target verifies it (the second
form of a diffusion drafter: DFlash, Chen, Liang, Liu 2026, and FlexDraft, Zhang et al. 2026, draft a
block in parallel from a mask canvas and verify it autoregressively; here the drafter is speclab's
own block-diffusion adapter, a same-size second model with its own cache, not a head on the target).

    block    after the committed text, k mask slots: one canvas of a block-causal dLLM (models.dllm
             BlockDenoiser). Committed text is plainly causal there, so its keys / values are cached
             exactly as an AR pass caches them and a block may start at any position: each round
             runs only the tokens committed since the last round plus the canvas, and keeps the
             committed ones (the canvas's keys / values are dropped after every forward, so nothing
             is ever rolled back). Shifted outputs: slot 0 is read at the last committed token.
    fill     `steps` denoising forwards; step s commits num_transfer(k, steps)[s] slots (LLaDA's
             schedule), the most confident first (`order="confidence"`, as the diffusion policies
             do) or the leftmost (`order="left"`). A slot's confidence is the top probability of its
             distribution, never the drawn token's: under sampling the choice must not depend on the
             draw. steps=1 is DFlash's one parallel forward; steps=k one slot per forward.
    verify   a chain (default), or `tree=True`: the chain plus each slot's next `width - 1` candidates
             as leaves under the chain node before it (point masses).

Lossless. Greedy: the verify keeps the target's argmax, so the output is ar's token for token.
Sampling: a drafted token carries q (its slot's distribution at the step that set it) where the
exact rule's proof holds: every slot to its left was set at the same or an earlier step and every
slot to its right at the same or a later one (then it was drawn from q given everything the verify
has seen before it). A slot filled out of that order (confidence order, steps > 1) was drawn from a
q that depends on a later draft token, or an earlier draft token depends on it: conditioning on the
accepted prefix would bias it, so it goes to the verify as a point mass (accepted with probability
p(x)), which is exact whatever chose it. `order="left"` and steps=1 carry q at every slot.

Recorded per slot: Decision("dllm-draft", {"slot", "confidence", "step"}, output=token, at=slot);
figures.dllm_draft draws the block being filled over the verify's verdicts, with the round cost and
the break-even tau (figures.dllm_draft.block_cost).
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import warp
from speclab.decoding.diffusion import never_propose_mask
from speclab.decoding.dllm_policies import num_transfer
from speclab.decoding.drafters.model import check_k, host_read
from speclab.decoding.speculative import Context, Drafter, forwards_of
from speclab.decoding.tree import DraftTree
from speclab.models.dllm import BlockDenoiser, is_block_causal
from speclab.trace import Decision

ORDERS = ("confidence", "left")


class DllmDrafter(Drafter):
    name = "dllm-draft"

    def __init__(self, draft, k: int = 4, steps: int = 1, order: str = "confidence", tree: bool = False,
                 width: int = 2, backend: str = "auto"):
        super().__init__()
        check_k(k)
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= k:
            raise ValueError(f"dllm-draft: steps must be an integer in 1..k={k} (denoising forwards a block), "
                             f"got {steps!r}")
        if order not in ORDERS:
            raise ValueError(f"dllm-draft: order must be one of {', '.join(ORDERS)}, got {order!r}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"dllm-draft: width must be an integer >= 1 (candidates per slot with tree=True), "
                             f"got {width!r}")
        if not is_block_causal(draft):
            name = getattr(draft, "name_or_path", type(draft).__name__)
            raise ValueError(f"dllm-draft drafts with a block-diffusion LM (speclab_block_causal in its config, "
                             f"e.g. smollm2-dllm for smollm2-135m); {name} is not one: use draft-model for a "
                             f"causal draft")
        self.den = BlockDenoiser(draft, backend)
        self.lm = self.den.lean             # the runner the trace names (speculative.with_runners)
        self.k, self.steps, self.order, self.tree, self.width = k, steps, order, bool(tree), width
        self.schedule = num_transfer(k, steps)

    forwards = forwards_of("den")

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.den.start(0, self.k)           # an empty cache; blocks of k (each round sets where its block starts)

    @torch.inference_mode()
    def propose(self, ctx: Context) -> DraftTree:
        den, k, greedy = self.den, self.k, self.sampler.greedy
        lo = len(ctx.ids)
        den.P = lo                          # this round's block: the k slots after the committed text
        x = torch.tensor(ctx.ids + [den.mask_id] * k, device=ctx.device)
        canvas = x[lo:]                                                 # (k,) a view: commits write x
        keep_q = not greedy or self.tree    # the rule or the tree's candidates read each slot's q
        dists = torch.zeros(k, den.model.config.vocab_size, device=ctx.device) if keep_q else None   # (k, V)
        confs = torch.zeros(k, device=ctx.device)
        left = list(range(k))                                           # slots still masked, on the host
        set_at = [0] * k
        for s, n in enumerate(self.schedule):
            rows = never_propose_mask(den.block_logits(x), den.mask_id)  # (k, V): ONE forward
            q = rows.softmax(-1) if greedy else warp(rows, self.sampler)
            top = q.max(-1).values                                      # (k,) the slot's confidence
            if self.order == "left" or n == len(left):
                chosen = left[:n]
                pick = torch.tensor(chosen, device=x.device)
            else:                               # the n most confident masked slots; ties: the leftmost
                score = torch.full_like(top, -1.0)
                score[left] = top[left]
                pick = score.sort(descending=True, stable=True).indices[:n]
                chosen = pick.tolist()          # the step's one host read (which slots it set)
            tok = (q[pick].argmax(-1) if greedy else
                   torch.multinomial(q[pick], 1, generator=self.gen)[:, 0])
            canvas[pick] = tok
            confs[pick] = top[pick]
            if keep_q:
                dists[pick] = q[pick]
            for i in chosen:
                set_at[i] = s
            left = [i for i in left if i not in chosen]
        # the round's one read: tokens, confidences and each token's q (greedy: its confidence)
        tokens, conf, q_tok = host_read(canvas, confs, confs if greedy else dists.gather(1, canvas[:, None])[:, 0])
        tree = DraftTree(info={"k": k, "steps": self.steps})
        for i, t in enumerate(tokens):
            tree.add(t, i - 1, q_tok[i], f"step{set_at[i] + 1}")
        if not greedy and not self.tree:    # q where the exact rule's proof holds (module docstring)
            for i in range(k):
                if all(set_at[j] <= set_at[i] for j in range(i)) and all(set_at[j] >= set_at[i] for j in range(i, k)):
                    tree.set_q(i - 1, dists[i])
        if self.tree and self.width > 1:
            slot_candidates(tree, dists, tokens, self.width)
        if self.record is not None:
            tree.decisions = [Decision(self.name, {"slot": i, "confidence": round(conf[i], 5), "step": set_at[i] + 1},
                                       output=tokens[i], at=i) for i in range(k)]
        return tree

    def observe(self, out):
        # nothing to undo: the dLLM's cache holds only committed text (BlockDenoiser drops each
        # canvas), and the next round runs the tokens committed since before its block
        pass


def slot_candidates(tree: DraftTree, dists: torch.Tensor, tokens: list[int], width: int):
    """Each slot's next width - 1 candidates (by its q, dists (k, V)), as point-mass leaves beside
    the chain's token there: one verify tries them where the chain's is refused."""
    v, ids = dists.topk(width, dim=-1)                                  # (k, width)
    ids, v = host_read(ids, v)
    for i in range(len(tokens)):
        extra = [(t, p) for t, p in zip(ids[i], v[i]) if t != tokens[i] and p > 0][: width - 1]
        for t, p in extra:
            tree.add(t, i - 1, p, "candidate")
