"""FreeDave (reference note A.10): draft-and-verify that is lossless against one-token-per-step
greedy low-confidence decoding, with fewer forwards.

From the current canvas and its logits, draft k = 0..K-1 fills the k+1 most confident masked
positions of the block with their proposals; draft 0 IS the next state of the one-per-step
decoder. ONE batched forward over the K drafts gives, for each, the token the one-per-step decoder
would commit next ("target"). Draft j+1 is verified when its extra token is exactly draft j's
target (same position, same token): then it is the state the sequential decoder reaches after
j+2 steps. Keep the longest verified draft and its logits (computed on exactly that canvas), so
each forward advances >= 1 token and the output is the one-per-step output, token for token.

A tree of drafts (EAGLE-2's idea applied here): the chain above guesses one next commit per depth,
and on an AR-adapted block model that guess is often wrong, because the slot after a fresh commit
was predicted while its left neighbour was still a mask, so its guess there is often not the
token it gets (docs/performance.md has the rates measured on smollm2-dllm). So each
draft may branch to the next `branch_slots` slots in confidence order,
each with its `branch_tokens` likeliest tokens, and the K likeliest paths (score: the product of
the proposals' probabilities, halved per rank down the confidence order) share the one forward.
Verification walks from draft 0 down the child whose extra commit equals its parent's target, so
the output is still the one-per-step output; branch 1 x 1 is the chain.
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
    t0, f0, rows, done = time.perf_counter(), den.forwards, None, False
    for lo in range(0, G, block_length):
        hi = lo + block_length
        # a block-causal model computes only the active block: its logits rows are slots [lo, hi)
        base = lo if den.block_causal else 0
        batch = (lambda xs: den.block_rows(xs)) if den.block_causal else (lambda xs: den.logits_batch(xs)[:, P:])
        while not done and bool((x[P + lo:P + hi] == MASK).any()):
            if rows is None:
                rows = never_propose_mask(batch(x[None])[0], MASK)           # (n, V): slots base..base+n-1
            masked = x[P:] == MASK
            x0, conf, margin, entropy = _stats(rows, base, G, MASK, masked & ~_in_block(masked, lo, hi)
                                               if den.block_causal else None)
            order = ranked(conf, _in_block(masked, lo, hi))                  # the sequential commit order
            nodes = draft_tree(rows[order - base], x0[order], order, policy.draft_steps, policy.branch_slots,
                               policy.branch_tokens)
            K = len(nodes)
            drafts = x.repeat(K, 1)                                          # (K, P+G)
            for k, (parent, slot, token) in enumerate(nodes):
                if parent >= 0:
                    drafts[k] = drafts[parent]
                drafts[k, P + slot] = token
            best = 0
            if K == 1:                      # nothing to verify: the next state, logits come later
                x, rows = drafts[0], None
            else:
                lg = never_propose_mask(batch(drafts), MASK)                 # (K, n, V): one forward
                while True:                 # down the child whose commit is its parent's target
                    want = _next_commit(lg[best], base, drafts[best, P:] == MASK, lo, hi)
                    child = next((k for k, n in enumerate(nodes) if n[0] == best and n[1:] == want), None)
                    if child is None:
                        break
                    best = child
                x, rows = drafts[best], lg[best]
                if den.block_causal and not bool((x[P + lo:P + hi] == MASK).any()):
                    rows = None             # a block-causal model's rows for the next block come next call
            path = _path(nodes, best)
            commit = torch.tensor([nodes[k][1] for k in path], dtype=torch.long, device=dev)
            if record:
                mask = torch.zeros_like(masked)
                mask[commit] = True
                steps.append(record_step(record, (lo, hi), masked, x0, conf, margin, entropy, mask, Choice(
                    mask, info={"drafts": K, "accepted_drafts": len(path), "verified_forward": K > 1,
                                "order": commit.tolist(), "tree": [[n[0], n[1], n[2]] for n in nodes],
                                "accepted_node": best}), x[P:], own_tokens=True))
            if progress:
                progress(int((x[P:] != MASK).sum()), G)
            done = eos_stop and eos_id is not None and answer_ended(x[P:], MASK, eos_id)
        if done:
            break
    out = _output(x[P:].tolist(), MASK, eos_id)
    wall = time.perf_counter() - t0
    return out, steps, Totals(wall_s=wall, target_forwards=den.forwards - f0, new_tokens=len(out), verify_s=wall)


def _stats(rows: torch.Tensor, base: int, G: int, mask_id: int, hidden: torch.Tensor | None):
    """Proposals from rows (n, V) of slots base..base+n-1, as (G,) x0, conf, margin, entropy; slots
    without a row, and `hidden` ones (a block-causal model has not looked at them), are unseen."""
    x0, conf, margin, _, entropy = propose(rows, 0.0, None)
    n = rows.shape[0]
    if n < G:
        full = [torch.full((G,), mask_id, dtype=x0.dtype, device=x0.device)]
        full += [torch.zeros(G, dtype=t.dtype, device=t.device) for t in (conf, margin, entropy)]
        for f, part in zip(full, (x0, conf, margin, entropy)):
            f[base:base + n] = part
        x0, conf, margin, entropy = full
    if hidden is not None:
        unseen(hidden, mask_id, x0, conf, margin, entropy)
    return x0, conf, margin, entropy


def draft_tree(rows: torch.Tensor, first: torch.Tensor, order: torch.Tensor, K: int, slots: int,
               tokens: int) -> list[tuple[int, int, int]]:
    """rows (n, V) the logits of the slots in `order` (the eligible slots by confidence), first (n,)
    their top-1 proposals -> the K
    likeliest guesses at the next commits, as a tree: [(parent, slot, token)], node 0 the
    sure one (the most confident slot, its top-1 token; parent -1), every parent before its
    children. A node's children fill one of the next `slots` slots of `order` not on its path with
    one of that slot's `tokens` likeliest tokens; a path's score is the product over its guesses of
    p(token) x 0.5^(rank of the slot among the candidates), best first (ties: first pushed)."""
    import heapq
    probs = rows.softmax(-1)                # first: exactly the one-per-step proposals, whatever topk does with ties
    alts = rows.topk(min(tokens + 1, rows.shape[-1]), dim=-1).indices
    tok = [[f] + [t for t in a if t != f][:tokens - 1] for f, a in zip(first.tolist(), alts.tolist())]
    p = [probs[i, t].tolist() for i, t in enumerate(tok)]
    rank = {int(s): i for i, s in enumerate(order.tolist())}
    nodes, paths, heap, pushed = [(-1, int(order[0]), tok[0][0])], [frozenset([int(order[0])])], [], 0

    def expand(k: int, score: float):
        nonlocal pushed
        rest = [s for s in order.tolist() if s not in paths[k]][:slots]
        for r, slot in enumerate(rest):
            for t in range(len(tok[rank[slot]])):
                pushed += 1
                heapq.heappush(heap, (-score * p[rank[slot]][t] * 0.5 ** r, pushed, k, slot, tok[rank[slot]][t]))

    expand(0, 1.0)
    while len(nodes) < K and heap:
        score, _, parent, slot, token = heapq.heappop(heap)
        nodes.append((parent, slot, token))
        paths.append(paths[parent] | {slot})
        expand(len(nodes) - 1, -score)
    return nodes


def _path(nodes: list[tuple[int, int, int]], k: int) -> list[int]:
    """Node indices from the root to node k."""
    out = []
    while k >= 0:
        out.append(k)
        k = nodes[k][0]
    return out[::-1]


def _in_block(masked: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    el = masked.clone()
    el[:lo] = el[hi:] = False
    return el


def _next_commit(rows: torch.Tensor, base: int, masked: torch.Tensor, lo: int, hi: int) -> tuple[int, int] | None:
    """(position, token) the one-per-step decoder commits next from this canvas's rows (n, V) of
    slots base..base+n-1."""
    el = _in_block(masked, lo, hi)[base:base + rows.shape[0]]
    if not el.any():
        return None
    x0, conf, *_ = propose(rows, 0.0, None)
    p = int(ranked(conf, el)[0])
    return p + base, int(x0[p])
