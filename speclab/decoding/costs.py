"""What a verify of T rows costs on this machine, and a draft tree sized to it (Sequoia's lesson:
the best tree depends on the hardware, so measure the hardware).

A draft tree's nodes are nearly free where the verify's extra rows hide behind the weight stream
(AVX512-BF16: 6 rows cost 1.05-1.3 one-row forwards) and dear where they do not (AVX2: 1.5-1.75,
docs/performance.md). `verify_curve` measures c(T), a T-row forward in one-row forwards, on the
run's own model; `fit_nodes` then keeps, each round, the n best nodes of the grown tree that
maximise the expected tokens per unit of cost,

    (1 + s * sum of the n best cumulative draft probabilities) / (c(1 + n) + d)

the 1 being the token every round commits, s the drafter's measured calibration (tokens accepted
over the probability it predicted, so far in the run) and d the drafting's own cost in one-row
forwards (measured round by round). n = 0 is allowed: a round whose best tree would not pay
verifies its root alone. Which nodes are verified never changes what is emitted (the verify
decides), so a fitted tree is exactly as lossless as the method that grew it.
"""
from __future__ import annotations

import statistics
import time
import weakref

import torch

ROWS = tuple(range(1, 11))      # the row counts a fitted tree of up to 9 nodes verifies
_curves: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> {(path, threads): curve}


def verify_curve(target_model, rows=ROWS, reps: int = 20, ctx_len: int = 256, backend: str = "auto") -> dict[int, float]:
    """A forward of T rows in units of a one-token forward, for each T in `rows` (`measure`)."""
    return measure(target_model, rows, reps, ctx_len, backend)[0]


def measure(target_model, rows=ROWS, reps: int = 20, ctx_len: int = 256,
            backend: str = "auto") -> tuple[dict[int, float], float]:
    """A forward of T rows in units of a one-token forward, for each T in `rows`, after a
    `ctx_len`-token context. The row counts take turns on one model (the order rotating round by
    round) and each ratio is the median over rounds of T rows' time over the one-token forward's
    in the same round, so a drift of the machine (a shared VM's memory bandwidth) falls on both.
    -> (the curve, the median seconds of a one-row forward)."""
    from speclab.models.backends import make_lm
    lm = make_lm(target_model, "cost", backend)
    lm.reset()
    lm.forward(torch.arange(ctx_len, device=lm.device) % 100 + 10)
    sizes = sorted({1, *rows})
    ids = {T: torch.arange(T, device=lm.device) + 7 for T in sizes}
    ratios: dict[int, list[float]] = {T: [] for T in sizes}
    seconds: list[float] = []
    # on a GPU a forward returns before its kernels finish: wait for them before reading the clock
    wait = (lambda: torch.cuda.synchronize(lm.device)) if lm.device.type == "cuda" else (lambda: None)
    for r in range(reps + 2):                   # two rounds first to warm the caches up
        took = {}
        for T in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
            wait()
            t0 = time.perf_counter()
            lm.forward(ids[T])
            wait()
            took[T] = time.perf_counter() - t0
            lm.keep(ctx_len)
        if r >= 2:
            seconds.append(took[1])
            for T in sizes:
                ratios[T].append(took[T] / took[1])
    # more rows never cost less: each T's cost at least the cost of fewer (the medians of a busy
    # machine can cross by a few percent)
    curve, most = {}, 1.0
    for T in sorted(rows):
        most = max(most, statistics.median(ratios[T]) if T > 1 else 1.0)
        curve[T] = round(most, 3)
    return curve, statistics.median(seconds)


def machine_curve(target_model, reps: int = 6) -> tuple[dict[int, float], float]:
    """`verify_curve` over ROWS for this model on this process's kernel path and thread count,
    measured once (about 1-2 s for SmolLM2-135M on two cores) and kept with the model while it
    lives. -> (curve, seconds of a one-row forward)."""
    from speclab.models import kernels
    key = (kernels.path(), torch.get_num_threads())
    try:
        per = _curves.setdefault(target_model, {})
    except TypeError:                           # a model that takes no weak reference: no keeping
        per = {}
    if key not in per:
        per[key] = measure(target_model, ROWS, reps=reps, ctx_len=128)
    return per[key]


def given_curve(costs: list | None, fitted: bool, method: str) -> dict[int, float] | None:
    """A method's `costs` parameter (c(T) for T = 1, 2, ... rows, measured on another machine)
    checked: a list starting at 1, every entry a number >= 1, given only with its auto sizing on.
    -> {T: c(T)}, or None when not given."""
    if costs is None:
        return None
    if not fitted or not costs or costs[0] != 1 or any(not isinstance(c, (int, float)) or c < 1 for c in costs):
        raise ValueError(f"{method}: costs is c(T) for T = 1, 2, ... verify rows in one-row forwards, starting at 1 "
                         "(e.g. [1, 1.1, 1.25, 1.4]), and sizes a draft only with its 'auto' setting")
    return {T: float(c) for T, c in enumerate(costs, 1)}


def fit_nodes(scores: list[float], curve: dict[int, float], draft_cost: float = 0.0,
              scale: float = 1.0) -> tuple[int, float, float]:
    """How many of the best nodes to verify. scores: the grown nodes' cumulative draft
    probabilities, best first; curve: c(T) for T = 1 .. len(scores) + 1 at least (T past its end
    cost as its last entry grown linearly). -> (n, expected tokens, cost in one-row forwards)."""
    top = max(curve)
    slope = (curve[top] - curve[top - 1]) if top - 1 in curve else 0.0

    def c(T):
        return curve[T] if T in curve else curve[top] + (T - top) * max(slope, 0.0)
    best = (0, 1.0, c(1) + draft_cost)
    gain = 1.0
    for n, s in enumerate(scores, 1):
        gain += scale * s
        cost = c(1 + n) + draft_cost
        if gain / cost > best[1] / best[2] + 1e-12:
            best = (n, gain, cost)
    return best
