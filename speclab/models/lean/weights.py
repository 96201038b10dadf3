"""The lean forward's weights: each model's matrices fused (q|k|v, gate|up) and laid out for the
device and dtype it runs in, built once per model and cached on it (`pack_model`), plus its RoPE
tables. Layouts:

  "packed"  speclab's native bf16 kernel's blocks (CPUs with AVX512-BF16, models.kernels)
  "out_in"  nn.Linear's own (out, in), applied with F.linear (bf16 / fp16 anywhere, fp32 on a GPU)
  "in_out"  the (in, out) transpose, applied as x @ w
  "dual"    both: fp32 on a CPU, where F.linear on (out, in) is the faster for 2-3 rows and the
            transpose for every other row count (mm picks per call)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speclab.models import kernels
from speclab.models.lean.archs import arch_of


def pack_model(model, layout: str):
    """The fused / transposed weights, built once per model and reused by every decode (building
    them is a copy of every matrix). Rebuilt if any parameter was modified in place since."""
    key = (layout, sum(p._version for p in model.parameters()),
           tuple(p.data_ptr() for p in model.parameters()))
    cached = model.__dict__.setdefault("_speclab_packed", {}).get(layout)
    if cached is not None and cached[0] == key:
        return cached[1]
    offset = arch_of(model).norm_offset
    with torch.no_grad():
        layers = [fuse(layout, wqkv=(l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight),
                           wo=(l.self_attn.o_proj.weight,), w13=(l.mlp.gate_proj.weight, l.mlp.up_proj.weight),
                           w2=(l.mlp.down_proj.weight,))
                  | dict(ln1=norm_weight(l.input_layernorm.weight, offset),
                         ln2=norm_weight(l.post_attention_layernorm.weight, offset)) | deltas(l)
                  for l in model.model.layers]
        head = fuse(layout, head=(model.lm_head.weight,))
    model._speclab_packed[layout] = (key, (layers, head))
    return layers, head


def norm_weight(w: torch.Tensor, offset: bool) -> torch.Tensor:
    """What an RMSNorm multiplies the normalised rows by: its weight, or (Gemma, lean.archs
    norm_offset) 1 + weight in float32, as GemmaRMSNorm computes it before casting the product."""
    return 1.0 + w.float() if offset else w


def deltas(layer) -> dict:
    """What a layer has beyond Llama's weights (lean.archs): the projections' biases, fused as
    their matrices are (name + "_b", added by mm), and Qwen3's per-head q / k norm weights."""
    a, m = layer.self_attn, layer.mlp
    out = {}
    if a.q_proj.bias is not None:
        out["wqkv_b"] = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
    if a.o_proj.bias is not None:
        out["wo_b"] = a.o_proj.bias
    if m.gate_proj.bias is not None:
        out["w13_b"] = torch.cat([m.gate_proj.bias, m.up_proj.bias])
    if m.down_proj.bias is not None:
        out["w2_b"] = m.down_proj.bias
    if getattr(a, "q_norm", None) is not None:
        out["q_norm"], out["k_norm"] = a.q_norm.weight, a.k_norm.weight
    return out


def packed_matrices(model) -> list[torch.Tensor]:
    """The packed matrices speclab's bf16 kernel reads for a decode step of `model` (each layer's
    four and the LM head), as _packed built and cached them; [] if no forward has built them."""
    built = model.__dict__.get("_speclab_packed", {}).get("packed")
    if built is None:
        return []
    layers, head = built[1]
    return [w.data for d in layers + [head] for w in d.values() if isinstance(w, kernels.Packed)]


def rope_tables(model, max_len: int, D: int):
    """cos and signed sin (S, D) for positions 0..max_len-1, computed once per model and length.
    rotate_half(x) * sin == roll(x, D/2) * sin_signed, so RoPE is one roll and two products."""
    tables = model.__dict__.setdefault("_speclab_rope", {})
    if max_len not in tables:
        with torch.no_grad():
            inner = model.model
            pos = torch.arange(max_len, device=inner.embed_tokens.weight.device)[None]
            cos, sin = inner.rotary_emb(inner.embed_tokens.weight[None, :1], pos)   # (1, S, D) each
            tables[max_len] = cos[0], torch.cat([-sin[0, :, : D // 2], sin[0, :, D // 2:]], -1)
    return tables[max_len]


def fuse(layout: str, **groups) -> dict:
    """name -> nn.Linear weights (out, in) to fuse along out. Gives name: the fused (out, in) matrix
    (layouts "out_in", "dual"), name + "_t": its (in, out) contiguous transpose ("in_out", "dual"),
    name + "_k": the kernel's packed copy ("packed")."""
    out = {}
    for name, ws in groups.items():
        fused = torch.cat(ws) if len(ws) > 1 else ws[0]
        if layout == "packed":
            out[name + "_k"] = kernels.Packed(fused)
        if layout in ("in_out", "dual"):
            out[name + "_t"] = fused.t().contiguous()
        if layout in ("out_in", "dual"):
            out[name] = fused
    return out


def mm(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    """x (T, in) times the weight `name` -> (T, out), on the layout measured fastest for T rows;
    plus its bias name + "_b" where the model has one (added as nn.Linear adds it, in the product)."""
    b = w.get(name + "_b")
    packed = w.get(name + "_k")
    if packed is not None:                    # plain Llama only (lean.archs.Arch.native): no bias
        return packed(x)
    t = w.get(name + "_t")
    if t is None or (2 <= x.shape[0] <= 3 and name in w):
        return F.linear(x, w[name], b)
    return x @ t if b is None else torch.addmm(b, x, t)
