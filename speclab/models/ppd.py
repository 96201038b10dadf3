"""Parallel Prompt Decoding's prompt tokens (Chen et al. 2024, "Hardware-Aware Parallel Prompt
Decoding for Memory-Efficient Acceleration of LLM Inference"; the authors' code,
hmarkc/parallel-prompt-decoding): m trained input vectors, the only parameters; the target is frozen.

Appended after a token x_t (at positions t+1 .. t+m, each seeing the text up to t and the prompt
tokens before it), prompt token j's row of the target's own forward guesses token t+1+j: the target's
row at x_t gives token t+1, prompt token 1 gives t+2, prompt token 2 gives t+3, ... The vectors enter
where token embeddings do (the input of the first layer), so they cost nothing but the rows they add.

A directory is an adapter (speclab.models.adapter, kind "ppd"): config.json (the base's LlamaConfig
plus `ppd_tokens` = m and `ppd_rank_acc`, the held-out rank accuracies per offset that size the
candidate tree) and model.safetensors (`prompt` (m, C) and an empty `head_ids`: the target's own head
scores every token).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speclab.models.adapter import llama_config_like


def ppd_config(base_cfg, m: int):
    """The base's config with m prompt tokens."""
    cfg = llama_config_like(base_cfg)
    cfg.ppd_tokens = m
    return cfg


def prompt_mask(T: int, m: int, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The training pass's rows: T text rows (causal), then for each anchor a (len(anchors),) m
    prompt rows after it. Returns visibility (R, R) bool (row sees column) and positions (R,): prompt
    row (a, j) sits at position a + j and sees text rows <= a and prompt rows (a, 1..j), as a verify
    sees the prompt tokens attached to a node."""
    A = len(anchors)
    R = T + A * m
    vis = torch.zeros(R, R, dtype=torch.bool)
    vis[:T, :T] = torch.ones(T, T, dtype=torch.bool).tril()
    t = torch.arange(T)
    for g, a in enumerate(anchors.tolist()):
        r0 = T + g * m
        vis[r0:r0 + m, :T] = t <= a
        vis[r0:r0 + m, r0:r0 + m] = torch.ones(m, m, dtype=torch.bool).tril()
    pos = torch.cat([t, (anchors[:, None] + torch.arange(1, m + 1)).flatten()])
    return vis, pos


class PromptTokens(nn.Module):
    """m prompt vectors (m, C) for the base model they were trained with (its config: `config`)."""

    def __init__(self, base, cfg, head_ids: torch.Tensor | None = None):
        super().__init__()
        self.config = cfg
        m = int(getattr(cfg, "ppd_tokens", 0))
        if m < 1:
            raise ValueError("a PPD directory's config needs ppd_tokens >= 1: train one with `speclab train ppd`")
        embed = base.get_input_embeddings().weight
        if embed.shape[1] != cfg.hidden_size:
            raise ValueError(f"these prompt tokens are {cfg.hidden_size} wide, the base's embedding {embed.shape[1]}: "
                             f"train prompt tokens for this target")
        # start at the mean token embedding, each a little apart
        init = embed.detach().float().mean(0, keepdim=True).repeat(m, 1)
        self.prompt = nn.Parameter(init + 0.02 * embed.detach().float().std() * torch.randn(m, cfg.hidden_size))
        self.register_buffer("head_ids", torch.zeros(0, dtype=torch.long), persistent=False)

    @property
    def m(self) -> int:
        return self.prompt.shape[0]

    @property
    def rank_acc(self) -> list[list[float]] | None:
        """Per offset (prompt token 1 = token t+2, ...) and rank, how often its guess was the target's
        token on held-out text (written by `speclab train ppd`)."""
        return getattr(self.config, "ppd_rank_acc", None)
