"""The metrics, defined once: every view, the bench and the CLI read them from here.

    tau            mean accepted length = new tokens / target forwards. Counts the emitted (bonus or
                   correction) token, so plain ar is 1.00; for a diffusion run it reads as tokens per
                   forward. 0.0 when nothing ran.
    alpha          acceptance rate = accepted draft tokens / drafted tokens (None when nothing was
                   drafted: ar, or a drafter that never found anything).
    per_position   acceptance by draft depth d = 1..D (D the deepest draft), over the rounds that
                   drafted something (record-level independent: without per-node records a round's
                   depth is its `drafted` count, exact for chains, an upper bound for trees):
                     unconditional(d) = #rounds whose accepted path reached depth d
                                        / #rounds that drafted
                     conditional(d)   = #rounds whose accepted path reached depth d
                                        / #rounds whose path reached depth d-1 AND whose draft went
                                          at least d deep (0.0 where no round qualifies)
    calibration    whether the draft knows what it knows: every recorded node whose parent the
                   target accepted (or that hangs from the root) was put to the target; binned by
                   the draft's own probability q of its token, the share of them accepted. A
                   calibrated draft's nodes of q ~ x are accepted ~ x of the time (greedy), and
                   then keeping the nodes of highest cumulative q, EAGLE-2's rule, is the best a
                   tree of that size can do with that draft.
    n_steps        the steps a player walks through: rounds (speculative), denoising forwards
                   (diffusion), strategies (dag).

The cost model (Leviathan et al. 2023; SpecInfer / EAGLE-2 for trees) says why a method is fast or
slow. Two alphas, not to be confused:
    alpha          speclab's acceptance rate above: accepted / DRAFTED. Every drafted token counts,
                   also those after the first rejection, which the target never judged.
    token_alpha    the papers' per-token acceptance rate: accepted / JUDGED, where a draft token is
                   judged when the target reached it (every token up to and including the first
                   rejection; for trees the conditional denominators of per_position). This is the
                   alpha of tau(alpha, k) below; for a chain accepted / drafted = tau - 1 over k.
    expected_tau(a, k)   tokens per round of a chain of k with i.i.d. acceptance a:
                         (1 - a^(k+1)) / (1 - a)   (k + 1 at a = 1)
    tree_tau(cond)       the same from per-depth conditional acceptance c_1..c_D (a tree, or a chain
                         whose acceptance changes with depth): 1 + sum_d prod_{j<=d} c_j; a run whose
                         drafts differ in depth takes each round up to its own depth
    c (cost ratio)       one round's draft + verify seconds / one ar step's seconds, each the mean
                         over the decode rounds of its own run (the prompt's prefill round left out)
    expected speed-up    tau / c;  break-even: the alpha where tau(alpha, k) = c (none when
                         c >= k + 1: even a draft accepted whole cannot pay for its round)

Pure functions of trace data (duck-typed, no imports from the package), so the trace itself can use
them (`Totals.tau`, `Totals.alpha`).
"""
from __future__ import annotations


def tau(new_tokens: int, target_forwards: int) -> float:
    """Mean accepted length: new tokens per target forward (0.0 when no forward ran)."""
    return new_tokens / target_forwards if target_forwards else 0.0


def speedup(wall_s: float, reference_wall_s: float | None) -> float | None:
    """Speed-up over a reference run of the same prompt: its wall time / this run's (the bench's
    speedup_vs_ar, the dashboard's compare table and chart); None without both times."""
    return reference_wall_s / wall_s if reference_wall_s and wall_s else None


def alpha(accepted: int, drafted: int) -> float | None:
    """Acceptance rate: accepted draft tokens / drafted tokens (None when nothing was drafted)."""
    return accepted / drafted if drafted else None


def accepted_length(rnd) -> int:
    """Draft tokens of a round the target accepted (the emitted token not counted)."""
    return len(rnd.accepted)


def draft_depth(rnd) -> int:
    """How deep a round's draft went: from its nodes, or without per-node records (record=None)
    from the depth a tree round notes in its info (a chain's depth is `drafted`)."""
    if rnd.nodes:
        return max(n.depth for n in rnd.nodes)
    depth = rnd.info.get("depth")
    # a tree is never deeper than its node count: a `depth` that is not such a number is not one
    return depth if type(depth) is int and 0 <= depth <= rnd.drafted else rnd.drafted


