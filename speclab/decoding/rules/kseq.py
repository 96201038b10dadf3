"""`k-seq`: SpecTr's verify (Sun et al., NeurIPS 2023): k i.i.d. draft chains, K-SEQ selection per
position, lossless.

Token level. Candidates X_1..X_k ~ q i.i.d.; the target is p (both warped alike):

    beta(rho) = sum_x min(q(x), p(x) / rho)          the mass one candidate can cover
    rho*      = the root in [1, k] of f(rho) = 1 - (1 - beta(rho))^k - rho beta(rho)
    for i in 1..k (fixed order, a fresh u each):     accept X_i if u <= min(1, p(X_i) / (rho* q(X_i)))
    all rejected: sample p_res = (p - acc) / (1 - beta)^k,  acc(x) = min(q, p/rho) (1 - (1-beta)^k) / beta

P(Y = x, accepted) = acc(x), and acc <= p exactly where f(rho) <= 0, so the residual carries the
rest of p: the emitted token follows p, and P(accept) = 1 - (1 - beta(rho*))^k. f falls from
f(1) >= 0 to f(k) <= 0; rho* is bracketed on grids over beta read from sorted ratios p/q and
running sums (O(V log V) once per position), keeping the upper end (f <= 0) so p_res >= 0.
With k = 1, rho* = 1: plain speculative sampling.

Sequence level (drafters/spectr.py draws the chains, k of them under the root):

    S = every chain; y = []
    at each depth: the candidates are the survivors' next tokens, a MULTISET (duplicates stay);
        rho* is recomputed with k' = |S| and the p, q after y; K-SEQ picks x
        rejected: x (from p_res) ends the round;  accepted: S = the survivors whose token is x
    every depth accepted: the bonus from p after the chain

Survivors stay i.i.d. q given the new prefix, which is what the next depth's K-SEQ needs. p and q are
read at the last accepted node (every survivor shares its context), and the accepted path is that
node's chain: its tokens are the emitted ones, though a node on it may have failed its own test
where a later duplicate of its token passed. At temperature 0 the drafter drafts one greedy
chain and the greedy match decides, as `exact`'s.

Each test records u, rho*, beta(rho*), k', p(x), q(x), with its acceptance probability as the
threshold u is compared with; `exact` beside it is the single-draft test min(1, p(x)/q(x)) with
the same u (K-SEQ's is never looser: rho* >= 1). `make(..., rho=1.0)` fixes rho instead: k
independent plain tests, the negative control, which over-accepts and is not lossless.
"""
from __future__ import annotations

import numpy as np
import torch

from speclab.decoding.acceptance import Tried, accept_prob, accepts, greedy_step, sample, warp
from speclab.decoding.rules.base import Rule, register_rule

PASSES, GRID = 8, 64                # f on 65 points a pass cuts the bracket 64-fold: (k - 1) / 64^8, fp64's grain


def beta_of(p: torch.Tensor, q: torch.Tensor):
    """beta(rho) = sum_x min(q(x), p(x)/rho) for a rho or an array of them, in fp64 on the host:
    tokens with p/q below rho give p/rho, the others q, so one sort of p/q and two running sums serve
    every rho (numpy's sort: torch's CPU sort of a 49,152-token row is several times slower)."""
    p, q = (x.detach().double().cpu().numpy() for x in (p, q))
    ratio = np.full_like(p, np.inf)                             # q(x) = 0: never below rho, adds nothing
    np.divide(p, q, out=ratio, where=q > 0)
    order = np.argsort(ratio)
    ratio = ratio[order]
    below_p = np.concatenate([[0.0], np.cumsum(p[order])])             # p over the i lowest ratios
    above_q = np.concatenate([np.cumsum(q[order][::-1])[::-1], [0.0]])  # q over the rest

    def beta(rho):
        i = np.searchsorted(ratio, rho)                         # how many ratios lie below rho
        return below_p[i] / rho + above_q[i]
    return beta


