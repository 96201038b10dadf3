"""Low-rank adapters (LoRA, Hu et al. 2021): W x + (alpha / r) B A x, with A (r, in) and B (out, r).

Training wraps a frozen base's linear layers (`add_lora`); an adapter directory stores only A and
B (`lora_state`); loading adds (alpha / r) B A into a copy of the base's weights (`merge_lora`), so
a merged model runs exactly like the base architecture, at the base's speed.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """base(x) + scale * (x A^T) B^T. B starts at zero, so training starts from the base model."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t().to(x.dtype)) @ self.lora_B.t().to(x.dtype) * self.scale


def add_lora(model, rank: int, alpha: float, targets=TARGETS) -> list[str]:
    """Wrap every nn.Linear named in `targets` inside the decoder layers; returns their names."""
    names = []
    for name, mod in list(model.named_modules()):
        for child, lin in list(mod.named_children()):
            if child in targets and isinstance(lin, nn.Linear):
                setattr(mod, child, LoRALinear(lin, rank, alpha))
                names.append(f"{name}.{child}")
    if not names:
        raise ValueError(f"no linear layer named {targets} found: LoRA targets a Llama-style model")
    return names


def lora_state(model) -> dict[str, torch.Tensor]:
    """{"<module>.lora_A": (r, in), "<module>.lora_B": (out, r)} for every wrapped layer."""
    return {k: v for k, v in model.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}


@torch.no_grad()
def merge_lora(model, state: dict[str, torch.Tensor], scale: float):
    """W += scale * B @ A for each adapted layer of a plain (unwrapped) model, in fp32."""
    mods = dict(model.named_modules())
    for key, A in state.items():
        if not key.endswith(".lora_A"):
            continue
        name = key[: -len(".lora_A")]
        lin = mods.get(name)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"the adapter changes {name!r}, which the base model does not have: "
                             "it was trained for another base model")
        B = state[name + ".lora_B"]
        if (B.shape[0], A.shape[1]) != tuple(lin.weight.shape):
            raise ValueError(f"the adapter's {name} is {B.shape[0]}x{A.shape[1]}, the base's "
                             f"{tuple(lin.weight.shape)}: it was trained for another base model")
        delta = B.float() @ A.float() * scale
        lin.weight.copy_((lin.weight.float() + delta.to(lin.weight.device)).to(lin.weight.dtype))
