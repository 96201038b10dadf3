"""Falcon's semi-autoregressive drafter (Gao et al., AAAI 2025, "Falcon: Faster and Parallel
Inference of Large Language Models through Enhanced Semi-Autoregressive Drafting and Custom-Designed
Decoding Tree"; the authors' code, Bestpay-inc/Falcon `models/cnets.py`): EAGLE's head made
semi-autoregressive, so one forward drafts k tokens.

Entries are EAGLE's: the entry at position t reads r_t = fc([f_t; e(x_{t+1})]), f_t = norm(x_t) the
target's post-norm feature (x_t its last-layer state, or EAGLE-3's fusion fc3 of several layers) and
e the target's frozen embedding; n small Llama layers run causally over the entries; the output o_t
is a predicted feature for position t+1, scored by the target's final norm and LM head (over a
trimmed vocabulary, adapter.SubsetHead): a guess for token t+2. Falcon adds k-1 mask slots:

    entries of one forward   r_t (real), m_1, ..., m_{k-1}            at positions t, t+1, ..., t+k-1
    slot 1  (real)           o_t        -> token t+2, feature f_{t+1}
    slot j+1 (mask j)        o_{t+j}    -> token t+2+j, feature f_{t+1+j}      m_j: a learned input

A mask entry sees the real entries up to t and the masks before it, never the tokens drafted at
t+2..t+1+j, which is what makes the k tokens of one forward come out together. The next forward
writes the k drafted tokens in as real entries (their features the slots' outputs, f_{t+1+j} =
norm(o_{t+j})), adds k-1 new masks, and drafts the next k; mask entries are never kept.

Training (speclab/train/falcon.py) runs the same entries in one causal pass: every position's real
entry, then each mask slot for every position at once, with the mask (`slot_mask`) a forward sees at
run time.

A head directory is an adapter (speclab.models.adapter, kind "falcon"): config.json (a LlamaConfig
with `num_hidden_layers` = the head's layers, `falcon_k`, optional `eagle_layers`) and
model.safetensors (what the head adds, bf16, plus head_ids). Its layer and fusion weights are named
like an EAGLE head's (minus `model.` / `eagle_`), so `speclab train falcon --init-from
smollm2-eagle` starts slot 1 as that head exactly (the layers past the EAGLE head's start as the
identity: their output projections are zero).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speclab.models.adapter import SubsetHead, llama_config_like
from speclab.models.clover import rope, rope_theta


def falcon_config(base_cfg, n_layers: int = 2, k: int = 2, ffn: int | None = None, layers=None):
    """A Llama config of the base's dimensions with n_layers layers of MLP width ffn (default the
    base's), k tokens a forward, and optionally the target layers whose states it fuses."""
    cfg = llama_config_like(base_cfg)
    cfg.num_hidden_layers = n_layers
    cfg.tie_word_embeddings = False
    cfg.falcon_k = k
    if ffn is not None:
        cfg.intermediate_size = ffn
    if layers:
        cfg.eagle_layers = list(layers)
    return cfg


def slot_mask(T: int, k: int, device=None) -> torch.Tensor:
    """(k T, k T) bool for the training pass: rows [0, T) the real entries (causal), rows
    [j T, (j+1) T) mask slot j for each position t, which sees the real entries <= t and the slots
    1..j of the same t: what a drafting forward from the real entry at t sees."""
    t = torch.arange(T, device=device)
    vis = torch.zeros(k * T, k * T, dtype=torch.bool, device=device)
    vis[:T, :T] = t[None, :] <= t[:, None]
    for j in range(1, k):
        rows = j * T + t
        vis[rows[:, None], t[None, :]] = t[None, :] <= t[:, None]
        for i in range(1, j + 1):
            vis[rows, i * T + t] = True
    return vis