def rho_star(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[float, float]:
    """(rho*, beta(rho*)): the root of f(rho) = 1 - (1 - beta)^k - rho beta in [1, k]. f falls, so
    each pass keeps the first grid point where f <= 0 as the upper end: p - acc >= 0 at the rho
    returned. k = 1: rho* = 1."""
    beta = beta_of(p, q)
    lo, hi = 1.0, float(max(k, 1))
    for _ in range(PASSES if k > 1 else 0):
        grid = np.linspace(lo, hi, GRID + 1)
        b = beta(grid)
        below = 1 - (1 - b) ** k - grid * b <= 0
        j = int(below.argmax()) if below.any() else GRID        # f(hi) <= 0 holds by then: keep hi
        lo, hi = float(grid[max(j - 1, 0)]), float(grid[j])
    return hi, float(beta(hi))


def kseq_residual(p: torch.Tensor, q: torch.Tensor, rho: float, b: float, k: int) -> torch.Tensor:
    """p_res = (p - acc) / (1 - beta)^k, clamped at 0 and renormalised (fp64 in, the dtype of p out)."""
    pd, qd = p.double(), q.double()
    cover = 1 - (1 - b) ** k
    acc = torch.minimum(qd, pd / rho) * (cover / b) if b > 0 else torch.zeros_like(pd)
    r = (pd - acc).clamp_min(0)
    total = float(r.sum())
    return (r / total).to(p.dtype) if total > 0 else p      # total 0: every candidate is accepted surely


def kseq(cands: list[int], p: torch.Tensor, q: torch.Tensor, draw, gen: torch.Generator | None,
         rho: float | None = None, b: float | None = None):
    """K-SEQ over the candidate tokens `cands` (a multiset, drawn i.i.d. from q) against p (V,).
    rho (and its beta b): given, or rho* for k = len(cands). Returns (token, index of the accepted
    candidate or None, the tests [(u, acceptance probability)], rho, beta, residual or None)."""
    k = len(cands)
    if rho is None:
        rho, b = rho_star(p, q, k)
    elif b is None:
        b = float(beta_of(p, q)(float(rho)))
    tests = []
    for i, x in enumerate(cands):
        p_x, q_x = float(p[x]), float(q[x])
        a = accept_prob(p_x, q_x * rho)                     # min(1, p(x) / (rho q(x)))
        u = draw()
        tests.append((u, a))
        if a > 0 and u <= a:
            return x, i, tests, rho, b, None
    r = kseq_residual(p, q, rho, b, k)
    return int(sample(r, gen)), None, tests, rho, b, r


def make(params: dict, model=None, rho: float | None = None):
    """The sequence-level walk; rho: fixed instead of rho* (1.0: the negative control)."""

    def walk(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at=None):
        parent = {c: n for n, kids in children.items() for c in kids}
        S, last, tries = [-1], -1, []                  # survivors (their last nodes), last accepted node
        while True:
            cands = [c for n in S for c in children.get(n, [])]
            if sampler.greedy:
                (x, win), dist = greedy_step(cands, tokens, last, p_at, argmax_at, tries), None
            else:
                P = warp(p_at(last), sampler)
                if not cands:                                            # every depth accepted: bonus
                    return chain_to(last, parent), int(sample(P, gen)), P, tries
                Q = q_at.get(last)
                if Q is None:
                    raise ValueError("rule 'k-seq' reads the draft distribution q the candidates were drawn "
                                     "from, and this draft has none: draft with method 'spectr'")
                x, i, tests, r, b, dist = kseq([tokens[c] for c in cands], P, Q, draw, gen, rho)
                win = None if i is None else cands[i]
                for c, (u, a) in zip(cands, tests):
                    p_x, q_x = float(P[tokens[c]]), float(Q[tokens[c]])
                    tries.append(Tried(c, c == win, u, p_x, q_x, exact=accepts(u, p_x, q_x), threshold=a,
                                       inputs=dict(u=round(u, 6), rho=round(r, 6), beta=round(b, 6), k=len(cands),
                                                   p=round(p_x, 6), q=round(q_x, 6))))
            if win is None:
                return chain_to(last, parent), x, dist, tries
            last, S = win, [c for c in cands if tokens[c] == x]
    return walk


def chain_to(node: int, parent: dict) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parent[node]
    return path[::-1]


def p_accept(p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """K-SEQ's acceptance probability 1 - (1 - beta(rho*))^k (the paper's; k = 1: 1 - TV(p, q))."""
    _, b = rho_star(p, q, k)
    return 1 - (1 - b) ** k


KSEQ = register_rule(Rule(
    name="k-seq", guarantee="identical-to-ar", make=make, path="chains", needs_q=True, only_for=("spectr",),
    summary="K-SEQ over the k i.i.d. draft chains' next tokens: accept x with min(1, p(x) / (rho* q(x))), "
            "rho* from 1 - (1 - beta)^k = rho beta, survivors kept (SpecTr, Sun et al. NeurIPS 2023)"))
