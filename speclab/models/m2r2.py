"""M2R2's accelerated residual stream on a frozen target (Bhendawade et al. 2025, "M2R2: Mixture of
Multi-Rate Residuals for Efficient Transformer Inference", arXiv 2502.02040).

The target's own residual stream (the slow one) moves one layer's worth per layer: after l layers
its state x_l reaches the final representation x_L only at l = L. M2R2 runs a second stream beside
it, through the same first E layers, that moves R times as fast: accelerator adapters add a low-rank
update to each layer, trained so that the fast state after j layers lines up with the slow state
after R j layers (R = L / E: the fast stream reaches the final representation after E layers).
Through the target's shared final norm and head, the fast stream's early exits then agree with the
final layer where the plain exits do not yet, so a self-speculative draft can exit earlier.

    fast layer i (i < E), on the fast state f (T, C):
      h  = ln1_i(f)
      q  = Wq_i h + (alpha / r) Bq_i Aq_i h        the adapter changes what the fast stream asks ...
      k, v = Wk_i h, Wv_i h                        ... never the keys and values it shares
      a  = attention(q over the slow stream's cached keys and values of the committed text,
                     and the fast rows' own)        the shared KV cache: no cache of its own
      f  = f + Wo_i a + (alpha / r) Bo_i Ao_i a
      h2 = ln2_i(f)
      f  = f + MLP_i(h2) + (alpha / r) Bf_i Af_i h2 an accelerator beside the MLP
    exit after layer j: logits = head(norm(f))       the target's own final norm and head

The B matrices start at zero: an untrained accelerator is the target's plain exit after E layers
(LayerSkip's draft), exactly. The target stays frozen; the verify is its own, so whatever the
accelerator learns changes the speed only. To draft, `fold` merges the adapters into copies of the
first E layers' products (the MLP's accelerator as extra columns of its input product), so a fast
layer runs as many products as a plain one and a draft step costs what layer-skip's exit costs.

The paper's accelerator adapters, shared KV cache and its rate-aligned training are followed; its
ARLA router (attention over the fast stream's latent changes deciding the exit) is replaced by the
exit's own top-1 confidence (speclab/decoding/drafters/m2r2.py), and the paper's full fine-tune
of both streams by adapters on the frozen target (a retrained copy of a zoo target would not fit the
zoo's size line). speclab/train/m2r2.py trains it.

An adapter directory (speclab.models.adapter, kind "m2r2"): config.json (the target's config plus
`m2r2`: layers E, rank r, alpha, rate R, and the held-out alignment per layer, plain and
accelerated, that the trainer measured) and model.safetensors (q_a (E, C, r), q_b (E, r, Hq D),
o_a (E, Hq D, r), o_b (E, r, C), f_a (E, C, r), f_b (E, r, C), and an empty head_ids).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speclab.models import kernels
from speclab.models.adapter import llama_config_like
from speclab.models.lean.forward import _rope
from speclab.models.lean.weights import mm


def m2r2_config(base_cfg, layers: int, rank: int, alpha: float, rate: float | None = None):
    """The target's config with the accelerator's shape in `m2r2` (rate None: L / layers)."""
    cfg = llama_config_like(base_cfg)
    n = cfg.num_hidden_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < n:
        raise ValueError(f"m2r2: layers (the fast stream's depth) must be in 1..{n - 1} (the target has {n}), "
                         f"got {layers!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"m2r2: rank must be an integer >= 1, got {rank!r}")
    rate = n / layers if rate is None else float(rate)
    if not 1 <= rate <= n:
        raise ValueError(f"m2r2: rate must be in 1..{n} (slow layers per fast layer), got {rate}")
    cfg.m2r2 = {"layers": int(layers), "rank": int(rank), "alpha": float(alpha), "rate": rate}
    return cfg


def slow_layer(j: int, rate: float, n_layers: int) -> int:
    """The slow layer the fast state after j layers is aligned with: round(R j), at most L."""
    return min(n_layers, max(1, round(rate * j)))


class Accelerator(nn.Module):
    """The accelerator adapters of the fast stream's E layers (module docstring)."""

    def __init__(self, base, cfg, head_ids: torch.Tensor | None = None):
        super().__init__()
        m = cfg.m2r2
        C, Hq = cfg.hidden_size, cfg.num_attention_heads
        D = getattr(cfg, "head_dim", None) or C // Hq
        self.config = cfg
        self.layers, self.rank, self.rate = int(m["layers"]), int(m["rank"]), float(m["rate"])
        self.scale = float(m["alpha"]) / self.rank
        E, r = self.layers, self.rank
        self.q_a = nn.Parameter(torch.randn(E, C, r) * C ** -0.5)
        self.q_b = nn.Parameter(torch.zeros(E, r, Hq * D))
        self.o_a = nn.Parameter(torch.randn(E, Hq * D, r) * (Hq * D) ** -0.5)
        self.o_b = nn.Parameter(torch.zeros(E, r, C))
        self.f_a = nn.Parameter(torch.randn(E, C, r) * C ** -0.5)
        self.f_b = nn.Parameter(torch.zeros(E, r, C))
        self.register_buffer("head_ids", torch.zeros(0, dtype=torch.long), persistent=False)

    def delta(self, which: str, layer: int, h: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out): the low-rank update `which` ("q", "o" or "f") of fast layer `layer`."""
        a, b = getattr(self, which + "_a")[layer], getattr(self, which + "_b")[layer]
        return (h @ a.to(h)) @ b.to(h) * self.scale

    def alignment(self) -> dict:
        """The held-out alignment the trainer measured (config `m2r2`): per layer 1..L the plain exit's
        and 1..E the fast stream's top-1 agreement with the final layer (empty when not measured)."""
        m = self.config.m2r2
        return {"plain": list(m.get("align_plain") or []), "fast": list(m.get("align_fast") or [])}

    def check_target(self, target_model, name: str = "the target"):
        from speclab.models.adapter import check_trained_for
        check_trained_for(self.config, target_model, name, "this M2R2 accelerator was", "speclab train m2r2")


