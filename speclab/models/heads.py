"""Draft heads that read the target's own hidden state: EAGLE and Medusa.

Both see the target's last-layer hidden state x_t (C,) at committed positions (captured from the
verify forward, so reading it costs nothing) and score tokens through the target's own final norm
and LM head restricted to a trimmed vocabulary (adapter.SubsetHead over `head_ids`).

eagle   EAGLE (Li et al. 2024): one decoder layer over fc([norm(x_t); e(x_{t+1})]) (2C -> C), a
        causal sequence with its own small KV cache. Its output at entry t is a predicted feature
        for position t+1, scored through the target's norm + head: a draft for token t+2. Drafting
        goes on autoregressively by feeding its own (normed) prediction back as the next feature.
        With `eagle_layers` in its config (EAGLE-3's low / mid / high fusion), x_t is instead
        fc3([rms(x_t^(l1)); ...; rms(x_t^(L))]) (kC -> C) over the target's states after those
        layers: a 135M target's last layer is specialised for token t+1, its middle layers still
        carry the context the head needs for t+2.
medusa  Medusa (Cai et al. 2024): K residual blocks on x_t; block k predicts token t+1+k, all from
        the same position, with no cache and no dependence on earlier draft tokens.

Features are post-norm: f_t = norm(x_t) with the target's final RMSNorm (what its head reads).

A head directory is an adapter (speclab.models.adapter): config.json names the base and the kind,
model.safetensors holds only what the head adds (bf16) plus `head_ids`.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from speclab.models.adapter import SubsetHead, build_draft, llama_config_like


def head_config(base_cfg, kind: str, n_heads: int = 4, layers=None):
    """A one-layer Llama config with the base's dimensions (eagle, + eagle_layers if it reads
    several target layers), or the same + medusa_heads. A Llama whatever the base's family (its
    model_type is not carried over: a Qwen2 base's head has no attention biases)."""
    cfg = llama_config_like(base_cfg)
    cfg.num_hidden_layers = 1
    cfg.tie_word_embeddings = False
    if kind == "medusa":
        cfg.medusa_heads = n_heads
    if layers:
        cfg.eagle_layers = list(layers)
    return cfg


def eagle_layers(head_cfg, n_layers: int) -> tuple[int, ...]:
    """The target layers (1-based: the state after that many layers) whose hidden states feed the
    head, checked against a target of n_layers."""
    layers = tuple(getattr(head_cfg, "eagle_layers", None) or (n_layers,))
    if any(not 1 <= l <= n_layers for l in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(f"the head reads target layers {list(layers)} but the target has {n_layers}: "
                         "train a head for this target (speclab train eagle --target ...)")
    return layers


def check_base(head_cfg, target_cfg, head_name: str, target_name: str):
    """One line when a head meets a target it was not trained for (hidden size or vocabulary)."""
    for what in ("hidden_size", "vocab_size"):
        a, b = getattr(head_cfg, what), getattr(target_cfg, what)
        if a != b:
            raise ValueError(f"the head {head_name} was trained for a target with {what} {a}, but {target_name} has "
                             f"{b}: train a head for this target (speclab train eagle / medusa --target ...)")


def build_eagle(base, cfg, head_ids: torch.Tensor):
    """The EAGLE head over `base`: a one-layer Llama sharing the base's embedding, whose final norm
    is a frozen copy of the base's and whose head scores the base's embedding rows at head_ids;
    plus `eagle_fc`, the fusion of feature and token embedding."""
    model = build_draft(base, cfg, head_ids)
    with torch.no_grad():
        model.model.norm.weight.copy_(base.model.norm.weight)
    model.model.norm.weight.requires_grad_(False)
    model.eagle_fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True,
                               dtype=base.dtype, device=base.device)
    k = len(getattr(cfg, "eagle_layers", None) or ())
    if k:
        C = cfg.hidden_size
        model.eagle_fc3 = nn.Linear(k * C, C, bias=False, dtype=base.dtype, device=base.device)
        with torch.no_grad():           # starts as the last layer alone: a top-only head's input exactly
            model.eagle_fc3.weight.zero_()
            model.eagle_fc3.weight[:, (k - 1) * C:] = torch.eye(C)
    return model


def eagle_input(model, xs: list[torch.Tensor], fc3=None) -> torch.Tensor:
    """The target's pre-norm hidden states at the head's eagle_layers (each (T, C), the last layer's
    last) -> the (T, C) pre-norm feature its norm and fusion read: the last state itself, or
    fc3 over all of them, each RMS-normalised (their scales differ by orders of magnitude).
    fc3: another implementation of model.eagle_fc3 (a drafter's packed copy)."""
    if getattr(model, "eagle_fc3", None) is None:
        return xs[-1]
    fc3 = fc3 or model.eagle_fc3
    eps = model.config.rms_norm_eps
    return fc3(torch.cat([F.rms_norm(x, x.shape[-1:], eps=eps) for x in xs], -1))


def eagle_fuse(model, feats: torch.Tensor, tokens: torch.Tensor, fc=None) -> torch.Tensor:
    """(T, C) post-norm features and (T,) next tokens -> (T, C) inputs of the EAGLE layer.
    fc: another implementation of model.eagle_fc (a drafter's packed copy)."""
    e = model.model.embed_tokens.weight[tokens]
    return (fc or model.eagle_fc)(torch.cat([feats.to(e.dtype), e], -1))


