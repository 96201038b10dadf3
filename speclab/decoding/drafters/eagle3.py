"""EAGLE-3 drafters (speclab.models.eagle3): a checkpoint in the layout vLLM, SGLang and speculators use.

Every verify forward captures the target's hidden states after the draft's three aux layers
(`eagle_aux_hidden_state_layer_ids`); the drafter keeps the committed rows' states fused by the
draft's `fc` (so its input costs one (3 Ct -> C) matmul per committed token). The token the target
just emitted has no hidden state yet (it is pending): drafting starts from the last committed
position that has one, as for `eagle`.

eagle3-chain  k tokens, one draft step each (what vLLM and SGLang's chain mode draft).
eagle3        EAGLE-2's dynamic tree (decoding/drafters/trees.grow_dynamic) grown by cumulative draft
              probability under a node budget; each depth is one draft forward over the tree so far.

The draft scores its own vocabulary of N ids; draft id i is target id i + d2t[i]. A target token
outside it could never have been drafted: the round records it as `coverage_miss` in its info.
Provenance, in each node's `source`: "h{t}@L{a},{b},{c}" = fed by the target's hidden states at
position t after layers a, b, c; "h{t}+{j}@L..." = j steps of the draft's own outputs past it. The
first drafted round's info names the checkpoint: {"drafter": {"format", "source"}}.

Host reads per round (a device -> host transfer, which waits for the device): eagle3-chain one, its
tokens and their q together (one per step with `threshold`); eagle3 one per depth
(trees.grow_dynamic: the nodes' tokens and their parents' outputs gathered on the device for the
next depth). Each draft forward over a tree builds its mask on the host from parents already read.
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.heads import FeatureReader
from speclab.decoding.drafters.model import ChainDrafter
from speclab.decoding.drafters.trees import Growing, check_budget, grow_dynamic
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree
from speclab.models.eagle3 import Cache, Eagle3Draft, check_target


class Eagle3ChainDrafter(FeatureReader, ChainDrafter):
    name = "eagle3-chain"

    def __init__(self, target_model, draft, verifier: bool = True, **kw):
        super().__init__(**kw)
        if not isinstance(draft, Eagle3Draft):
            raise ValueError(f"method {self.name!r} needs an EAGLE-3 drafter as its draft (a speculators or SpecForge "
                             f"directory, e.g. one `speclab export-drafter` or `speclab train eagle3` wrote), got "
                             f"{type(draft).__name__}")
        self.layers = tuple(sorted(check_target(draft, target_model, verifier)))   # vLLM concatenates in layer order
        self.draft = draft
        self.fast = draft.packed()                      # its linear layers in speclab's kernel where it runs
        self.embed_w = None if draft.embed_tokens is not None else target_model.get_input_embeddings().weight
        self.ids = draft.draft_ids                      # (N,) draft id -> target id
        self.drafts_from(self.ids, target_model.config.vocab_size)
        self.V = target_model.config.vocab_size
        at = "@L" + ",".join(map(str, self.layers))
        self.label = lambda t, j: (f"h{t}" if j == 0 else f"h{t}+{j}") + at

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.cache, self.forwards, self.named = Cache(), 0, False

    @torch.no_grad()
    def prepare(self, xs: list[torch.Tensor]) -> torch.Tensor:
        """The committed rows' states at the aux layers -> the fused features g (rows, C)."""
        return self.draft.fuse(torch.cat(xs, -1), self.fast)

    def step(self, tokens, g, parents=None, keep_new=True):
        self.forwards += 1
        return self.draft(tokens, g, self.cache, parents=parents, embed=self.embed_w, keep_new=keep_new,
                          fast=self.fast)

    def widen(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., N) over the draft vocabulary -> (..., V) over the target's, -inf elsewhere."""
        full = logits.new_full((*logits.shape[:-1], self.V), float("-inf"))
        full[..., self.ids] = logits
        return full

    @property
    def head_length(self) -> int:
        return self.cache.length

    def head_rows(self, feats, nxt):
        """The draft over (fused feature, next token) rows: its logits (N,) at the last and its
        pre-norm output there (1, C). FeatureReader.feed feeds it."""
        normed, pre = self.step(nxt, feats)
        return self.draft.logits(normed[-1:], self.fast)[0], pre[-1:]

    def name_source(self, tree: DraftTree) -> DraftTree:
        if not self.named and len(tree):
            tree.info["drafter"] = {"format": self.draft.format, "source": self.draft.source}
            self.named = True
        return tree

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        state = {}
        subset = self.sampler.greedy and self.record != "full"       # greedy: argmax over the N ids

        def step(inp):
            if inp is None:
                logits, state["h"] = self.feed(ctx)
            else:
                normed, state["h"] = self.step(inp, state["h"])
                logits = self.draft.logits(normed, self.fast)[-1]
            return logits if subset else self.widen(logits)
        tokens, q_tok, dists = self.run_chain(step, None, self.ids if subset else None)
        self.cache.keep(self.fed)               # drop the draft's speculative entries
        tree = DraftTree.chain(tokens, q_tok, "", dists, k=len(tokens))
        tree.source = [self.label(t, j) for j in range(len(tokens))]
        return self.name_source(tree)

    def observe(self, out: Outcome):
        super().observe(out)
        self.adapt(out)


class Eagle3Drafter(Eagle3ChainDrafter):
    """EAGLE-2's dynamic tree from an EAGLE-3 draft; its children are the draft's top choices over
    its own N ids (point-mass drafts under sampling, verified by recursive rejection)."""
    name = "eagle3"

    def __init__(self, target_model, draft, budget: int = 5, width: int = 3, depth: int = 3,
                 threshold: float | None = 0.2, verifier: bool = True):
        check_budget(budget, width, depth, threshold)
        super().__init__(target_model, draft, verifier=verifier, k=depth)
        self.budget, self.width, self.depth, self.tree_threshold = budget, width, depth, threshold

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        outs, root_q = [], []                   # (1 + N, C): the draft's pre-norm output at the root, per node

        def q_at(tree: Growing) -> torch.Tensor:
            if not root_q:                      # first call: the committed entries, then the root
                logits, root = self.feed(ctx)
                root_q.append(logits.float().softmax(-1)[None])
                outs.append(root)
            if not len(tree):
                return root_q[0]
            g = outs[0].index_select(0, tree.dev_parents + 1)                     # (nodes, C): each parent's
            normed, pre = self.step(tree.dev_tokens, g, parents=tree.parents, keep_new=False)  # never kept
            outs[0] = torch.cat([outs[0][:1], pre])
            return torch.cat([root_q[0], self.draft.logits(normed, self.fast).float().softmax(-1)])
        tree = grow_dynamic(self.budget, self.width, self.depth, q_at, label=lambda d: self.label(t, d - 1),
                            ids=self.ids, threshold=self.tree_threshold)
        return self.name_source(tree)
