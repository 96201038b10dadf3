"""Hidden Transfer's transfer layers (Wu et al. 2024, "Parallel Decoding via Hidden Transfer for
Lossless Large Language Model Acceleration"): linear maps that turn the target's hidden state at an
intermediate layer into pseudo hidden states for the next positions, which the target's own upper
layers then read.

h_l[t] (C,) is the target's residual stream after its first l layers at the last committed
position t (captured by the verify forward, so it costs nothing):

    s_{t+j} = W_j h_l[t] + b_j                    j = 1..K: the pseudo state for position t+j
    layers l+1..L of the target over s_{t+1..t+K} at positions t+1..t+K, causal among themselves,
    attending to the committed text's own keys and values in those layers (the target's cache)
    logits_j = head(norm(state of row j))         -> token t+1+j (offset j predicts t+1+j)

Token t+1 is the one the target itself wrote after t (pending), so offset 1 is the first draft
token. W_j start at the identity and b_j at zero: an untrained transfer feeds h_l[t] itself to every
offset. Only W and b are trained (speclab/train/hidden_transfer.py); the target stays frozen, so
what the transfer predicts changes the speed only.

An adapter directory (speclab.models.adapter, kind "hidden-transfer"): config.json (the target's
config plus `hidden_transfer`: {"layer": l, "k": K}) and model.safetensors (weight (K, C, C), bias
(K, C), and an empty head_ids). The paper gives neither l nor K nor its loss; speclab's trainer
picks l per target and trains by distillation to the target's next-token distribution.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speclab.models.adapter import llama_config_like


def transfer_config(base_cfg, layer: int, k: int):
    """The target's config with the transfer's shape in `hidden_transfer`."""
    cfg = llama_config_like(base_cfg)
    n = cfg.num_hidden_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < n:
        raise ValueError(f"hidden transfer: layer must be in 1..{n - 1} (the target has {n} layers; the pseudo "
                         f"states run through layers layer+1..{n}), got {layer!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"hidden transfer: k (future positions) must be an integer >= 1, got {k!r}")
    cfg.hidden_transfer = {"layer": int(layer), "k": int(k)}
    return cfg


class HiddenTransfer(nn.Module):
    """K linear maps C -> C, one per future offset."""

    def __init__(self, base, cfg, head_ids: torch.Tensor | None = None):
        super().__init__()
        ht = cfg.hidden_transfer
        C = cfg.hidden_size
        self.config = cfg
        self.layer, self.k = int(ht["layer"]), int(ht["k"])
        self.weight = nn.Parameter(torch.eye(C).repeat(self.k, 1, 1))           # (K, C_out, C_in)
        self.bias = nn.Parameter(torch.zeros(self.k, C))
        self.register_buffer("head_ids", torch.zeros(0, dtype=torch.long), persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (..., C) states after layer l -> (..., K, C) pseudo states for offsets 1..K."""
        w, b = self.weight.to(h.dtype), self.bias.to(h.dtype)
        return torch.einsum("...c,kdc->...kd", h, w) + b

    def check_target(self, target_model, name: str = "the target"):
        from speclab.models.adapter import check_trained_for
        check_trained_for(self.config, target_model, name, "these transfer layers were",
                          "speclab train hidden-transfer --target ...")
