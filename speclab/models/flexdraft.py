"""FlexDraft's block drafting inside the target (Zhang et al. 2026, "FlexDraft"; the authors' release
Yaro1214/FlexDraft `flexdraft/draft_model.py`), in speclab's sequential form: one forward of the
target itself drafts a block, with mask rows whose attention in the last layers is tuned.

    rows of a draft forward  the pending committed tokens (clean: the target's own weights, causal
                             over its cache), then k - 1 mask rows at the next positions (input:
                             a learned mask embedding)
    layers < first           the target's own layers for every row
    layers >= first          dual attention: clean rows use the frozen q / k / v / o; mask rows
                             add a low-rank delta to them (LoRA of rank r; FlexDraft tunes full
                             copies, too large for this zoo); norms and MLPs are the target's
    visibility               a clean row sees the cache and the clean rows before it, never a
                             mask; a mask row sees the cache, every clean row and every mask row
                             (bidirectional inside the block)
    readout (shifted)        the last clean row's output is the target's own next-token
                             distribution (exactly: nothing it sees differs from a verify's row);
                             mask row j's output predicts the token after position P + j, so one
                             forward drafts k tokens: the target's next token, then k - 1 guesses

Since clean rows never see a mask and use the target's weights, the committed text's keys and values
are the target's own: the draft reads the target's cache as it is (its rows write the slots past
its end, which the verify overwrites) and needs no cache or model of its own. The verify is the
target's usual one, so the drafts change the speed only: lossless.

An adapter directory (speclab.models.adapter, kind "flexdraft"): config.json (the target's config
plus `flexdraft`: first_layer, rank, alpha, k it was trained for) and model.safetensors
(mask_embedding (C,), qkv_a (n, C, r), qkv_b (n, r, (Hq + 2 Hkv) D), o_a (n, Hq D, r), o_b (n, r, C),
n = layers - first_layer, and an empty head_ids). speclab/train/flexdraft.py trains it.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speclab.models.adapter import llama_config_like
from speclab.models.lean.forward import _rope
from speclab.models.lean.weights import mm


def flexdraft_config(base_cfg, first_layer: int, rank: int, alpha: float, k: int):
    """The target's config with the adapter's shape in `flexdraft`."""
    cfg = llama_config_like(base_cfg)
    n = cfg.num_hidden_layers
    if not 0 <= first_layer < n:
        raise ValueError(f"flexdraft: first_layer must be in 0..{n - 1} (the target has {n} layers), got {first_layer}")
    cfg.flexdraft = {"first_layer": int(first_layer), "rank": int(rank), "alpha": float(alpha), "k": int(k)}
    return cfg


class FlexDraftAdapter(nn.Module):
    """The mask embedding and the mask rows' low-rank attention deltas of the last layers. The
    B matrices start at zero: an untrained adapter drafts with the target's own attention."""

    def __init__(self, base, cfg, head_ids: torch.Tensor | None = None):
        super().__init__()
        fd = cfg.flexdraft
        C, Hq, Hkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        D = getattr(cfg, "head_dim", None) or C // Hq
        self.config = cfg
        self.first, self.rank, self.k = int(fd["first_layer"]), int(fd["rank"]), int(fd["k"])
        self.scale = float(fd["alpha"]) / self.rank
        n, r = cfg.num_hidden_layers - self.first, self.rank
        self.mask_embedding = nn.Parameter(torch.zeros(C))
        self.qkv_a = nn.Parameter(torch.randn(n, C, r) * C ** -0.5)
        self.qkv_b = nn.Parameter(torch.zeros(n, r, (Hq + 2 * Hkv) * D))
        self.o_a = nn.Parameter(torch.randn(n, Hq * D, r) * (Hq * D) ** -0.5)
        self.o_b = nn.Parameter(torch.zeros(n, r, C))
        self.register_buffer("head_ids", torch.zeros(0, dtype=torch.long), persistent=False)

    def qkv_delta(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., (Hq + 2 Hkv) D): what the mask rows add to the fused q | k | v."""
        j = layer - self.first
        return (h @ self.qkv_a[j].to(h)) @ self.qkv_b[j].to(h) * self.scale

    def o_delta(self, layer: int, a: torch.Tensor) -> torch.Tensor:
        j = layer - self.first
        return (a @ self.o_a[j].to(a)) @ self.o_b[j].to(a) * self.scale

    def check_target(self, target_model, name: str = "the target"):
        from speclab.models.adapter import check_trained_for
        check_trained_for(self.config, target_model, name, "this FlexDraft adapter was", "speclab train flexdraft")


def mask_visibility(past: int, n_clean: int, n_masks: int, device=None) -> torch.Tensor:
    """(T, past + T) bool, T = n_clean + n_masks: clean row r sees slots < past + r + 1, a mask row
    sees every slot but the masks' own are seen by masks only (module docstring)."""
    T = n_clean + n_masks
    vis = torch.ones(T, past + T, dtype=torch.bool, device=device).tril(past)
    vis[n_clean:, past + n_clean:] = True
    return vis


