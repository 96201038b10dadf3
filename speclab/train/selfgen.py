"""Sequence-level distillation data: the teacher's own greedy continuations of corpus prefixes.

A draft is judged on the text the target itself writes (speculative decoding verifies against the
target's greedy choices), and that text differs from the corpus: it repeats, loops, and prefers
a few idioms. Distilling on corpus windows alone teaches the draft the corpus; adding windows of
the target's own output teaches it the target (Kim & Rush 2016, sequence-level KD).
"""
from __future__ import annotations

import time

import torch


@torch.inference_mode()
def greedy_continuations(teacher, stream: torch.Tensor, minutes: float, gen: torch.Generator,
                         seq_len: int = 512, batch: int = 64, log=print) -> torch.Tensor:
    """Prefixes of corpus tokens (32..192 for seq_len 512) continued greedily to seq_len, for
    `minutes` of wall time (at least one batch).

    Returns (N, seq_len): whole sequences, prefix included so training sees the hand-off from
    corpus text to the teacher's own.
    """
    from tqdm.auto import tqdm
    out, budget, t0 = [], minutes * 60, time.time()
    bar = tqdm(total=int(budget), unit="s", desc="teacher continuations")
    while not out or time.time() - t0 < budget:
        prefix = int(torch.randint(seq_len // 16, seq_len * 3 // 8 + 1, (1,), generator=gen))
        starts = torch.randint(0, len(stream) - prefix, (batch,), generator=gen).tolist()
        x = torch.stack([stream[s:s + prefix] for s in starts])             # (B, prefix)
        y = teacher.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=seq_len - prefix, min_new_tokens=seq_len - prefix,
                             pad_token_id=teacher.config.pad_token_id)        # (B, seq_len)
        out.append(y)
        bar.update(int(time.time() - t0) - bar.n)
    bar.close()
    rows = torch.cat(out)
    log(f"teacher continuations: {len(rows)} sequences, {rows.numel():,} tokens")
    return rows
