"""dParallel's entropy-threshold commit policy (reference note A.11; Chen et al. 2025, czg1225/dParallel).

Each step, over the eligible slots (masked, in the active block):

    H[i]   = -sum_v p_i(v) log p_i(v)               the step's predictive entropy (nats)
    order  = eligible slots by ascending H           ties to the leftmost
    commit = order[0], and every other slot with H[i] <= threshold

dParallel pairs the rule with a model distilled to be certain sooner (certainty-forcing distillation,
`speclab train dparallel`), so the same rule commits more slots a step: the model changes, not the
loop. The threshold defaults to the paper's 0.5 nats. What the policy read and chose is an
EntropyCommit record (speclab.records): the threshold, the eligible slots lowest entropy first with
their entropies, and how many were under it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from speclab.decoding.dllm_policies import Choice, DiffusionPolicy, View, ranked
from speclab.records import EntropyCommit


@dataclass
class EntropyThreshold(DiffusionPolicy):
    """Commit every eligible slot whose entropy is <= `threshold` nats, always the lowest-entropy one."""
    threshold: float = 0.5

    def plan(self, gen_length: int, n_blocks: int) -> int:
        if not self.threshold > 0:
            raise ValueError(f"threshold must be > 0 (nats; dParallel uses 0.5), got {self.threshold}")
        return gen_length

    def select(self, v: View) -> Choice:
        order = ranked(-v.entropy, v.eligible)          # lowest entropy first, ties leftmost
        e = v.entropy[order]
        keep = e <= self.threshold
        under = int(keep.sum())
        keep[0] = True                                  # at least one slot a step
        commit = torch.zeros_like(v.eligible)
        commit[order[keep]] = True
        rec = EntropyCommit(entropy_threshold=self.threshold, by_entropy=order.tolist(),
                            by_entropy_nats=[round(float(x), 4) for x in e], under_threshold=under)
        return Choice(commit, None, info={**rec.info(), "forced": [] if under else [int(order[0])]})
