"""Clover's draft heads (Xiao et al. 2024, "Clover: Regressive Lightweight Speculative Decoding with
Sequential Knowledge"; the authors' Clover-2 code, XiaoBin1992/clover `clover2.py`): Medusa's heads
made regressive, so head k knows which tokens the heads before it drafted.

x_t (C,) is the target's last-layer hidden state (pre-norm) at the last committed position t, and
token t+1 the one the target just emitted (pending):

    a_t  = x_≤t -> one small transformer layer           augmenting block: causal self-attention
                                                          (RoPE) over the prefix's hidden states, then
                                                          an MLP; run once per round, its K / V kept
    g_0  = a_t
    g_k  = g_{k-1} + s v(ê) * cos(q(n(g_{k-1})), k(ê))    attention decoder, per attention head
                                                          (Clover-2's ResAttentionBlock), e = the
                                                          embedding of token t+k: the pending token
                                                          for k = 1, then the token head k-1 drafted
                                                          (the regressive connection)
    z_k  = g_k + W2_k silu(W1_k n(g_k))                   head k: a Medusa block
    logits_k = head(norm(z_k))                            -> token t+1+k (head k = draft depth k)

n(.) are RMS norms with learned weights, norm the target's frozen final norm, head the target's
output rows over a trimmed vocabulary (adapter.SubsetHead over `head_ids`), ê the target's frozen
embedding RMS-normalised, s the RMS of the state an update joins (the augmenting block's updates are
sized the same way: `scale`). Head 1 reads the attention decoder `dec[0]`; heads 2..K share `dec[1]` (Clover-2's rnn /
rnn2). The augmenting block's output projections, the decoders' v and W2 start at zero and the
decoders' q and k at the identity: a new Clover starts as the target's own next-token guess at every
head, and one started from Medusa heads (`speclab train clover --init-from smollm2-medusa`) starts as
those heads exactly, with the same names for W1_k / W2_k.

A head directory is an adapter (speclab.models.adapter, kind "clover"): config.json (a LlamaConfig
with `clover_heads`, `clover_ffn`) and model.safetensors (what the heads add, bf16, plus head_ids).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from speclab.models.adapter import SubsetHead, llama_config_like


def clover_config(base_cfg, n_heads: int = 4, ffn: int | None = None):
    """A Llama config of the base's dimensions (as heads.head_config writes one) plus the number of
    heads and the augmenting block's MLP width (default: the hidden size; 0: attention only)."""
    cfg = llama_config_like(base_cfg)
    cfg.num_hidden_layers = 1
    cfg.tie_word_embeddings = False
    cfg.clover_heads = n_heads
    cfg.clover_ffn = base_cfg.hidden_size if ffn is None else ffn
    return cfg


def scale(x: torch.Tensor) -> torch.Tensor:
    """The RMS of each state (..., 1): what an update of unit scale is multiplied by. A target's
    pre-norm states run far above an embedding's scale (SmolLM2's last layer: RMS ~30 against
    ~0.13), so an update read from normalised inputs is sized to the state it joins."""
    return x.float().pow(2).mean(-1, keepdim=True).sqrt().to(x.dtype).detach()


