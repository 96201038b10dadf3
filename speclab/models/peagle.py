"""P-EAGLE's parallel drafter (Hui et al. 2026, "P-EAGLE: Parallel-Drafting EAGLE with Scalable
Training", arXiv 2602.01469; vLLM's `speculators`, `models/peagle`): EAGLE's head drafting all K
tokens of a round in ONE forward.

The real entries are EAGLE's (speclab.models.falcon has the layers and their math): the entry at
t reads r_t = fc([f_t; e(x_{t+1})]), f_t the target's post-norm feature (or EAGLE-3's fusion of
several layers), and its output guesses token t+2. Positions t+1..t+K-1 have no feature and no
token yet; P-EAGLE fills them with ONE learned mask state, shared by every slot:

    mask entry   m = fc([h_mask; e_mask])        h_mask: a learned hidden state in the feature
                                                 space the real entries read (speculators'
                                                 `mask_hidden` sits in the fused layers' input
                                                 before its fc), e_mask: a learned embedding
                                                 (started at the row of `mask_token_id`)
    forward      r_t (real), m, m, ..., m    at positions t, t+1, ..., t+K-1 (RoPE tells them apart)
    slot 1       o_t        -> token t+2
    slot d       o_{t+d-1}  -> token t+1+d   (a mask entry: sees the real entries <= t and the
                                              mask entries before it in its block)

so one forward drafts the whole block, and a round's drafting costs one head forward whatever K.
Falcon (speclab.models.falcon) has the same layout with a learned entry per slot and drafts k
tokens a forward semi-autoregressively, several forwards a round; P-EAGLE's slots share one state
and the round stops at one forward.

Training (speclab/train/peagle.py) runs every position's real entry and its K-1 mask slots in one
causal pass (falcon.slot_mask): what a drafting forward from that position sees.

A head directory is an adapter (kind "peagle"): config.json is a LlamaConfig (`num_hidden_layers`
the head's layers, optional `eagle_layers`) carrying speculators' P-EAGLE fields:
`speculators_model_type` "peagle", `mask_token_id`, and `speculators_config` {algorithm "peagle",
proposal_methods [{proposal_type "greedy", speculative_tokens K}], default_proposal_method}.
speculators' P-EAGLE is an EAGLE-3 drafter (its layer reads [e; fc(h)], 2C wide); speclab's reads
EAGLE's fc([f; e]), so a speclab head is not a speculators checkpoint, only laid out like one
where the format names P-EAGLE's own parts. Weights are named like an EAGLE head's (minus
`model.` / `eagle_`), so `--init-from smollm2-eagle` starts slot 1 as that head exactly.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speclab.models.falcon import FalconHead, falcon_config


def peagle_config(base_cfg, n_layers: int = 1, k: int = 4, ffn: int | None = None, layers=None,
                  mask_token_id: int = 0):
    """A Llama config of the base's dimensions with n_layers layers, drafting k tokens a forward,
    in speculators' P-EAGLE fields."""
    cfg = falcon_config(base_cfg, n_layers, k, ffn, layers)
    del cfg.falcon_k
    cfg.speculators_model_type = "peagle"
    cfg.mask_token_id = int(mask_token_id)
    cfg.speculators_config = {"algorithm": "peagle", "default_proposal_method": "greedy",
                              "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(k)}]}
    return cfg


def peagle_k(cfg) -> int:
    """K, the tokens one forward drafts, from speculators' proposal method."""
    sc = getattr(cfg, "speculators_config", None) or {}
    methods = sc.get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens")
    if getattr(cfg, "speculators_model_type", None) != "peagle" or not isinstance(k, int) or k < 1:
        raise ValueError("not a P-EAGLE head config: it needs speculators_model_type 'peagle' and "
                         "speculators_config.proposal_methods[0].speculative_tokens (train one with "
                         "`speclab train peagle --target ...`)")
    return k


class PEagleHead(FalconHead):
    """FalconHead's entries and layers with P-EAGLE's one shared mask state in place of Falcon's
    learned entry per slot. `mask` (K-1, C) is the mask entry repeated, so Falcon's drafting
    forward and training pass run it unchanged."""

    def __init__(self, base, cfg, head_ids: torch.Tensor):
        super().__init__(base, cfg, head_ids)
        del self._parameters["mask"]            # Falcon's per-slot entries: P-EAGLE has one state
        self.k = peagle_k(cfg)
        C = cfg.hidden_size
        kw = dict(dtype=base.dtype, device=base.device)
        self.mask_hidden = nn.Parameter(torch.randn(C, **kw) * 0.02)                       # (C,) post-norm f
        self.mask_embed = nn.Parameter(self.embed[int(cfg.mask_token_id)].detach().clone().to(**kw))

    @property
    def mask(self) -> torch.Tensor:
        """(K-1, C): the mask entry fc([h_mask; e_mask]), one per mask slot (all the same)."""
        w = self.fc.weight
        m = self.fc(torch.cat([self.mask_hidden.to(w.dtype), self.mask_embed.to(w.dtype)]))
        return m.expand(max(self.k - 1, 1), -1)
