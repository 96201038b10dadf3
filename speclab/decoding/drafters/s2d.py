"""S2D, sorted speculative decoding (Kavehzadeh et al. 2024): ONE sorted (nested) draft LM whose
first l layers, for each of its sorted depths l, are a draft of their own through the shared final
norm and head (SoFT, speclab/train/s2d.py), so one draft serves several target models at once, each
drafting with the sub-draft depth that serves it best. Verification is the target's, under the
run's rule (the exact rule: identical to `ar`).

    pending   the committed tokens the draft has not read run through the WHOLE draft (every layer's
              cache stays complete), with the hidden state kept after every sorted depth: each
              sub-draft's prediction of each committed token of the target's (prompt rows excluded)
    estimate  alpha_l = (hits_l + 1) / (scored_l + 2) per depth l: how often sub-draft l's greedy
              token is the target's (the greedy acceptance rate of a chain drafted at depth l)
    choose    depth="auto": the shallowest depth with alpha_l >= depth_threshold, else the depth of the
              highest alpha (ties: the deeper); an int: that sub-draft throughout
    draft     k tokens from the first `depth` layers (exit_lm: they share the draft's cache); the
              first from the pending forward's state at that depth
    observe   the draft cache keeps the committed prefix only: the accepted drafts ran the first
              `depth` layers alone, so they are read again, whole, as next round's pending

This is speclab's reading of the paper's adaptive draft selection: the paper's sub-draft choice is a
confidence threshold on the sub-drafts; here the confidence is each depth's agreement with the
target being served, measured on that target's own text as it decodes. The estimate is per request:
the depth a target gets follows from its own text, so two targets served by one sorted draft may get
different depths. Recorded per round: SubDraft (the depth drafted from, and per depth the positions
scored and hits so far) and, with depth="auto", one Decision "s2d-depth" (inputs: the depths and
their alpha; threshold; output: the depth).
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.model import ChainDrafter, OwnDraftLM
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree
from speclab.records import SubDraft
from speclab.trace import Decision


def sorted_depths(draft) -> list[int]:
    """The draft's sorted depths (config `speclab_sorted_depths`, written by `speclab train s2d`);
    every depth 1..L for a draft that names none."""
    L = draft.config.num_hidden_layers
    depths = getattr(draft.config, "speclab_sorted_depths", None) or list(range(1, L + 1))
    if not all(isinstance(d, int) and 1 <= d <= L for d in depths):
        raise ValueError(f"the draft's speclab_sorted_depths {depths!r} must be layer counts in 1..{L}: "
                         "retrain it with `speclab train s2d`")
    return sorted(set(depths) | {L})


def choose_depth(depths: list[int], alpha: list[float], threshold: float) -> int:
    """The paper's rule as speclab reads it: the shallowest sub-draft whose confidence (its agreement
    with this target) reaches the threshold; none does: the most confident (ties: the deeper)."""
    for d, a in zip(depths, alpha):
        if a >= threshold:
            return d
    return max(zip(alpha, depths))[1]


class S2DDrafter(OwnDraftLM, ChainDrafter):
    name = "s2d"

    def __init__(self, draft, backend: str = "auto", depth: int | str = "auto",
                 depth_threshold: float = 0.7, **kw):
        super().__init__(**kw)
        self.depths = sorted_depths(draft)
        if depth != "auto" and depth not in self.depths:
            raise ValueError(f"s2d's depth must be 'auto' or one of the draft's sorted depths {self.depths}, "
                             f"got {depth!r}")
        if not 0 < depth_threshold <= 1:
            raise ValueError(f"s2d's depth_threshold is an acceptance rate in (0, 1], got {depth_threshold}")
        self.depth0, self.depth_threshold = depth, depth_threshold
        self.attach_lm(draft, backend)
        self.sub_forwards = 0

    forwards = property(lambda self: self.lm.forwards + self.sub_forwards if hasattr(self, "lm") else 0,
                        lambda self, v: None)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.n_prompt = ctx.n_prompt
        self.hits = [0] * len(self.depths)
        self.scored = 0
        self.prev: list[int] | None = None      # each depth's token after the last row read
        self.sub_forwards = 0
        self.scoring = self.depth0 == "auto" or record is not None

    def end(self):
        self.lm.capture_layers = ()

    def alpha(self) -> list[float]:
        return [(h + 1) / (self.scored + 2) for h in self.hits]

    def read_pending(self, pending: list[int], device) -> list[torch.Tensor]:
        """Run the pending tokens through the whole draft; score every depth on the target's tokens
        among them; the logits (V,) of each depth at the last row."""
        start = self.lm.length
        # rows whose next token is the target's (not the prompt's), plus the last row
        rows = len(pending) - max(0, self.n_prompt - 1 - start)
        if not self.scoring:                    # a fixed depth, recording off: its exit at the last row only
            d = self.depth0
            if d == self.depths[-1]:
                return [self.lm.forward(torch.tensor(pending, device=device), logits_to_keep=1)[-1]]
            self.lm.capture_layers = (d,)
            self.lm.forward(torch.tensor(pending, device=device), logits_to_keep=1)
            self.lm.capture_layers = ()
            return [self.lm.final_norm_head(self.lm.captured[d][0, -1:])[-1]]
        self.lm.capture_layers = tuple(d for d in self.depths if d < self.depths[-1])
        full = self.lm.forward(torch.tensor(pending, device=device), logits_to_keep=max(rows, 1))   # (rows, V)
        self.lm.capture_layers = ()             # the sub-draft's steps capture nothing
        shallow = self.depths[:-1]              # their heads in one product: (len(shallow) * rows, V)
        z = full                                                                # (depths * rows, V)
        if shallow:
            z = torch.cat([self.lm.final_norm_head(torch.cat([self.lm.captured[d][0, -rows:] for d in shallow])), full])
        per_depth = z.view(len(self.depths), rows, -1)                          # (depths, rows, V)
        guesses = z.argmax(-1).view(len(self.depths), rows).tolist()            # (depths, rows)
        truth = pending[len(pending) - rows + 1:]                               # rows - 1 target tokens
        if self.prev is not None:                                               # last round's last row
            truth, guesses = [pending[0], *truth], [[p, *g] for p, g in zip(self.prev, guesses)]
        for i, g in enumerate(guesses):
            self.hits[i] += sum(a == b for a, b in zip(g, truth))
        self.scored += len(truth)
        self.prev = [g[-1] for g in guesses]
        return [z[-1] for z in per_depth]

    def propose(self, ctx: Context) -> DraftTree:
        last = self.read_pending(ctx.ids[self.lm.length:], ctx.device)
        decision = None
        if self.depth0 == "auto":
            alpha = self.alpha()
            depth = choose_depth(self.depths, alpha, self.depth_threshold)
            if self.record is not None:
                decision = Decision("s2d-depth", {"depths": list(self.depths), "alpha": [round(a, 4) for a in alpha]},
                                    self.depth_threshold, depth, note="the shallowest sub-draft at or above the threshold")
        else:
            depth = self.depth0
        first = last[self.depths.index(depth)] if self.scoring else last[0]
        sub = self.lm if depth == self.depths[-1] else self.lm.exit_lm(depth)
        calls = [first]

        def step(inp):
            if calls:                          # the first token's logits: the pending forward's
                return calls.pop()
            return sub.forward(inp, logits_to_keep=1)[-1]

        tokens, q_tok, dists = self.run_chain(step, None)
        if sub is not self.lm:
            self.sub_forwards += sub.forwards
        tree = DraftTree.chain(tokens, q_tok, f"s2d{depth}", dists, k=len(tokens))
        tree.info.update(SubDraft(s2d_depth=depth, s2d_depths=list(self.depths), s2d_scored=self.scored,
                                  s2d_hits=list(self.hits)).info())
        if decision is not None:
            tree.decisions.append(decision)
        return tree

    def observe(self, out: Outcome):
        # keep the committed prefix: the accepted drafts ran `depth` layers only, so next round reads
        # them again through every layer (the deeper layers' cache then stays complete)
        self.lm.keep(min(self.lm.length, out.prefix_len))
        self.adapt(out)
