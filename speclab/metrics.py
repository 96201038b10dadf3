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
    return max((n.depth for n in rnd.nodes), default=rnd.info.get("depth", rnd.drafted))


def per_position(rounds) -> tuple[list[int], list[float], list[float]]:
    """(depths 1..D, conditional acceptance, unconditional acceptance) over `rounds` (Round objects;
    rounds that drafted nothing are left out). Denominators in the module docstring."""
    rounds = [r for r in rounds if r.drafted]
    D = max((draft_depth(r) for r in rounds), default=0)
    depths, cond, uncond = list(range(1, D + 1)), [], []
    for d in depths:
        reached = [r for r in rounds if accepted_length(r) >= d - 1 and draft_depth(r) >= d]
        cond.append(sum(accepted_length(r) >= d for r in reached) / len(reached) if reached else 0.0)
        uncond.append(sum(accepted_length(r) >= d for r in rounds) / len(rounds))
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
    """How many steps a player walks through: rounds (speculative), strategies (dag) or denoising
    forwards (diffusion)."""
    if trace.engine == "speculative":
        return len(trace.rounds)
    if trace.engine == "dag":
        return len(trace.dag.paths) if trace.dag is not None else 0
    if trace.engine == "diffusion":
        return len(trace.denoise)
    raise ValueError(f"no step view for the {trace.engine!r} engine (speculative, diffusion and dag are supported)")
