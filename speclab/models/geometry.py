"""Where each row of a forward sits and what it may see: positions and visibility masks for a
chain, a draft tree, a batch of sequences in one cache, and a block-diffusion canvas.

Pure: torch only, nothing of speclab, so every adapter (transformers, the lean forward, the
static-shape runner) and every test builds its masks from the same functions.

Conventions: a visibility is a bool tensor, True = may attend. A float mask (for transformers) is
0 where visible and -inf (or the dtype's minimum) elsewhere. A draft tree is given by `parents`, one
per node after `n_prefix` chain rows (-1 = child of the last prefix row); a node sits at the prefix's
end + its depth and sees the cache, the prefix, its ancestors and itself.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")

# a batch cache is compacted once its hidden slots (padding, rejected drafts) outgrow this many
# times what is committed
COMPACT_AT = 2


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def tree_depths_and_visibility(parents: list[int], n_prefix: int, past: int):
    """Depth (N,) per tree node and the boolean visibility (P+N, past+P+N): True = may attend."""
    N = len(parents)
    depth, seen = [], []                # seen[i]: bit j set = node j is node i or an ancestor
    for i, p in enumerate(parents):     # plain ints: per-node tensor ops cost far more here
        if p >= i:
            raise ValueError(f"tree node {i} has parent {p}: parents must come before children")
        depth.append(depth[p] + 1 if p >= 0 else 1)
        seen.append((seen[p] if p >= 0 else 0) | 1 << i)
    see = torch.tensor([[s >> j & 1 for j in range(N)] for s in seen], dtype=torch.bool).view(N, N)
    P, T = n_prefix, n_prefix + N
    visible = torch.zeros(T, past + T, dtype=torch.bool)
    visible[:, :past] = True
    visible[:P, past:past + P] = torch.tril(torch.ones(P, P, dtype=torch.bool))
    visible[P:, past:past + P] = True
    visible[P:, past + P:] = see
    return torch.tensor(depth, dtype=torch.long), visible


def tree_attention(parents: list[int], n_prefix: int, past: int, device):
    """Depth (N,) of each tree node and the 4-D float mask (1, 1, P+N, past+P+N) for the forward.

    Rows: n_prefix causal tokens, then N tree nodes. A node sees the cache, the prefix and its
    ancestors (and itself); 0 = visible, -inf = hidden.
    """
    depth, visible = tree_depths_and_visibility(parents, n_prefix, past)
    T = visible.shape[0]
    mask = torch.full(visible.shape, NEG_INF).masked_fill(visible, 0.0)
    return depth, mask.view(1, 1, T, -1).to(device)


def tree_positions(depth: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """Position offsets of a verify's rows after the committed tokens: the prefix rows in order, each
    tree node at the prefix's end + its depth (the length of its path)."""
    return torch.cat([torch.arange(n_prefix), n_prefix - 1 + depth])


def row_layout(parents: list[int] | None, n_prefix: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's n new rows: their positions after its committed tokens (n,), and which of
    them each row sees (n, n) bool. A chain (or parents None) is causal; a tree's prefix rows are a
    chain and each draft node sees its ancestors, at position prefix end + depth."""
    if parents is None or is_chain(parents):
        return torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril()
    depth, see = tree_depths_and_visibility(parents, n_prefix, 0)
    return tree_positions(depth, n_prefix), see


# ----------------------------------------------------------------------------------------------
# Block diffusion (Fast-dLLM v2, BD3-LM): causal across blocks, bidirectional inside the block
# being denoised.

def block_of(pos: torch.Tensor, start: int, block_length: int) -> torch.Tensor:
    """Block index of each position; blocks of `block_length` start at `start` (the prompt is < 0)."""
    return torch.div(pos - start, block_length, rounding_mode="floor")


def block_visible(q_pos, q_blk, q_grp, k_pos, k_blk, k_grp) -> torch.Tensor:
    """(Q, K) bool, True = may attend. grp -1 marks clean (committed) tokens, grp g >= 0 the tokens
    of noisy canvas g. Clean tokens attend causally to clean tokens (so committed text is cached
    exactly like an AR model's); a noisy token sees the clean tokens of EARLIER blocks and every
    token of its own block in its own canvas. Training (one noisy copy of the window beside the
    clean one) and decoding (a canvas block after the cache) both build their masks here."""
    qc, kc = (q_grp < 0)[:, None], (k_grp < 0)[None]
    causal = qc & kc & (k_pos[None] <= q_pos[:, None])
    prefix = ~qc & kc & (k_blk[None] < q_blk[:, None])
    own = ~qc & ~kc & (k_grp[None] == q_grp[:, None]) & (k_blk[None] == q_blk[:, None])
    return causal | prefix | own


def additive(visible: torch.Tensor, dtype) -> torch.Tensor:
    """bool (..., Q, K) -> float mask: 0 where visible, the dtype's minimum elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)


# ----------------------------------------------------------------------------------------------
# A batch of sequences in one cache

class BatchSlots:
    """What a batch cache keeps per sequence: its committed cache slots, in order (every other slot
    stays in the cache, hidden by the attention mask), and the first slot its inputs took in the
    last forward. Subclasses (models.hf.BatchCausalLM, models.lean.batch.LeanBatchLM) hold the
    cache and run the forward."""

    def __init__(self, model, rows: int, name: str):
        self.model, self.name = model.eval(), name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.slots: list[list[int]] = [[] for _ in range(rows)]
        self.first: list[int] = [0] * rows
        self.forwards = 0

    @property
    def config(self):
        return self.model.config

    def length(self, row: int) -> int:
        return len(self.slots[row])

    def keep(self, row: int, n_prefix: int, path: list[int]):
        """Commit, for `row`, the first n_prefix inputs of the last forward and the tree slots `path`."""
        f = self.first[row]
        self.slots[row] += [f + i for i in range(n_prefix)] + [f + n_prefix + i for i in path]

    def retain(self, rows: list[int]):
        """Keep only these sequences (finished ones leave the batch)."""
        self.slots = [self.slots[r] for r in rows]
        self.first = [self.first[r] for r in rows]
