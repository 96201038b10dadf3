"""Acceptance rules: pure math on tensors, no model in sight.  p = target, q = draft.

  greedy          accept while the draft token is the target's argmax; emit the target's argmax
  spec-sampling   accept x ~ q with probability min(1, p(x)/q(x)); on rejection resample from
                  norm(max(0, p - q)); bonus from p when everything was accepted
  point-mass      q = delta(x) (n-gram, lookup, argmax drafts): accept with p(x); on rejection
                  zero p(x) and renormalise (the same formula with q one-hot)
  tree            multi-draft recursive rejection: try the children of the accepted node in order
                  with the rule above, updating the residual after each rejection (SpecInfer;
                  q = 1 children give sampling without replacement, EAGLE-2 style)

Temperature, top-k and top-p are applied the same way to p and q by `warp`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim, ties to the lowest id. bf16 / fp16 logits are widened first (exact).
    On a CPU numpy's vectorised argmax does it: torch's CPU argmax is scalar code, an order of
    magnitude slower on a row of a 49,152-token vocabulary; both give the same ids."""
    x = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.requires_grad:
        return x.argmax(-1)
    return torch.as_tensor(np.asarray(x.numpy().argmax(-1)))


def warp(logits: torch.Tensor, s: Sampler) -> torch.Tensor:
    """Logits (..., V) -> probabilities after temperature, top-k, top-p (greedy: one-hot argmax)."""
    logits = logits.float()
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / s.temperature
    if s.top_k is not None and s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)   # ties: lowest id first
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= s.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token id (0-d tensor) from probs (V,)."""
    return torch.multinomial(probs, 1, generator=gen)[0]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what is left of p after a rejected draft from q."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q exactly: nothing can have been rejected


def remove_token(p: torch.Tensor, x: int) -> torch.Tensor:
    """Residual for a rejected point-mass draft: p with x zeroed, renormalised."""
    return residual(p, torch.nn.functional.one_hot(torch.tensor(x, device=p.device), p.shape[-1]).float())


def accept_prob(p_x: float, q_x: float | None) -> float:
    """min(1, p(x) / q(x)); q(x) = None means a point-mass draft (q(x) = 1). A token the target
    cannot emit (p(x) = 0) is never accepted, whatever q says; one the draft gave no mass (q(x) = 0,
    a draft that emitted it anyway) always is where p(x) > 0."""
    if p_x <= 0:
        return 0.0
    if q_x is None:
        return min(1.0, p_x)
    return 1.0 if q_x <= 0 else min(1.0, p_x / q_x)


def accepts(u: float, p_x: float, q_x: float | None) -> bool:
    """The speculative-sampling test u <= min(1, p(x)/q(x)) for u ~ U[0, 1), never true where
    p(x) = 0 (u can be exactly 0)."""
    a = accept_prob(p_x, q_x)
    return a > 0 and u <= a


def greedy_chain(draft: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """(accepted count n, emitted token) for a chain: target_argmax has len(draft) + 1 entries."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, target_argmax[n]


def speculative_sampling_chain(draft: list[int], q: torch.Tensor, p: torch.Tensor, u: torch.Tensor,
                               gen: torch.Generator | None):
    """Leviathan / Chen for one chain. q (k, V) draft dists, p (k+1, V) target dists, u (k,).

    Returns (n accepted, emitted token, distribution it was drawn from).
    """
    for i, x in enumerate(draft):
        if not accepts(u[i].item(), p[i, x].item(), q[i, x].item()):
            r = residual(p[i], q[i])
            return i, int(sample(r, gen)), r
    return len(draft), int(sample(p[len(draft)], gen)), p[len(draft)]


@dataclass
class Tried:
    """One sibling tried at one node of the walk. A rule other than `exact` also says what the exact
    rule would have decided there (`exact`), the features it read (`inputs`) and its threshold."""
    node: int
    accepted: bool
    u: float | None
    p_x: float
    q_x: float | None
    exact: bool | None = None
    inputs: dict | None = None
    threshold: float | None = None


def greedy_step(kids: list[int], tokens: list[int], node: int, p_at, argmax_at, tries: list) -> tuple[int, int | None]:
    """One greedy test of the candidates `kids` after `node`: the target's argmax there and the
    first candidate holding it (None: none does); every candidate tried up to it joins `tries`."""
    best = argmax_at(node) if argmax_at is not None else int(greedy_ids(p_at(node)))
    nxt = next((c for c in kids if tokens[c] == best), None)
    for c in kids:
        tries.append(Tried(c, c == nxt, None, float("nan"), None))
        if c == nxt:
            break
    return best, nxt


def walk_tree(children: dict[int, list[int]], tokens: list[int], q_at: dict, p_at, sampler: Sampler,
              gen: torch.Generator | None, draw, argmax_at=None,
              without_replacement: bool = False) -> tuple[list[int], int, torch.Tensor | None, list[Tried]]:
    """Walk a draft tree from the root (-1) with the greedy or the recursive-rejection rule.

    children: node -> its children in try order; tokens: node -> token; q_at: node -> draft dist
    (V,) its children were sampled from, or absent for point-mass children; p_at(node) -> target
    logits (V,) after that node (node -1 = after the committed prefix); draw() -> a uniform float.
    argmax_at(node) -> int, optional: the target's greedy token there, precomputed for the whole
    tree (one host transfer per round instead of one per node).
    Returns (accepted node path, emitted token, distribution it came from or None, tries in order).
    without_replacement: siblings sampled from q without replacement (RSD's Gumbel-Top-k): sibling j
    is tested against q renormalised without the earlier ones (rules/rsd.py).
    """
    node, path, tries = -1, [], []
    while True:
        kids = children.get(node, [])
        if sampler.greedy:
            best, nxt = greedy_step(kids, tokens, node, p_at, argmax_at, tries)
            if nxt is None:
                return path, best, None, tries
            path.append(nxt)
            node = nxt
            continue
        p = warp(p_at(node), sampler)
        q = q_at.get(node)  # (V,) or None for point-mass children
        left = q.clone() if q is not None and without_replacement else None    # q without the tried siblings
        nxt = None
        for c in kids:
            x = tokens[c]
            qj = left / left.sum() if left is not None else q
            p_x, q_x = p[x].item(), (qj[x].item() if qj is not None else None)
            u = draw()
            ok = accepts(u, p_x, q_x)
            tries.append(Tried(c, ok, u, p_x, q_x))
            if ok:
                nxt = c
                break
            p = residual(p, qj) if qj is not None else remove_token(p, x)
            if left is not None:
                left[x] = 0.0
        if nxt is None:
            return path, int(sample(p, gen)), p, tries
        path.append(nxt)
        node = nxt
