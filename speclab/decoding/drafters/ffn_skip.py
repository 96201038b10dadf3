"""FFN-SkipLLM: the target skips feed-forward blocks token by token once they saturate (lossy).

FFN-SkipLLM (Jaiswal et al., EMNLP 2024, "FFN-SkipLLM: A Hidden Gem for Autoregressive Decoding
with Adaptive Feed Forward Skipping"): no draft and no verify. Every attention sublayer runs, so
every layer's KV cache is written for every token (the early-exit troubles the paper sets out from
never arise); only MLPs (the paper's FFN blocks, about two thirds of a layer's weights) are left out.
The paper's observation: the cosine similarity between an FFN block's input and output (the
residual stream before and after it) rises through the middle layers and saturates, so once one
block changes the stream little, the next ones are skipped greedily. Per generated token:

    warm-up     the first `warmup` new tokens run at full depth (the paper's warm-up index: the
                first tokens' KV entries, which later tokens attend to most, stay the full model's)
    cold        the first `cold_start` and last `cold_end` layers always run their FFN (the paper's
                cold regions, where a block still changes the stream a lot)
    test        in between, each FFN that runs is scored s = cos(x_in, x_out) over the hidden size
    skip        the first block with s >= `threshold` (saturated) keeps its output; the FFNs of the
                next layers are skipped, at most round(`skip_ratio` L) of them (the paper's skip
                ratio; it reports 25-30% with a marginal change), none in the cold end; after the
                budget the rest run, untested

The choice is made inside the token's one forward: the lean forward asks the gate before each MLP
(LeanLM.mlp_gate, models.lean.forward.MlpGate). A prompt's rows all run (a forward of several rows
asks no gate). threshold > 1 skips nothing: the output is then `ar`'s, bit for bit where `ar` runs
the same layer path (the gated forward runs the layers as torch ops, as a partial skip set does).

In the trace each round's info holds `skip`, the mask its forward ran (records.SkipMask: "." runs,
"m" MLP skipped), so the skip-mask figure draws it, and one `ffn-skip` decision: the layer that
saturated and its cosine against `threshold`, the blocks tested and skipped, the budget, the mask
as output (at "full" also every tested block's cosine); a warm-up round says so in its note.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speclab.decoding.drafters.swift import n_layers_of
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision


class Saturation:
    """The paper's greedy rule for one token, asked by the forward layer by layer (an MlpGate)."""

    def __init__(self, n_layers: int, threshold: float, budget: int, cold_start: int, cold_end: int):
        self.L, self.threshold, self.budget = n_layers, threshold, budget
        self.hot = range(cold_start, n_layers - cold_end)      # layers whose FFN may be skipped
        self.start()

    def start(self, active: bool = True):
        """A new token; inactive (the warm-up): every FFN runs, untested."""
        self.active, self.at, self.cos_at, self.left = active, None, None, self.budget
        self.cos: list[float] = []          # each tested block's cosine, in layer order
        self.skipped: list[int] = []

    def asks(self, layer: int) -> bool:
        return self.active and layer in self.hot and (self.at is None or self.left > 0)

    def run(self, layer: int) -> bool:
        if self.active and self.at is not None and self.left > 0 and layer in self.hot:
            self.skipped.append(layer)
            self.left -= 1
            return False
        return True

    def ran(self, layer: int, x_in: torch.Tensor, x_out: torch.Tensor) -> None:
        if not self.active or self.at is not None or layer not in self.hot:
            return
        s = F.cosine_similarity(x_in.float(), x_out.float(), dim=-1).item()    # (1, C) rows: one host read
        self.cos.append(s)
        if s >= self.threshold:
            self.at, self.cos_at = layer, s

    def mask(self) -> str:
        return "".join("m" if i in self.skipped else "." for i in range(self.L))


class FfnSkipDrafter(Drafter):
    """Drafts nothing: it hands the target its gate for every one-token forward past the warm-up
    and records what the gate chose (a round is one token of the gated target)."""
    name = "ffn-skip"

    def __init__(self, target_model, threshold: float = 0.95, skip_ratio: float = 0.25, warmup: int = 4,
                 cold_start: int = 2, cold_end: int = 2):
        super().__init__()
        n = n_layers_of(target_model)
        for name, v in (("warmup", warmup), ("cold_start", cold_start), ("cold_end", cold_end)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1 <= threshold:
            raise ValueError(f"threshold must be a cosine similarity, a number >= -1 (above 1: skip nothing), "
                             f"got {threshold!r}")
        if isinstance(skip_ratio, bool) or not isinstance(skip_ratio, (int, float)) or not 0 <= skip_ratio <= 1:
            raise ValueError(f"skip_ratio must be in [0, 1] (the share of FFN blocks a token may skip), "
                             f"got {skip_ratio!r}")
        if n < 3 or cold_start + cold_end >= n:
            raise ValueError(f"cold_start + cold_end must leave a layer whose FFN may be skipped: got "
                             f"{cold_start} + {cold_end} for a model of {n} layers (model.model.layers)")
        self.n_layers, self.threshold, self.skip_ratio, self.warmup = n, float(threshold), float(skip_ratio), warmup
        self.cold = (cold_start, cold_end)
        self.budget = round(skip_ratio * n)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.gate = Saturation(self.n_layers, self.threshold, self.budget, *self.cold)
        self.round = 0
        target.mlp_gate = self.gate             # transformers' forward refuses a gate (models.hf)

    def end(self):
        self.target.mlp_gate = None

    def propose(self, ctx: Context) -> DraftTree:
        """Round r's forward makes new token r + 1: the first `warmup` run at full depth."""
        self.gate.start(active=self.round >= self.warmup)
        return DraftTree()

    def observe(self, out: Outcome) -> None:
        """What the forward just chose, onto the round's record (record_round reads the tree after)."""
        gated = self.gate.active and out.n_pending == 1
        g = self.gate
        mask = g.mask() if gated else "." * self.n_layers
        out.tree.info["skip"] = mask
        if self.record is not None:
            inputs = {"layer": g.at, "cos": None if g.cos_at is None else round(g.cos_at, 4),
                      "tested": len(g.cos), "skipped": len(g.skipped), "budget": self.budget} if gated else {}
            if gated and self.record == "full":
                inputs["cos_by_block"] = [round(c, 4) for c in g.cos]
            note = "" if gated else ("warm-up: full depth" if self.round else "prompt: full depth")
            out.tree.decisions.append(Decision("ffn-skip", inputs, self.threshold, mask, note=note))
        self.round += 1