class MedusaHeads(nn.Module):
    """K residual blocks on the target's pre-norm hidden state x (T, C):
        h_k = x + W2_k silu(W1_k norm(x)),  logits_k = head(norm(h_k))
    W2_k starts at zero, so every head starts as the target's own next-token prediction."""

    def __init__(self, base, cfg, head_ids: torch.Tensor):
        super().__init__()
        C, K = cfg.hidden_size, cfg.medusa_heads
        self.config = cfg
        kw = dict(dtype=base.dtype, device=base.device)
        self.w1 = nn.ModuleList(nn.Linear(C, C, bias=True, **kw) for _ in range(K))
        self.w2 = nn.ModuleList(nn.Linear(C, C, bias=False, **kw) for _ in range(K))
        for w in self.w2:
            nn.init.zeros_(w.weight)
        self.norm = nn.Parameter(base.model.norm.weight.detach().clone(), requires_grad=False)
        self.eps = cfg.rms_norm_eps
        self.lm_head = SubsetHead(base.get_input_embeddings().weight, head_ids, cfg.vocab_size)

    @property
    def n_heads(self) -> int:
        return len(self.w1)

    def rms(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), x.shape[-1:], self.norm.float(), self.eps).to(x.dtype)

    def hidden(self, x: torch.Tensor, w1=None, w2=None, k: int | None = None) -> torch.Tensor:
        """(..., C) -> (k, ..., C) normed outputs of the first k blocks (default all K). w1: another
        implementation of those first layers as one map (..., C) -> (..., k C) (they all read
        norm(x)); w2: of their second layers (a drafter's packed copies)."""
        k = k or self.n_heads
        n = self.rms(x)
        u = w1(n).split(x.shape[-1], -1) if w1 is not None else [w(n) for w in self.w1[:k]]
        return torch.stack([self.rms(x + w(F.silu(u_k))) for u_k, w in zip(u, (w2 or self.w2)[:k])])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(T, C) -> logits (K, T, V), -inf outside the trimmed vocabulary."""
        return self.lm_head(self.hidden(x))


def build_medusa(base, cfg, head_ids: torch.Tensor):
    return MedusaHeads(base, cfg, head_ids)


def build_clover(base, cfg, head_ids: torch.Tensor):
    from speclab.models.clover import CloverHeads      # its own file
    return CloverHeads(base, cfg, head_ids)


def build_falcon(base, cfg, head_ids: torch.Tensor):
    from speclab.models.falcon import FalconHead        # its own file
    return FalconHead(base, cfg, head_ids)


def build_peagle(base, cfg, head_ids: torch.Tensor):
    from speclab.models.peagle import PEagleHead          # its own file
    return PEagleHead(base, cfg, head_ids)


def build_flexdraft(base, cfg, head_ids: torch.Tensor):
    from speclab.models.flexdraft import FlexDraftAdapter     # its own file
    return FlexDraftAdapter(base, cfg, head_ids)


def build_causal_tree(base, cfg, head_ids: torch.Tensor):
    from speclab.models.causal_tree import CausalTreeAdapter     # its own file
    return CausalTreeAdapter(base, cfg, head_ids)


def build_hidden_transfer(base, cfg, head_ids: torch.Tensor):
    from speclab.models.hidden_transfer import HiddenTransfer     # its own file
    return HiddenTransfer(base, cfg, head_ids)


def build_ppd(base, cfg, head_ids: torch.Tensor):
    from speclab.models.ppd import PromptTokens           # its own file
    return PromptTokens(base, cfg, head_ids)


def build_lud(base, cfg, head_ids: torch.Tensor):
    from speclab.models.lud import LudAdapter             # its own file
    return LudAdapter(base, cfg, head_ids)


def build_m2r2(base, cfg, head_ids: torch.Tensor):
    from speclab.models.m2r2 import Accelerator           # its own file
    return Accelerator(base, cfg, head_ids)


BUILDERS = {"draft": build_draft, "eagle": build_eagle, "medusa": build_medusa, "clover": build_clover,
            "falcon": build_falcon, "flexdraft": build_flexdraft, "peagle": build_peagle,
            "hidden-transfer": build_hidden_transfer, "ppd": build_ppd, "m2r2": build_m2r2,
            "causal-tree": build_causal_tree, "lud": build_lud}


def load_draft(where: str | Path, base, dtype: torch.dtype):
    """The draft in `where` on top of an already loaded base model (same device and dtype)."""
    import json
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from speclab.models.adapter import ADAPTER_KEY
    raw = json.loads((Path(where) / "config.json").read_text())
    kind = raw.pop(ADAPTER_KEY).get("kind", "draft")
    if kind not in BUILDERS:
        raise ValueError(f"{where}: unknown adapter kind {kind!r} (known: {', '.join(BUILDERS)}); "
                         "a newer speclab may have written it")
    cfg = LlamaConfig(**raw)
    state = load_file(str(Path(where) / "model.safetensors"))
    head_ids = state.pop("head_ids")
    model = BUILDERS[kind](base, cfg, head_ids.to(base.device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(("model.embed_tokens.", "lm_head."))]
    if missing or unexpected:
        raise ValueError(f"{where}: weights do not match its config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(device=base.device, dtype=dtype).eval()
