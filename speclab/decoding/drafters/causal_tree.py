"""causal-tree: a causal parallel tree drafter (JetSpec, Hu et al. 2026, "Breaking the Scaling
Ceiling of Speculative Decoding with Parallel Tree Drafting", arXiv 2606.18394; the DFlash-family
block drafter, Chen et al. 2026, made causal inside the block). One forward of the target itself
drafts a whole TREE, on FlexDraft's mask rows (speclab.models.flexdraft), with block-causal
attention among the rows instead of FlexDraft's bidirectional block.

    rows of a draft forward  the pending committed tokens (clean: the target's own weights, causal),
                             then one mask row per tree node below slot 1; a mask row's input is the
                             learned mask embedding plus a learned RANK embedding (rank r: "I stand
                             for my distribution's r-th most likely token")
    visibility               tree-causal: a mask row sees the cache, every clean row, its ancestors'
                             rows and itself, never a sibling or another branch (`tree_visibility`),
                             so each branch is drafted exactly as if it were drafted alone
                             (`branch_rows`: the branch-consistency the tests check)
    the tree (k, width)      slot 1: the target's own next token (the last clean row's output,
                             exact). A main chain of k - 1 rank-0 rows drafts slots 2..k. Beside
                             main row i (slots 2..k-1) hang width - 1 side branches: a rank-r row,
                             whose token is its own r-th most likely one (never the main token), and
                             a rank-0 row below it that drafts the slot after it, seeing that side
                             row and not the main one. So a branch's second token follows ITS first
                             token, not the other branch's: the tree's branches stay consistent,
                             where a bidirectional block's per-slot top-k (dllm-draft / flexdraft
                             with tree=True) are marginals, each plausible, jointly inconsistent.
    verify                   the target's tree verify, in one forward: lossless.

Under sampling with width 1, every slot's token is drawn from its own row's distribution, which
depends on the committed text only (rows never read another's draw), so each carries its q and the
exact rule holds (as flexdraft). With width > 1 the tree goes to the verify as point masses
(accepted with probability p(x), the residual resampled): exact whatever chose the tokens.

Recorded per round: Decision("causal-tree", {"slot", "confidence", "step", "branch", "candidates",
"probs"}, output=token, at=slot) per main-chain slot (step 1: one forward; branch "main"; the row's
top-`width` candidates and their probabilities; the chosen token is its top-1), and
Decision("causal-tree-branch", {"slot", "rank", "candidates", "probs", "next"}, output=token, at=slot)
per side branch (its token, its rank and the token drafted after it). figures.dllm_draft draws the
main chain slot by slot above the verify's verdicts ("block filling"), beside dllm-draft and flexdraft.

The adapter and the tree's forward: speclab/models/causal_tree.py; speclab/train/causal_tree.py
trains it.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import warp
from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import host_read
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.models.causal_tree import CausalTreeAdapter, tree_logits, tree_shape
from speclab.trace import Decision


class CausalTreeDrafter(Drafter):
    name = "causal-tree"

    def __init__(self, target_model, draft, k: int | None = None, width: int | None = None):
        super().__init__()
        if not isinstance(draft, CausalTreeAdapter):
            raise ValueError(f"method 'causal-tree' needs a causal-tree adapter as its draft (e.g. code-causal-tree "
                             f"for code-target), got {_name(draft)}: train one with `speclab train causal-tree`")
        draft.check_target(target_model, _name(target_model))
        k = draft.k if k is None else k
        width = draft.width if width is None else width
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= draft.k:
            raise ValueError(f"causal-tree: k must be an integer in 2..{draft.k} (the target's token plus up to "
                             f"{draft.k - 1} mask slots, the depth this adapter was trained for), got {k!r}")
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= draft.width:
            raise ValueError(f"causal-tree: width must be an integer in 1..{draft.width} (branches per slot, the "
                             f"ranks this adapter learned), got {width!r}")
        self.adapter, self.k, self.width = draft, k, width
        self.parents, self.ranks, self.beside = tree_shape(k, width)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        if not hasattr(target, "kv") or not hasattr(target, "layers"):
            raise ValueError("causal-tree drafts inside the target on speclab's lean forward (a plain Llama-family "
                             f"target); this target runs on {type(target).__name__}: use backend='auto' or 'lean'")

    @torch.inference_mode()
    def propose(self, ctx: Context) -> DraftTree:
        greedy, k, w = self.sampler.greedy, self.k, self.width
        clean = torch.tensor(ctx.ids[len(ctx.ids) - ctx.pending:], device=ctx.device)
        rows = tree_logits(self.target, self.adapter, clean, self.parents, self.ranks)   # ONE forward
        self.forwards += 1
        q = rows.softmax(-1) if greedy else warp(rows, self.sampler)                     # (1 + R, V)
        main = q[:k]                                        # slot 1 (the target's row), then main rows
        tok = main.argmax(-1) if greedy else torch.multinomial(main, 1, generator=self.gen)[:, 0]
        cv, ci = q.topk(w + 1, dim=-1)                      # every row's candidates (side rows pick from them)
        tokens, q_tok = host_read(tok, main.gather(1, tok[:, None])[:, 0])
        cv, ci = host_read(cv, ci)
        tree = DraftTree(info={"k": k, "steps": 1})
        for i, t in enumerate(tokens):                      # nodes 0..k-1: the main chain (slot i + 1)
            tree.add(t, i - 1, q_tok[i], "causal-tree")
        if greedy is False and w == 1:
            for i in range(k):
                tree.set_q(i - 1, main[i])
        side = []                                           # (slot, rank, token, p, next token, p, cands)
        node_of = {}                                        # side row -> tree node
        for j in range(k - 1, len(self.parents)):
            r, i, p = self.ranks[j], self.beside[j], self.parents[j]
            row = 1 + j
            if r > 0:                                       # a side token: its row's r-th, never the main one
                c = [(t, v) for t, v in zip(ci[row], cv[row]) if t != tokens[i + 1]][r - 1]
                node_of[j] = tree.add(c[0], i, c[1], "branch")
                side.append([i + 1, r, c[0], c[1], None, None, row])
            else:                                           # the row below a side token: its top-1
                t, v = ci[row][0], cv[row][0]
                tree.add(t, node_of[p], v, "branch")
                side[-1][4:6] = t, v
        if self.record is not None:
            tree.decisions = [Decision(self.name, {
                "slot": i, "confidence": round(cv[i][0], 5), "step": 1, "branch": "main",
                "candidates": ci[i][:w], "probs": [round(v, 5) for v in cv[i][:w]]}, output=tokens[i], at=i)
                for i in range(k)]
            for slot, r, t, v, nxt, nv, row in side:
                tree.decisions.append(Decision("causal-tree-branch", {
                    "slot": slot, "rank": r, "candidates": ci[row][:w + 1], "probs": [round(x, 5) for x in cv[row][:w + 1]],
                    "next": nxt}, output=t, at=slot))
        return tree