def per_position(rounds) -> tuple[list[int], list[float], list[float]]:
    """(depths 1..D, conditional acceptance, unconditional acceptance) over `rounds` (Round objects;
    rounds that drafted nothing are left out). Denominators in the module docstring."""
    runs = [(accepted_length(r), draft_depth(r)) for r in rounds if r.drafted]
    D = max((depth for _, depth in runs), default=0)
    # counted in one pass, then summed from the deepest depth down (linear in rounds + depth): a
    # round reaches every d <= min(a + 1, depth), is accepted at every d <= min(a, depth) of those,
    # and counts unconditionally at every d <= a
    reached, kept, reach_a = [0] * (D + 2), [0] * (D + 2), [0] * (D + 2)
    for a, depth in runs:
        reached[min(a + 1, depth)] += 1
        kept[min(a, depth)] += 1
        reach_a[min(a, D)] += 1
    for d in range(D, 0, -1):
        reached[d - 1] += reached[d]
        kept[d - 1] += kept[d]
        reach_a[d - 1] += reach_a[d]
    depths = list(range(1, D + 1))
    cond = [kept[d] / reached[d] if reached[d] else 0.0 for d in depths]
    uncond = [reach_a[d] / len(runs) for d in depths]
    return depths, cond, uncond


def calibration(rounds, bins: int = 10) -> list[tuple[float, float, int, float | None]]:
    """Per q bin [i / bins, (i + 1) / bins): (lower edge, mean q, nodes, share accepted or None),
    over the nodes put to the target (parent accepted or the root) that carry a q, from rounds
    recorded "light" or "full" (record=None keeps no nodes). Nodes without a q (a copy grafted onto
    a tree) are left out; a point-mass draft's nodes claim q = 1.0, all in the top bin."""
    n, hit, qsum = [0] * bins, [0] * bins, [0.0] * bins
    for r in rounds:
        tried = {-1, *r.accepted}
        for node in r.nodes:
            if node.q is None or node.parent not in tried:
                continue
            b = min(int(node.q * bins), bins - 1)
            n[b] += 1
            hit[b] += node.id in tried
            qsum[b] += node.q
    return [(b / bins, qsum[b] / n[b] if n[b] else (b + 0.5) / bins, n[b], hit[b] / n[b] if n[b] else None)
            for b in range(bins)]


def n_steps(trace) -> int:
    """How many steps a player walks through: what the trace's engine row counts (rounds,
    denoising forwards, a DAG's strategies; speclab.trace.Steps)."""
    return trace.steps_row().count(trace)


def expected_tau(a: float, k: int) -> float:
    """Expected tokens per round of a chain of k draft tokens, each accepted with probability a
    (given its predecessors were): (1 - a^(k+1)) / (1 - a); k + 1 at a = 1."""
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"alpha must be in [0, 1] and k >= 0, got alpha={a}, k={k}")
    return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def tree_tau(cond) -> float:
    """Expected tokens per round from per-depth conditional acceptance c_1..c_D:
    1 + sum_d prod_{j<=d} c_j (equals expected_tau(a, D) when every c_j = a)."""
    total, reach = 1.0, 1.0
    for c in cond:
        reach *= c
        total += reach
    return total


def expected_speedup(tau_: float, c: float) -> float:
    """tau tokens per round at a round cost of c ar steps: tau / c."""
    if c <= 0:
        raise ValueError(f"the cost ratio must be > 0, got {c}")
    return tau_ / c


def break_even(k: int, c: float, tol: float = 1e-9) -> float | None:
    """The per-token alpha at which a chain of k breaks even (expected_tau(alpha, k) = c): below it
    the method is slower than ar. 0.0 when c <= 1 (any draft pays); None when c >= k + 1."""
    if c <= 1.0:
        return 0.0
    if c >= k + 1:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:             # expected_tau rises with alpha
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tau(mid, k) < c else (lo, mid)
    return (lo + hi) / 2


def judged(rounds) -> int:
    """Draft tokens the target judged: the conditional denominators of per_position, summed."""
    n = 0
    for r in rounds:
        if r.drafted:
            n += min(accepted_length(r) + 1, draft_depth(r))
    return n


def token_alpha(rounds) -> float | None:
    """The papers' per-token acceptance rate: accepted / judged (None when nothing was judged)."""
    j = judged(rounds)
    return sum(accepted_length(r) for r in rounds if r.drafted) / j if j else None


def _decode_rounds(trace):
    """A run's rounds after the prompt's prefill round (its first)."""
    return trace.rounds[1:] if len(trace.rounds) > 1 else trace.rounds


