"""What-if replay: from one recorded greedy draft-model run, recompute tau for other draft lengths
and thresholds without running the models, and predict the speed-up from tau and forward costs.

Greedy decoding fixes the output, so a chain round starting at output position s accepts exactly the
run of positions s, s+1, ... where the draft's greedy token (given the true prefix) matches the
target's. The recorded rounds tell, per position, match or not and the draft's confidence q.
Positions the run never drafted (after a bonus token) are filled by a seeded draw at the observed
match rate, and reported as `unknown_share`.

ideal speed-up = tau / (k * c_draft / c_target(1) + c_verify(k+1) / c_target(1))
efficiency     = measured speed-up / ideal
"""
from __future__ import annotations

import random

from speclab.trace import ACCEPTED, REJECTED, Trace


def position_outcomes(trace: Trace) -> list[tuple[bool | None, float | None]]:
    """Per new-token position: (draft matched the target?, draft confidence q); None = unknown."""
    out: list[tuple[bool | None, float | None]] = []
    for r in trace.rounds:
        chain = [n for n in r.nodes if n.decision in (ACCEPTED, REJECTED)]
        for n in chain:
            out.append((n.decision == ACCEPTED, n.q))
        if r.drafted == 0 or (chain and chain[-1].decision == ACCEPTED) or not chain:
            out.append((None, None))             # a target-only token: the draft was not asked
    return out[: len(trace.output_ids)]


def simulate_tau(outcomes, k: int, threshold: float | None = None, seed: int = 0) -> dict:
    known = [m for m, _ in outcomes if m is not None]
    rate = sum(known) / len(known) if known else 0.0
    qs = sorted(q for _, q in outcomes if q is not None)
    q_mid = qs[len(qs) // 2] if qs else 1.0
    rng = random.Random(seed)
    filled = [(m if m is not None else rng.random() < rate, q if q is not None else q_mid) for m, q in outcomes]
    pos, rounds, T = 0, 0, len(filled)
    while pos < T:
        n = 0
        while n < k and pos + n < T:
            m, q = filled[pos + n]
            if not m:
                break
            n += 1
            if threshold is not None and q < threshold:
                break                              # the draft stops after a low-confidence token
        pos += n + 1
        rounds += 1
    return dict(k=k, threshold=threshold, tau=T / rounds if rounds else 0.0,
                unknown_share=1 - len(known) / T if T else 0.0)


def ideal_speedup(tau: float, k: float, c_draft: float, c_target1: float, c_verify: float) -> float:
    return tau / (k * c_draft / c_target1 + c_verify / c_target1)


def whatif_table(traces: list[Trace], ks=range(1, 9), thresholds=(0.2, 0.4, 0.6, 0.8)) -> list[dict]:
    """tau for each k (and each threshold at max k), pooled over prompts."""
    outs = [position_outcomes(t) for t in traces]
    rows = []
    for k in ks:
        res = [simulate_tau(o, k) for o in outs]
        T = sum(len(o) for o in outs)
        rounds = sum(len(o) / r["tau"] for o, r in zip(outs, res) if r["tau"])
        rows.append(dict(k=k, threshold=None, tau=round(T / rounds, 3)))
    for th in thresholds:
        res = [simulate_tau(o, max(ks), th) for o in outs]
        T = sum(len(o) for o in outs)
        rounds = sum(len(o) / r["tau"] for o, r in zip(outs, res) if r["tau"])
        rows.append(dict(k=max(ks), threshold=th, tau=round(T / rounds, 3)))
    return rows


def bare_forward_s(model, T: int, ctx_len: int = 256, reps: int = 30, backend: str = "auto") -> float:
    """Median seconds of one bare forward of T new tokens after a `ctx_len`-token context."""
    import statistics
    import time

    import torch

    from speclab.models.backends import make_lm
    lm = make_lm(model, "cost", backend)
    lm.reset()
    lm.forward(torch.arange(ctx_len, device=lm.device) % 100 + 10)
    ids = torch.arange(T, device=lm.device) + 7
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        lm.forward(ids)
        out.append(time.perf_counter() - t0)
        lm.keep(ctx_len)
    return statistics.median(out[reps // 5:])   # the first calls warm caches up


def forward_costs(target_model, draft_model, k: int, ctx_len: int = 256, reps: int = 30,
                  backend: str = "auto") -> dict:
    """Median seconds of one bare forward, measured alone at a `ctx_len`-token context:
    c_target(1) (one token), c_verify (k + 1 tokens), c_draft (one draft token)."""
    timed = lambda model, T: bare_forward_s(model, T, ctx_len, reps, backend)
    costs = {"c_target1": timed(target_model, 1), "c_verify": timed(target_model, k + 1), "k": k}
    if draft_model is not None:
        costs["c_draft"] = timed(draft_model, 1)
    return costs


def verify_costs(target_model, rows=(1, 2, 4, 6, 7, 8, 12, 16, 17, 24), reps: int = 20) -> dict[int, float]:
    """A verify forward of T rows in units of a one-token forward, for each T in `rows`: where a
    draft tree's nodes stop being nearly free on this hardware (the budget of a tree method).
    The row counts take turns on one model (decoding.costs.verify_curve)."""
    from speclab.decoding.costs import verify_curve
    return {T: round(c, 2) for T, c in verify_curve(target_model, rows, reps=reps).items()}