@torch.no_grad()
def fold(lm, acc: Accelerator) -> list[dict]:
    """The fast stream's products with the accelerator folded in, one dict a fast layer, (in, out) in
    the lean target `lm`'s dtype and device: "qkv" = [Wq + s (Aq Bq)^T | Wk | Wv] (C, (Hq + 2 Hkv) D),
    "o" = Wo + s (Ao Bo)^T, "w13f" = [W_gate | W_up | s Af Bf] (C, 2 I + C) (the MLP's two input
    products and the accelerator beside it in one product), and their biases where the target has
    them. A draft step then runs as many products a layer as the target's own layer does; the same
    math as Accelerator.delta, rounded once more."""
    out, s = [], acc.scale
    for i in range(acc.layers):
        layer = lm.model.model.layers[i]
        at, mlp = layer.self_attn, layer.mlp

        def t(lin):
            return lin.weight.float().t()

        def b(lin, n):
            return lin.bias.float() if getattr(lin, "bias", None) is not None else torch.zeros(n, device=dev)

        def ab(which):                                                          # s A B: (in, out)
            return (getattr(acc, which + "_a")[i].float() @ getattr(acc, which + "_b")[i].float()).to(dev) * s
        dev = at.q_proj.weight.device
        C, I = t(mlp.gate_proj).shape
        w = {"qkv": torch.cat([t(at.q_proj) + ab("q"), t(at.k_proj), t(at.v_proj)], 1),
             "qkv_b": torch.cat([b(at.q_proj, at.q_proj.out_features), b(at.k_proj, at.k_proj.out_features),
                                 b(at.v_proj, at.v_proj.out_features)]),
             "o": t(at.o_proj) + ab("o"), "o_b": b(at.o_proj, C),
             "w13f": torch.cat([t(mlp.gate_proj), t(mlp.up_proj), ab("f")], 1),
             "w13f_b": torch.cat([b(mlp.gate_proj, I), b(mlp.up_proj, I), torch.zeros(C, device=dev)])}
        out.append({k: v.to(lm.device, lm.dtype).contiguous() for k, v in w.items()} | {"split": [I, I, C]})
    return out


def _lin(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return torch.addmm(w[name + "_b"], x, w[name])


@torch.inference_mode()
def fast_forward(lm, folded: list[dict], ids: torch.Tensor, upto: int, exit_test=None) -> tuple:
    """The fast stream (`folded`: fold(lm, accelerator)) over rows ids (T,) after the first lm.n
    cached tokens of the lean target `lm`, through at most `upto` layers -> (logits (V,) of the last
    row, the layer it exited after).

    exit_test(layer, logits) -> bool, asked after each layer below `upto` (None: a fixed exit at
    `upto`): True exits there. A row that exits early still writes the keys and values of the
    layers up to `upto` from its exit state (CALM's state propagation), so a later draft row that
    runs deeper reads entries for it. Writes cache slots lm.n .. lm.n + T - 1 of those layers and
    advances lm.n by T, as an early-exit draft does; the caller drops them before the verify."""
    past, T = lm.n, ids.shape[0]
    if past + T > lm.max_len:
        raise ValueError(f"{past + T} cache slots exceed the cache of {lm.max_len}")
    # the thread count the target's own forwards of this size run with (kernels.TeamSize): on a busy
    # CPU two threads per tiny product wait at every op's barrier
    with kernels.on_team(getattr(lm, "team", None), ("m2r2", T, upto, exit_test is not None), T):
        return _fast(lm, folded, ids, upto, exit_test, past, T)


def _fast(lm, folded: list[dict], ids: torch.Tensor, upto: int, exit_test, past: int, T: int) -> tuple:
    cos, sin = lm.cos[past:past + T][:, None], lm.sin[past:past + T][:, None]
    mask = torch.ones(T, past + T, dtype=torch.bool, device=lm.device).tril(past) if T > 1 else None
    Hq, Hkv, D = lm.Hq, lm.Hkv, lm.D
    x = lm.embed_ids(ids)
    out, layer = None, upto
    for i in range(upto):
        w, f = lm.layers[i], folded[i]
        h = lm.rms(x, w["ln1"])
        qkv = _lin(h, f, "qkv")                                                 # (T, (Hq + 2 Hkv) D)
        qk = _rope(lm.qk_heads(qkv, w), cos, sin).transpose(0, 1)
        lm.kv[i, 0, :, past:past + T] = qk[Hq:]
        lm.kv[i, 1, :, past:past + T] = qkv[:, (Hq + Hkv) * D:].view(T, Hkv, D).transpose(0, 1)
        if out is not None:         # exited: keys and values only, from the exit state
            continue
        a = lm._attend(qk[:Hq], lm.kv[i, 0, :, : past + T], lm.kv[i, 1, :, : past + T], mask)
        x = x + _lin(a.transpose(0, 1).reshape(T, Hq * D), f, "o")
        g, u, fast = _lin(lm.rms(x, w["ln2"]), f, "w13f").split(f["split"], -1)
        x = x + mm(lm.act(g) * u, w, "w2") + fast                              # the MLP and the accelerator
        if i + 1 < upto and exit_test is not None:
            logits = lm.final_norm_head(x[-1:]).float()[0]
            if exit_test(i + 1, logits):
                out, layer = logits, i + 1
    lm.n = past + T
    if out is None:
        out = lm.final_norm_head(x[-1:]).float()[0]
    return out, layer
