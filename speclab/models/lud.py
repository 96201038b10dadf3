"""Lexical Unit Decoding's fine-tune (Sun et al., LREC-COLING 2024, "Decoding at the Speed of Thought:
Harnessing Parallel Decoding of Lexical Units for LLMs"; tjunlp-lab/Lexical-Unit-Decoding-LUD-) as a
low-rank delta on the target and one placeholder embedding.

    the model        the target with W += (alpha / r) B A on every q / k / v / o / gate / up / down
                     projection (LoRA, speclab.models.lora): the whole model is the fine-tuned one,
                     as the paper fine-tunes it; no head, no second model
    placeholders     k - 1 rows after the last real token, each the learned `pad_embedding` at the
                     next positions, causal as any row: placeholder j's output guesses the token
                     j + 1 past the real row's own next token, so ONE forward offers k tokens
    the unit         the real row's token, then the placeholders' guesses while each is confident
                     (decoding/drafters/lud.py decides where the unit ends)

A directory is an adapter (speclab.models.adapter, kind "lud"): config.json (the target's config plus
`lud`: rank, alpha, k, the confidence that marked the training text's units, the decoding threshold
the held-out numbers were measured at) and model.safetensors
(`pad_embedding` (C,), per adapted projection `lora.<name with __ for .>__A` (r, in) and `__B` (out,
r), and an empty head_ids). speclab/train/lud.py trains it. A run merges the delta into a private
copy of the target once (`merged`), kept on this object for the next run with the same target.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from speclab.models.adapter import llama_config_like
from speclab.models.lora import TARGETS, merge_lora


def lud_config(base_cfg, rank: int, alpha: float, k: int, unit_alpha: float, threshold: float):
    """The target's config with the fine-tune's shape in `lud`, and the decoding threshold its held-out
    numbers were measured at (the drafter's default)."""
    cfg = llama_config_like(base_cfg)
    cfg.lud = {"rank": int(rank), "alpha": float(alpha), "k": int(k), "unit_alpha": float(unit_alpha),
               "threshold": float(threshold)}
    return cfg


def adapted_linears(base) -> dict[str, nn.Linear]:
    """The base's projections the fine-tune changes: name -> nn.Linear (a Llama-family decoder's)."""
    out = {n: m for n, m in base.named_modules() if n.rsplit(".", 1)[-1] in TARGETS and isinstance(m, nn.Linear)}
    if not out:
        raise ValueError(f"no linear layer named {TARGETS} in this model: LUD's fine-tune targets a Llama-style model")
    return out


def key_of(name: str) -> str:
    return name.replace(".", "__")


class LudAdapter(nn.Module):
    """The placeholder embedding and the low-rank deltas (B starts at zero: the target itself)."""

    def __init__(self, base, cfg, head_ids: torch.Tensor | None = None):
        super().__init__()
        lud = getattr(cfg, "lud", None)
        if not lud:
            raise ValueError("a LUD directory's config needs a `lud` block: train one with `speclab train lud`")
        self.config = cfg
        self.rank, self.k, self.threshold = int(lud["rank"]), int(lud["k"]), float(lud.get("threshold", 0.9))
        self.scale = float(lud["alpha"]) / self.rank
        self.pad_embedding = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.lora = nn.ParameterDict()
        for name, lin in adapted_linears(base).items():
            self.lora[key_of(name) + "__A"] = nn.Parameter(torch.zeros(self.rank, lin.in_features))
            self.lora[key_of(name) + "__B"] = nn.Parameter(torch.zeros(lin.out_features, self.rank))
        self.register_buffer("head_ids", torch.zeros(0, dtype=torch.long), persistent=False)
        self._merged: dict = {}

    def deltas(self) -> dict[str, torch.Tensor]:
        """{"<projection>.lora_A": A, "<projection>.lora_B": B}: speclab.models.lora's naming."""
        return {k[:-3].replace("__", ".") + (".lora_A" if k.endswith("__A") else ".lora_B"): v.detach()
                for k, v in self.lora.items()}

    def check_target(self, target_model, name: str = "the target"):
        from speclab.models.adapter import check_trained_for
        check_trained_for(self.config, target_model, name, "this LUD fine-tune was", "speclab train lud")

    @torch.no_grad()
    def merged(self, target_model):
        """A private copy of `target_model` with the deltas merged (once per target and dtype)."""
        key = (id(target_model), next(target_model.parameters()).dtype)
        if key not in self._merged:
            model = copy.deepcopy(target_model)
            merge_lora(model, self.deltas(), self.scale)
            model.name_or_path = f"{getattr(target_model, 'name_or_path', 'target')}+lud"
            self._merged = {key: model}         # one copy at a time: a new target replaces the last
        return self._merged[key]
