"""EAGLE's training-time test: the head's forward over U steps as training runs it, each step after
the first reading the head's own prediction in place of the target's feature, with the attention a
draft step sees at run time. The trainer's loss (train/heads.py) and the dev score
(train/dev_eval.py) both run it, so it lives below both.
"""
from __future__ import annotations

import torch


def ttt_mask(T: int, U: int) -> torch.Tensor:
    """(U*T, U*T) bool: query (s, t) (step s = 1..U, entry t) sees step-1 keys j <= t-s+1 and, for
    r = 2..s, the step-r key at t-(s-r): the committed entries and its own draft chain."""
    n = U * T
    vis = torch.zeros(n, n, dtype=torch.bool)
    t = torch.arange(T)
    for s in range(1, U + 1):
        q = (s - 1) * T + t
        vis[q[:, None], t[None, :]] = t[None, :] <= (t[:, None] - s + 1)
        for r in range(2, s + 1):
            j = t - (s - r)
            ok = j >= 0
            vis[q[ok], (r - 1) * T + j[ok]] = True
        vis[q, q] = True                                    # every row sees itself (no empty row)
    return vis


def eagle_forward(head, f: torch.Tensor, tok: torch.Tensor, U: int) -> torch.Tensor:
    """Head outputs (U, B, T-1, C) for entries t = 0..T-2: step 1 reads the target's features f
    (B, T, C) post-norm (eagle_step1), step s the head's own output of step s-1 at t-1.

    Steps 1..U-1 run without gradient only to produce the predictions fed back; the last pass
    recomputes every step's input and output with gradient, so the fusion (and an EAGLE-3 head's
    layer fusion) learns from the step-1 entries too: those are what the head's cache holds for
    committed tokens at run time."""
    from speclab.models.heads import eagle_fuse
    B, T, C = f.shape
    Tn = T - 1
    e_in = tok[:, 1:]                                        # entry t pairs f_t with token t+1
    layer, rot = head.model.layers[0], head.model.rotary_emb
    pos = torch.arange(Tn).repeat(U)[None].expand(B, -1)
    feats = [f[:, :Tn]]                      # what each step's entries read (predictions: no gradient)
    out = None
    for s in range(1, U + 1):
        vis = ttt_mask(Tn, s)
        mask = torch.zeros(vis.shape).masked_fill(~vis, float("-inf"))[None, None]
        with torch.set_grad_enabled(torch.is_grad_enabled() and s == U):
            x = torch.cat([eagle_fuse(head, g, e_in) for g in feats], 1)  # (B, s*Tn, C)
            cos, sin = rot(x, pos[:, :s * Tn])
            h = layer(x, attention_mask=mask, position_ids=pos[:, :s * Tn], position_embeddings=(cos, sin))
            h = h[0] if isinstance(h, tuple) else h
        out = h.view(B, s, Tn, C)
        if s < U:                                                    # next step: own prediction at t-1
            prev = head.model.norm(out[:, s - 1].detach())
            feats.append(torch.cat([prev[:, :1], prev[:, :-1]], 1))
    return out.transpose(0, 1)                                       # (U, B, Tn, C)


def eagle_step1(head, xs: list[torch.Tensor]) -> torch.Tensor:
    """(B, T, C) the post-norm feature the head's step 1 reads (speclab.models.heads.eagle_input)."""
    from speclab.models.heads import eagle_input
    return head.model.norm(eagle_input(head, xs))