@torch.inference_mode()
def draft_logits(lm, adapter: FlexDraftAdapter, clean: torch.Tensor, n_masks: int) -> torch.Tensor:
    """ONE forward of the target `lm` (a speclab.models.lean LeanLM, its cache as the verify left it)
    over the pending tokens `clean` (P,) and n_masks mask rows -> (1 + n_masks, V) float32 logits:
    the last clean row's (the target's next token), then each mask row's. Writes the cache slots
    past lm.n only (the verify overwrites them); lm.n is unchanged."""
    past, P = lm.n, clean.shape[0]
    rows = adapter.mask_embedding.to(lm.device, lm.dtype).expand(n_masks, -1)
    return rows_forward(lm, adapter, clean, rows, mask_visibility(past, P, n_masks, lm.device),
                        torch.arange(past, past + P + n_masks, device=lm.device))


@torch.inference_mode()
def rows_forward(lm, adapter: FlexDraftAdapter, clean: torch.Tensor, rows: torch.Tensor, vis: torch.Tensor,
                 pos: torch.Tensor) -> torch.Tensor:
    """The target's layers over the pending tokens `clean` (P,) then the input vectors `rows` (R, C),
    the adapter's low-rank deltas on the rows from its first tuned layer on, row r attending to the
    slots vis[r] ((P + R, past + P + R) bool) at positions pos (P + R,) -> (1 + R, V) float32
    logits from the last clean row on. Writes the cache slots past lm.n only; lm.n is unchanged."""
    past, P = lm.n, clean.shape[0]
    T = P + rows.shape[0]
    if past + T > lm.max_len:
        raise ValueError(f"{past + T} cache slots exceed the cache of {lm.max_len}")
    x = torch.cat([lm.embed_ids(clean), rows.to(lm.dtype)])
    cos, sin = lm.cos[pos][:, None], lm.sin[pos][:, None]
    Hq, Hkv, D = lm.Hq, lm.Hkv, lm.D
    for i, w in enumerate(lm.layers):
        h = lm.rms(x, w["ln1"])
        qkv = mm(h, w, "wqkv")                                                  # (T, (Hq + 2 Hkv) D)
        if i >= adapter.first:
            qkv[P:] += adapter.qkv_delta(i, h[P:])
        qk = _rope(lm.qk_heads(qkv, w), cos, sin).transpose(0, 1)
        q, k = qk[:Hq], qk[Hq:]
        v = qkv[:, (Hq + Hkv) * D:]
        lm.kv[i, 0, :, past:past + T] = k
        lm.kv[i, 1, :, past:past + T] = v.view(T, Hkv, D).transpose(0, 1)
        a = lm._attend(q, lm.kv[i, 0, :, : past + T], lm.kv[i, 1, :, : past + T], vis)
        a = a.transpose(0, 1).reshape(T, Hq * D)
        o = mm(a, w, "wo")
        if i >= adapter.first:
            o[P:] += adapter.o_delta(i, a[P:])
        x = x + o
        h = lm.rms(x, w["ln2"])
        g, u = mm(h, w, "w13").chunk(2, -1)
        x = x + mm(lm.act(g) * u, w, "w2")
    return lm.final_norm_head(x[P - 1:]).float()
