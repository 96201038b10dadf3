"""A Directed Acyclic Transformer (DA-Transformer, Huang et al. 2022), small enough to train on a CPU.

The model reads a source sequence with a Transformer encoder and runs a non-autoregressive decoder
(no causal mask, cross-attention to the encoder) over Lg = lambda * len(source) *vertices*. It
returns, for one source, the two halves of a directed acyclic graph:

  emissions  E[j]    = log_softmax(W_out h_j)                    what vertex j would say
  links      A[i, j] = log P(next vertex = j | vertex i)         only forward edges (j > i)

Every path starts at vertex 0 (BOS) and ends at vertex Lg-1 (EOS); the DAG loss (train/dag.py)
sums over all of them, and the decoders (decoding/dag.py) pick one. The link module follows the
reference `extract_links`: per-head dot-product scores over concat(h_j, link_pos(j)), a masked
log-softmax over later vertices, mixed over heads by a per-vertex gate.

Saved as model.safetensors (fp16) + config.json + vocab.json; `load_dag` upcasts to fp32. Never
pickled. One vocabulary serves source and target, so a trace's token-text table is unambiguous.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


@dataclass
class DagConfig:
    task: str = "numwords"       # which toy task (train/dag.py TASKS) the vocabulary belongs to
    vocab_size: int = 64
    n_embd: int = 128
    n_head: int = 4
    n_enc_layer: int = 2
    n_dec_layer: int = 2
    d_ff: int = 384
    dropout: float = 0.1
    upsample: float = 4.0        # lambda: Lg = int(upsample * len(source incl. BOS/EOS))
    max_src_len: int = 8         # incl. BOS/EOS; longer inputs are refused
    max_vertices: int = 64

    def num_vertices(self, src_len: int) -> int:
        """Lg for a source of `src_len` tokens (incl. BOS/EOS): the reference's `source_old`."""
        return max(2, int(src_len * self.upsample))


class Attention(nn.Module):
    def __init__(self, cfg: DagConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.kv = nn.Linear(cfg.n_embd, 2 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mem, key_pad):              # x (B, T, C), mem (B, S, C), key_pad (B, S)
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, -1).transpose(1, 2)          # (B, H, T, C/H)
        k, v = self.kv(mem).view(B, mem.size(1), 2, self.n_head, -1).permute(2, 0, 3, 1, 4)
        mask = ~key_pad[:, None, None, :]                                  # True = attend
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """Pre-LN block: self-attention, optional cross-attention to the encoder, MLP. Never causal."""

    def __init__(self, cfg: DagConfig, cross: bool):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.n_embd), Attention(cfg)
        self.ln_x, self.xattn = (nn.LayerNorm(cfg.n_embd), Attention(cfg)) if cross else (None, None)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, cfg.d_ff), nn.GELU(),
                                 nn.Linear(cfg.d_ff, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x, pad, mem=None, mem_pad=None):
        h = self.ln1(x)
        x = x + self.attn(h, h, pad)
        if self.xattn is not None:
            x = x + self.xattn(self.ln_x(x), mem, mem_pad)
        return x + self.mlp(self.ln2(x))