def round_seconds(trace) -> float:
    """Mean draft + verify seconds of a run's decode rounds (several runs: pooled)."""
    rs = [r for t in _as_list(trace) for r in _decode_rounds(t)]
    return sum(r.draft_s + r.verify_s for r in rs) / len(rs) if rs else 0.0


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def cost_model(trace, reference) -> dict | None:
    """Every term of the cost model for a speculative run against its ar reference (same prompt,
    same settings; or lists of runs and their references, prompt by prompt, pooled): k, both alphas,
    per-depth acceptance, the cost ratio c, expected tau (the chain formula when every draft is a
    chain of one length k, else the per-depth form; rounds that drafted nothing count 1 token) and
    speed-up, break-even, and the measured tokens per round and speed-up. None without rounds."""
    traces, refs = _as_list(trace), _as_list(reference)
    rounds = [r for t in traces for r in _decode_rounds(t)]
    ar_step, round_s = round_seconds(refs), round_seconds(traces)
    if not rounds or not ar_step or not round_s:     # untimed rounds (a peer's summary trace): no c
        return None
    drafting = [r for r in rounds if r.drafted]
    depths = sorted(draft_depth(r) for r in drafting)
    k = depths[(len(depths) - 1) // 2] if depths else 0
    chain = bool(drafting) and all(r.drafted == draft_depth(r) == k for r in drafting)
    _, cond, _ = per_position(drafting)
    a_tok = token_alpha(drafting)
    share = len(drafting) / len(rounds)            # rounds that drafted at all (a gate, a lookup miss)
    # a chain of one length: the papers' formula; otherwise each round up to its own depth (a lookup
    # drafting 5 or 11, a tree) from the per-depth rates, so a short round is not credited with depths
    # only the long ones reached
    tau_draft = (expected_tau(a_tok, k) if chain and a_tok is not None else
                 sum(tree_tau(cond[:draft_depth(r)]) for r in drafting) / len(drafting) if drafting else 1.0)
    tau_exp = (1 - share) + share * tau_draft
    c = round_s / ar_step
    tokens = sum(len(r.tokens) for r in rounds)
    measured = speedup(sum(t.totals.wall_s for t in traces), sum(t.totals.wall_s for t in refs))
    return {"k": k, "chain": chain, "alpha": alpha(sum(accepted_length(r) for r in drafting),
                                                   sum(r.drafted for r in drafting)),
            "token_alpha": a_tok, "per_depth": cond, "drafting_share": share,
            "ar_step_s": ar_step, "round_s": round_s, "c": c,
            "expected_tau": tau_exp, "expected_speedup": expected_speedup(tau_exp, c),
            "break_even": break_even(k, c) if k else None,
            "measured_tau": tokens / len(rounds), "measured_speedup": measured}


def reason_line(m: dict, measured_speedup: float | None = None) -> str:
    """The cost model in one line: 'alpha 0.08 at k 4: expected tau 1.09, round cost 1.52 ar
    steps: 0.72x' (alpha the per-token rate), with the measured speed-up when given."""
    a = m["token_alpha"]
    head = f"per-token alpha {a:.2f} at k {m['k']}" if a is not None else f"no draft at k {m['k']}"
    if m["drafting_share"] < 1.0:
        head += f" ({m['drafting_share']:.0%} of rounds drafted)"
    s = (f"{head}: expected tau {m['expected_tau']:.2f}, round cost {m['c']:.2f} ar steps: "
         f"{m['expected_speedup']:.2f}x")
    return s + (f" (measured {measured_speedup:.2f}x)" if measured_speedup is not None else "")


def times_in(a: float) -> str:
    """0.26 -> '1 time in 4', 0.84 -> '5 times in 6': a rate as a class reads it (denominators <= 10)."""
    from fractions import Fraction
    f = Fraction(a).limit_denominator(10)
    if f.numerator == 0:
        return "less than 1 time in 10"
    if f == 1:
        return "every time" if a >= 1 else "almost every time"
    return f"{f.numerator} time{'s' if f.numerator > 1 else ''} in {f.denominator}"


def plain_reason(m: dict, measured_speedup: float | None = None) -> str:
    """The cost model in words a class reads: 'the draft guessed right 1 time in 4; a round costs
    as much as 2.9 plain steps and yields 1.3 tokens; so it is slower (0.45x expected, 0.43x
    measured)'. The verdict follows the measured speed-up where one is given, else the model's."""
    a = m["token_alpha"]
    guess = ("it drafted nothing here" if a is None else f"the draft guessed right {times_in(a)}")
    if a is not None and m["drafting_share"] < 1.0:
        guess += f" (it drafted in {m['drafting_share']:.0%} of rounds)"
    up = measured_speedup if measured_speedup is not None else m["expected_speedup"]
    verdict = "faster" if up >= 1.05 else "slower" if up <= 0.95 else "about as fast"
    nums = f"{m['expected_speedup']:.2f}x expected" + (
        f", {measured_speedup:.2f}x measured" if measured_speedup is not None else "")
    return (f"{guess}; a round costs as much as {m['c']:.1f} plain steps and yields "
            f"{m['expected_tau']:.1f} tokens; so it is {verdict} ({nums})")


def slower_reason(trace, reference, measured_speedup: float | None = None) -> str | None:
    """reason_line for a run against its ar reference (None when the model has nothing to say)."""
    m = cost_model(trace, reference)
    return None if m is None else reason_line(m, measured_speedup)