def rope_theta(cfg) -> float:
    return float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 1e4))


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of x (..., H, T, D) at positions pos (T,) (Llama's half-split)."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = pos.to(x.device, torch.float32)[:, None] * inv                       # (T, D/2)
    cos, sin = torch.cat([ang, ang], -1).cos().to(x.dtype), torch.cat([ang, ang], -1).sin().to(x.dtype)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class AttentionDecoder(nn.Module):
    """g' = g + v(e) * cos(q(n(g)), k(e)), the cosine taken per attention head: how much of the
    token's value enters each head's slice of the state."""

    def __init__(self, C: int, H: int, norm: torch.Tensor, eps: float, **kw):
        super().__init__()
        self.H, self.eps = H, eps
        self.norm = nn.Parameter(norm.detach().clone())
        self.q, self.k, self.v = (nn.Linear(C, C, bias=True, **kw) for _ in range(3))
        with torch.no_grad():
            for lin in (self.q, self.k):
                lin.weight.copy_(torch.eye(C))
                lin.bias.zero_()
            self.v.weight.zero_()
            self.v.bias.zero_()

    def forward(self, g: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """g (..., C) the state, e (..., C) the token's embedding -> (..., C)."""
        C = g.shape[-1]
        q = self.q(F.rms_norm(g, (C,), self.norm.to(g.dtype), self.eps)).unflatten(-1, (self.H, -1))
        e = F.rms_norm(e, (C,), eps=self.eps)
        k, v = self.k(e).unflatten(-1, (self.H, -1)), self.v(e).unflatten(-1, (self.H, -1))
        att = F.cosine_similarity(q, k, dim=-1, eps=self.eps)[..., None]        # (..., H, 1)
        return g + scale(g) * (v * att).flatten(-2)


class CloverHeads(nn.Module):
    def __init__(self, base, cfg, head_ids: torch.Tensor):
        super().__init__()
        C, K, Fw = cfg.hidden_size, cfg.clover_heads, cfg.clover_ffn
        self.config, self.eps, self.H, self.theta = cfg, cfg.rms_norm_eps, cfg.num_attention_heads, rope_theta(cfg)
        kw = dict(dtype=base.dtype, device=base.device)
        norm = base.model.norm.weight.detach()
        self.norm = nn.Parameter(norm.clone(), requires_grad=False)              # the target's final norm
        # the target's embedding, shared (not saved): what the regressive connection reads
        self.register_buffer("embed", base.get_input_embeddings().weight.detach(), persistent=False)
        # augmenting block
        self.aug_norm1, self.aug_norm2 = nn.Parameter(norm.clone()), nn.Parameter(norm.clone())
        self.aug_q, self.aug_k, self.aug_v, self.aug_o = (nn.Linear(C, C, bias=False, **kw) for _ in range(4))
        self.aug_up = nn.Linear(C, 2 * Fw, bias=False, **kw) if Fw else None      # SwiGLU: gate and up
        self.aug_down = nn.Linear(Fw, C, bias=False, **kw) if Fw else None
        for lin in (self.aug_o, self.aug_down):
            if lin is not None:
                nn.init.zeros_(lin.weight)
        # attention decoders: head 1's, and the one heads 2..K share
        self.dec = nn.ModuleList(AttentionDecoder(C, self.H, norm, self.eps, **kw) for _ in range(min(K, 2)))
        # Medusa blocks, one a head (MedusaHeads' names: Medusa weights load into them)
        self.w1 = nn.ModuleList(nn.Linear(C, C, bias=True, **kw) for _ in range(K))
        self.w2 = nn.ModuleList(nn.Linear(C, C, bias=False, **kw) for _ in range(K))
        for w in self.w2:
            nn.init.zeros_(w.weight)
        self.lm_head = SubsetHead(base.get_input_embeddings().weight, head_ids, cfg.vocab_size)

    @property
    def n_heads(self) -> int:
        return len(self.w1)

    def rms(self, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        w = self.norm if w is None else w
        return F.rms_norm(x.float(), x.shape[-1:], w.float(), self.eps).to(x.dtype)

    # -- augmenting block ---------------------------------------------------------------------
    def aug_qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x (..., T, C) at positions pos (T,) -> q, k, v (..., H, T, D), RoPE applied."""
        n = self.rms(x, self.aug_norm1)
        q, k, v = (lin(n).unflatten(-1, (self.H, -1)).transpose(-3, -2) for lin in (self.aug_q, self.aug_k, self.aug_v))
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v

    def aug_out(self, x: torch.Tensor, q, k, v, causal: bool) -> torch.Tensor:
        """x (..., T, C), its queries (..., H, T, D) over keys / values (..., H, S, D) -> a (..., T, C)."""
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)             # (..., H, T, D)
        a = x + scale(x) * self.aug_o(o.transpose(-3, -2).flatten(-2))
        if self.aug_up is not None:
            gate, up = self.aug_up(self.rms(a, self.aug_norm2)).chunk(2, -1)
            a = a + scale(a) * self.aug_down(F.silu(gate) * up)
        return a

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """Training: x (B, T, C) -> a (B, T, C), each position over itself and the ones before."""
        q, k, v = self.aug_qkv(x, torch.arange(x.shape[-2], device=x.device))
        return self.aug_out(x, q, k, v, causal=True)

    # -- heads --------------------------------------------------------------------------------
    def decode(self, g: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
        """Head k's (1-based) state from the previous one and the token before its target."""
        return self.dec[min(k, 2) - 1](g, self.embed[tokens].to(g.dtype))

    def block(self, g: torch.Tensor, k: int) -> torch.Tensor:
        """Head k's (1-based) normed output (..., C), scored by lm_head.weight (N, C)."""
        return self.rms(g + self.w2[k - 1](F.silu(self.w1[k - 1](self.rms(g)))))

    def train_logits(self, x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: x (B, T, C) pre-norm states, tok (B, T) the text -> (K, B, T, N) logits
        over the kept ids; head k at t reads tokens t+1..t+k and scores token t+1+k (valid for
        t < T - k: later positions read padding)."""
        g, out = self.augment(x), []
        for k in range(1, self.n_heads + 1):
            nxt = F.pad(tok[:, k:], (0, k))                                      # (B, T): token t+k
            g = self.decode(g, nxt, k)
            out.append(self.block(g, k) @ self.lm_head.weight.t().to(g.dtype))
        return torch.stack(out)