class DATransformer(nn.Module):
    def __init__(self, cfg: DagConfig, vocab: "Vocab | None" = None):
        super().__init__()
        self.cfg, self.vocab, self.name = cfg, vocab, f"{cfg.task}-dat"
        C = cfg.n_embd
        self.tok_emb = nn.Embedding(cfg.vocab_size, C)                 # shared by encoder, decoder
        self.src_pos = nn.Embedding(cfg.max_src_len, C)
        self.vtx_pos = nn.Embedding(cfg.max_vertices, C)
        self.encoder = nn.ModuleList(Block(cfg, cross=False) for _ in range(cfg.n_enc_layer))
        self.ln_enc = nn.LayerNorm(C)
        self.decoder = nn.ModuleList(Block(cfg, cross=True) for _ in range(cfg.n_dec_layer))
        self.ln_dec = nn.LayerNorm(C)
        # link module (B.1): features concat(h_j, link_pos(j)) -> per-head queries/keys + head gate
        self.link_pos = nn.Embedding(cfg.max_vertices, C)
        self.w_q, self.w_k = nn.Linear(2 * C, C), nn.Linear(2 * C, C)
        self.w_gate = nn.Linear(2 * C, cfg.n_head)
        self.apply(self._init)

    @staticmethod
    def _init(m):                                   # nanoGPT init: small weights, tied head stays sane
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def decoder_input(self, glen: torch.Tensor, Lg: int) -> torch.Tensor:
        """Vertex tokens [BOS, UNK, ..., UNK, EOS, PAD...] for graph sizes `glen` (B,) -> (B, Lg)."""
        j = torch.arange(Lg, device=glen.device)[None, :]
        x = torch.full((len(glen), Lg), UNK, dtype=torch.long, device=glen.device)
        x = x.masked_fill(j >= glen[:, None], PAD).masked_fill(j == 0, BOS)
        return x.masked_fill(j == glen[:, None] - 1, EOS)

    def encode(self, src):                                            # src (B, S)
        pad = src == PAD
        x = self.tok_emb(src) + self.src_pos.weight[: src.size(1)]
        for blk in self.encoder:
            x = blk(x, pad)
        return self.ln_enc(x), pad                                    # (B, S, C), (B, S)

    def forward(self, src, dec_in):
        """src (B, S), dec_in (B, Lg) -> emissions (B, Lg, V) log-probs, links (B, Lg, Lg) log-probs."""
        mem, mem_pad = self.encode(src)
        pad = dec_in == PAD
        Lg = dec_in.size(1)
        x = self.tok_emb(dec_in) + self.vtx_pos.weight[:Lg]
        for blk in self.decoder:
            x = blk(x, pad, mem, mem_pad)
        h = self.ln_dec(x)                                            # (B, Lg, C)
        emissions = F.log_softmax(h @ self.tok_emb.weight.T, dim=-1)  # tied output head
        return emissions, self.links(h, pad)

    def links(self, h, pad):
        B, Lg, C = h.shape
        H = self.cfg.n_head
        feat = torch.cat([h, self.link_pos.weight[:Lg].expand(B, Lg, C)], dim=-1)   # (B, Lg, 2C)
        q = self.w_q(feat).view(B, Lg, H, C // H).transpose(1, 2)                   # (B, H, Lg, C/H)
        k = self.w_k(feat).view(B, Lg, H, C // H).transpose(1, 2)
        s = (q @ k.transpose(-1, -2)).float() / math.sqrt(C // H)                   # (B, H, Lg, Lg)
        i = torch.arange(Lg, device=h.device)
        valid = (i[None, :] > i[:, None])[None] & ~pad[:, None, :]                  # (B, Lg, Lg)
        # finite fill, not -inf: a row with no valid successor must not make log_softmax NaN
        s = s.masked_fill(~valid[:, None], -1e9)
        gate = F.log_softmax(self.w_gate(feat).float(), dim=-1)                     # (B, Lg, H)
        mix = F.log_softmax(s, dim=-1) + gate.transpose(1, 2)[..., None]            # (B, H, Lg, Lg)
        return torch.logsumexp(mix, dim=1).masked_fill(~valid, float("-inf"))       # (B, Lg, Lg)


# -- vocabulary ------------------------------------------------------------------------------------
class Vocab:
    """A word/char-level vocabulary: specials first, then the task's tokens."""

    def __init__(self, tokens: list[str]):
        self.itos = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self):
        return len(self.itos)

    def encode(self, tokens: list[str]) -> list[int]:
        return [self.stoi.get(t, UNK) for t in tokens]

    def decode(self, ids) -> list[str]:
        return [self.itos[int(i)] for i in ids]


# -- save / load (safetensors, never pickle) ------------------------------------------------------
def save(model: DATransformer, out_dir: str | Path, extra: dict | None = None) -> Path:
    """Write model.safetensors (fp16), config.json and vocab.json (the model's `vocab`) to out_dir."""
    from safetensors.torch import save_file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"model_type": "da-transformer", **asdict(model.cfg), **(extra or {})}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "vocab.json").write_text(json.dumps(model.vocab.itos, ensure_ascii=False))
    return out


def load_dag(model_dir: str | Path, device=None) -> DATransformer:
    """Load a saved DA-Transformer (fp16 on disk, fp32 in memory) in eval mode; `model.vocab` is
    its vocabulary, `model.name` the directory name, `model.decode_defaults` its decoder settings."""
    from safetensors.torch import load_file
    d = Path(model_dir)
    if not (d / "config.json").exists() or not (d / "model.safetensors").exists():
        raise FileNotFoundError(f"{d} is not a DA-Transformer directory (needs config.json, "
                                "model.safetensors, vocab.json); train one with "
                                "`speclab train numwords --out DIR`")
    raw = json.loads((d / "config.json").read_text())
    if raw.get("model_type") != "da-transformer":
        raise ValueError(f"{d}/config.json has model_type {raw.get('model_type')!r}, "
                         "expected 'da-transformer'")
    cfg = DagConfig(**{k: v for k, v in raw.items() if k in DagConfig.__dataclass_fields__})
    vocab = Vocab(json.loads((d / "vocab.json").read_text(encoding="utf-8")))
    model = DATransformer(cfg, vocab)
    model.name = d.name
    # decoder settings tuned for this model (config.json "decode", like a generation config); a
    # caller's own settings win (speclab.decoding.dag.decode_config)
    model.decode_defaults = dict(raw.get("decode", {}))
    state = {k: v.float() for k, v in load_file(str(d / "model.safetensors")).items()}
    model.load_state_dict(state)
    return model.to(device or "cpu").eval()