class FalconHead(nn.Module):
    def __init__(self, base, cfg, head_ids: torch.Tensor):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        C = cfg.hidden_size
        self.config, self.k, self.eps, self.theta = cfg, int(getattr(cfg, "falcon_k", 2)), cfg.rms_norm_eps, rope_theta(cfg)
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        kw = dict(dtype=base.dtype, device=base.device)
        self.norm = nn.Parameter(base.model.norm.weight.detach().clone(), requires_grad=False)   # the target's
        self.register_buffer("embed", base.get_input_embeddings().weight.detach(), persistent=False)
        n_fused = len(getattr(cfg, "eagle_layers", None) or ())
        self.fc3 = nn.Linear(n_fused * C, C, bias=False, **kw) if n_fused else None
        if self.fc3 is not None:        # starts as the last layer alone
            with torch.no_grad():
                self.fc3.weight.zero_()
                self.fc3.weight[:, (n_fused - 1) * C:] = torch.eye(C)
        self.fc = nn.Linear(2 * C, C, bias=True, **kw)
        self.mask = nn.Parameter(torch.randn(max(self.k - 1, 1), C, **kw) * 0.02)           # (k-1, C)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i).to(**kw) for i in range(cfg.num_hidden_layers))
        self.lm_head = SubsetHead(base.get_input_embeddings().weight, head_ids, cfg.vocab_size)

    def rms(self, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        w = self.norm if w is None else w
        return F.rms_norm(x.float(), x.shape[-1:], w.float(), self.eps).to(x.dtype)

    # -- inputs ---------------------------------------------------------------------------------
    def feature(self, xs: list[torch.Tensor]) -> torch.Tensor:
        """The target's pre-norm states at the head's layers [(..., C)] (the last layer's last) ->
        the post-norm feature f (..., C) a real entry reads."""
        if self.fc3 is None:
            return self.rms(xs[-1])
        return self.rms(self.fc3(torch.cat([F.rms_norm(x, x.shape[-1:], eps=self.eps) for x in xs], -1)))

    def real(self, f: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(..., C) post-norm features and (...) next tokens -> (..., C) real entries."""
        return self.fc(torch.cat([f.to(self.fc.weight.dtype), self.embed[tokens].to(self.fc.weight.dtype)], -1))

    # -- the layers -----------------------------------------------------------------------------
    def qkv(self, layer, x: torch.Tensor, pos: torch.Tensor):
        """x (..., T, C) at positions pos (T,) -> q (..., H, T, D), k / v (..., Hkv, T, D), RoPE applied."""
        a = layer.self_attn
        n = self.rms(x, layer.input_layernorm.weight)
        q = a.q_proj(n).unflatten(-1, (self.H, -1)).transpose(-3, -2)
        k = a.k_proj(n).unflatten(-1, (self.Hkv, -1)).transpose(-3, -2)
        v = a.v_proj(n).unflatten(-1, (self.Hkv, -1)).transpose(-3, -2)
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v

    def out(self, layer, x: torch.Tensor, q, k, v, vis: torch.Tensor) -> torch.Tensor:
        """x (..., T, C), queries over keys / values (..., S, D) with vis (T, S) bool -> (..., T, C)."""
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=vis, enable_gqa=self.H != self.Hkv)
        h = x + layer.self_attn.o_proj(o.transpose(-3, -2).flatten(-2))
        m = layer.mlp
        n = self.rms(h, layer.post_attention_layernorm.weight)
        return h + m.down_proj(F.silu(m.gate_proj(n)) * m.up_proj(n))

    def run(self, x: torch.Tensor, pos: torch.Tensor, vis: torch.Tensor, cache=None):
        """x (..., T, C) entries at positions pos (T,); vis (T, S + T) over the cached keys then
        these. cache: per layer (k, v) (..., Hkv, S, D) or None. Returns the outputs (..., T, C)
        and per layer this call's (k, v)."""
        new = []
        for i, layer in enumerate(self.layers):
            q, k, v = self.qkv(layer, x, pos)
            new.append((k, v))
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], -2), torch.cat([cache[i][1], v], -2)
            x = self.out(layer, x, q, k, v, vis)
        return x, new

    # -- training -------------------------------------------------------------------------------
    def train_forward(self, f: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """f (B, T, C) post-norm features read by the real entries, tok (B, T) the text -> outputs
        (k, B, T, C): slot 1 at t is o_t (token t+2), slot j+1 the mask j drafted from t (token t+2+j).
        Entries whose next token is past the window read padding (token 0)."""
        B, T, C = f.shape
        r = self.real(f, F.pad(tok[:, 1:], (0, 1)))                                  # (B, T, C)
        m = self.mask[:self.k - 1].to(r.dtype)[:, None, :].expand(-1, T, -1).reshape(-1, C)
        x = torch.cat([r, m[None].expand(B, -1, -1)], 1)                             # (B, k T, C)
        t = torch.arange(T, device=f.device)
        pos = torch.cat([t + j for j in range(self.k)])
        o, _ = self.run(x, pos, slot_mask(T, self.k, f.device))                      # (B, k T, C)
        return o.view(B, self.k, T, C).transpose(0, 1)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """(..., C) outputs -> (..., N) scores over the kept ids."""
        return self.rms(o) @ self.lm_head.weight.t().to(o.dtype)
