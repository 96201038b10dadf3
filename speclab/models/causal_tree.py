"""The causal parallel tree drafter's model side (JetSpec, Hu et al. 2026; the drafter, its tree
and its records: speclab/decoding/drafters/causal_tree.py): FlexDraft's mask rows inside the target
(speclab.models.flexdraft) plus a learned rank embedding per branch rank, run with tree-causal
attention among the rows (`tree_visibility`), one forward per tree (`tree_logits`).

An adapter directory (kind "causal-tree"): flexdraft's config and tensors plus `causal_tree`
({"width"}) and `rank_embedding` (width, C). speclab/train/causal_tree.py trains it.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from speclab.models.flexdraft import FlexDraftAdapter, flexdraft_config, rows_forward


def causal_tree_config(base_cfg, first_layer: int, rank: int, alpha: float, k: int, width: int):
    cfg = flexdraft_config(base_cfg, first_layer, rank, alpha, k)
    if width < 1:
        raise ValueError(f"causal-tree: width must be >= 1 (branches per slot), got {width}")
    cfg.causal_tree = {"width": int(width)}
    return cfg


class CausalTreeAdapter(FlexDraftAdapter):
    """FlexDraft's mask embedding and low-rank deltas, plus one rank embedding per branch rank
    (zero at the start: an untrained adapter's ranks differ only in the token they read off)."""

    def __init__(self, base, cfg, head_ids: torch.Tensor | None = None):
        super().__init__(base, cfg, head_ids)
        self.width = int(cfg.causal_tree["width"])
        self.rank_embedding = nn.Parameter(torch.zeros(self.width, cfg.hidden_size))


def tree_shape(k: int, width: int) -> tuple[list[int], list[int], list[int]]:
    """The mask rows of a (k, width) tree: parents (-1: the clean context), ranks, and each row's
    main-chain index (the main row it branches beside; -1 for main rows). Main rows come first
    (row i drafts slot i + 2), then per main row i < k - 2 and rank r: a side row and its child."""
    parents = [i - 1 for i in range(k - 1)]
    ranks, beside = [0] * (k - 1), [-1] * (k - 1)
    for i in range(max(0, k - 2)):
        for r in range(1, width):
            parents += [i - 1, len(parents)]
            ranks += [r, 0]
            beside += [i, i]
    return parents, ranks, beside


def depths_of(parents: list[int]) -> list[int]:
    d = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def tree_visibility(past: int, n_clean: int, parents: list[int], device=None) -> torch.Tensor:
    """(T, past + T) bool, T = n_clean + rows: clean rows causal; a mask row sees the cache, every
    clean row, its ancestors and itself."""
    R = len(parents)
    T = n_clean + R
    vis = torch.ones(T, past + T, dtype=torch.bool, device=device).tril(past)
    vis[n_clean:, past + n_clean:] = False
    for j, p in enumerate(parents):
        a = j
        while a >= 0:
            vis[n_clean + j, past + n_clean + a] = True
            a = parents[a]
    return vis


def branch_rows(parents: list[int], row: int) -> list[int]:
    """The rows of the branch ending at `row`, root first."""
    out = []
    while row >= 0:
        out.append(row)
        row = parents[row]
    return out[::-1]


def tree_logits(lm, adapter: CausalTreeAdapter, clean: torch.Tensor, parents: list[int], ranks: list[int]):
    """ONE forward of the target `lm` (a LeanLM, its cache as the verify left it) over the pending
    tokens `clean` (P,) and one mask row per (parent, rank) -> (1 + R, V) float32 logits: the last
    clean row's (the target's next token), then each mask row's. A row at depth d sits at position
    P_last + d. Writes cache slots past lm.n only; lm.n is unchanged."""
    past, P, dev = lm.n, clean.shape[0], lm.device
    rows = adapter.mask_embedding.to(dev, lm.dtype) + adapter.rank_embedding.to(dev, lm.dtype)[torch.tensor(ranks, device=dev)]
    depth = torch.tensor(depths_of(parents), device=dev)
    pos = torch.cat([torch.arange(past, past + P, device=dev), past + P - 1 + depth])
    return rows_forward(lm, adapter, clean, rows.reshape(len(parents), -1), tree_visibility(past, P, parents, dev), pos)
