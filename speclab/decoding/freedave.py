"""FreeDave (reference note A.10): draft-and-verify that is lossless against one-token-per-step
greedy low-confidence decoding, with fewer forwards.

From the current canvas and its logits, draft k = 0..K-1 fills the k+1 most confident masked
positions of the block with their proposals; draft 0 IS the next state of the one-per-step
decoder. ONE batched forward over the K drafts gives, for each, the token the one-per-step decoder
would commit next ("target"). Draft j+1 is verified when its extra token is exactly draft j's
target (same position, same token): then it is the state the sequential decoder reaches after
j+2 steps. Keep the longest verified draft and its logits (computed on exactly that canvas), so
each forward advances >= 1 token and the output is the one-per-step output, token for token.
"""
from __future__ import annotations

import time
import torch

from speclab.decoding.diffusion import _output, answer_ended, check_shape, never_propose_mask, propose, record_step, unseen
from speclab.decoding.dllm_policies import Choice, FreeDave, ranked
from speclab.trace import DenoiseStep, Totals


def freedave(den, prompt_ids: list[int], policy: FreeDave, gen_length: int, block_length: int | None = None,
             temperature: float = 0.0, seed: int = 0, record: str | None = "light",
             eos_id: int | None = None, eos_stop: bool = True, progress=None):
    """Same contract as diffusion.denoise (greedy only)."""
    if temperature:
        raise ValueError("dllm-freedave is lossless against GREEDY one-token-per-step decoding: use temperature 0")
    block_length = check_shape(gen_length, block_length)
    policy.plan(gen_length, gen_length // block_length)
    dev = next(den.model.parameters()).device
    P, G, MASK = len(prompt_ids), gen_length, den.mask_id
    x = torch.tensor(list(prompt_ids) + [MASK] * G, device=dev)
    den.start(P, block_length)
    steps: list[DenoiseStep] = []
    t0, f0, logits, done = time.perf_counter(), den.forwards, None, False
    for lo in range(0, G, block_length):
        hi = lo + block_length
        while not done and bool((x[P + lo:P + hi] == MASK).any()):
            if logits is None:
                logits = never_propose_mask(den.logits(x)[P:], MASK)         # (G, V)
            x0, conf, margin, _, entropy = propose(logits, 0.0, None)
            masked = x[P:] == MASK
            if den.block_causal:
                unseen(masked & ~_in_block(masked, lo, hi), MASK, x0, conf, margin, entropy)
            order = ranked(conf, _in_block(masked, lo, hi))                  # the sequential commit order
            K = min(policy.draft_steps, len(order))
            drafts = x.repeat(K, 1)                                          # (K, P+G)
            for k in range(K):
                drafts[k, P + order[: k + 1]] = x0[order[: k + 1]]
            if K == 1:                      # nothing to verify: the next state, logits come later
                best, x, logits = 0, drafts[0], None
            else:
                lg = never_propose_mask(den.logits_batch(drafts)[:, P:], MASK)   # (K, G, V): one forward
                best = 0
                while best + 1 < K and _next_commit(lg[best], drafts[best, P:] == MASK, lo, hi) == \
                        (int(order[best + 1]), int(x0[order[best + 1]])):
                    best += 1
                x, logits = drafts[best], lg[best]
                if den.block_causal and not bool((x[P + lo:P + hi] == MASK).any()):
                    logits = None           # a block-causal model's rows for the next block come next call
            commit = order[: best + 1]
            if record:
                mask = torch.zeros_like(masked)
                mask[commit] = True
                steps.append(record_step(record, (lo, hi), masked, x0, conf, margin, entropy, mask, Choice(
                    mask, info={"drafts": K, "accepted_drafts": best + 1, "verified_forward": K > 1,
                                "order": commit.tolist()}), x[P:]))
            if progress:
                progress(int((x[P:] != MASK).sum()), G)
            done = eos_stop and eos_id is not None and answer_ended(x[P:], MASK, eos_id)
        if done:
            break
    out = _output(x[P:].tolist(), MASK, eos_id)
    wall = time.perf_counter() - t0
    return out, steps, Totals(wall_s=wall, target_forwards=den.forwards - f0, new_tokens=len(out), verify_s=wall)


def _in_block(masked: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    el = masked.clone()
    el[:lo] = el[hi:] = False
    return el


def _next_commit(logits: torch.Tensor, masked: torch.Tensor, lo: int, hi: int) -> tuple[int, int] | None:
    """(position, token) the one-per-step decoder commits next from this canvas's logits."""
    el = _in_block(masked, lo, hi)
    if not el.any():
        return None
    x0, conf, *_ = propose(logits, 0.0, None)
    p = int(ranked(conf, el)[0])
    return p, int(x0[p])
