"""Masked-diffusion LMs: a Llama-architecture network run WITHOUT the causal mask.

A checkpoint is a diffusion LM when its config says `speclab_engine: "diffusion"`; it then also
names its `mask_token_id` and whether it is AR-adapted (`speclab_shift`: the prediction for
position i is read from the output at i-1, as Dream and Fast-dLLM v2 do for models initialised
from a causal LM; LLaDA-style models trained from scratch do not shift). The weights load with
`AutoModelForCausalLM.from_pretrained` like any Llama; only the attention mask differs.
"""
from __future__ import annotations

import torch


def is_dllm(model) -> bool:
    return getattr(getattr(model, "config", None), "speclab_engine", None) == "diffusion"


def mark_dllm(config, mask_token_id: int, shift: bool):
    """Turn a causal-LM config into a diffusion-LM config (what training saves)."""
    config.speclab_engine = "diffusion"
    config.mask_token_id = int(mask_token_id)
    config.speclab_shift = bool(shift)
    return config


def bidirectional_logits(model, x: torch.Tensor) -> torch.Tensor:
    """x: (B, L) token ids -> (B, L, V) logits, every position attending to every position.

    A 4-D additive mask of zeros replaces transformers' causal mask (measured: with it, the first
    position's logits change when the last token changes).
    """
    B, L = x.shape
    mask = torch.zeros(B, 1, L, L, device=x.device, dtype=next(model.parameters()).dtype)
    logits = model(input_ids=x, attention_mask=mask, use_cache=False).logits
    if getattr(model.config, "speclab_shift", False):
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)   # output i-1 predicts token i
    return logits


class Denoiser:
    """One diffusion LM, counted: `logits(x)` is one forward (one NFE) over the whole canvas."""

    def __init__(self, model):
        if not is_dllm(model):
            name = getattr(model, "name_or_path", type(model).__name__)
            raise ValueError(f"{name} is not a masked-diffusion LM (its config has no speclab_engine='diffusion'): "
                             "dllm-* methods need a diffusion model such as code-dllm or digits-dllm; "
                             "for a causal LM use ar, draft-model, prompt-lookup, ...")
        self.model = model
        self.mask_id = int(model.config.mask_token_id)
        self.forwards = 0

    @torch.inference_mode()
    def logits_batch(self, xs: torch.Tensor) -> torch.Tensor:
        """xs: (K, L) canvases -> (K, L, V): ONE network call (FreeDave verifies K drafts at once)."""
        self.forwards += 1
        return bidirectional_logits(self.model, xs).float()

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: (L,) canvas ids -> (L, V) float32 logits."""
        self.forwards += 1
        return bidirectional_logits(self.model, x[None])[0].float()
