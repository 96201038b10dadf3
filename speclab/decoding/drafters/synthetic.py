"""Synthetic acceptance: the real engine's round at any acceptance profile you choose.

synthetic   vLLM's `rejection_sample_method: synthetic` (a benchmarking mode of its rejection
            sampler), done as a drafter so the engine itself stays untouched: every round drafts a
            chain of k tokens and the target verifies all k + 1 rows with the exact rule, as a real
            drafter's round does. Which draft tokens are right is chosen by a per-position
            acceptance profile a_1..a_k (a_d: the chance depth d is accepted once depth d - 1 was,
            the `conditional` of speclab.metrics.per_position). Depths that pass are drafted from
            the known answer (`ar`'s output, decoded first, as the oracle does); the first that
            fails gets a token the answer does not have there, and the rest of the chain is filler
            the target never judges. Under greedy decoding the exact rule then accepts exactly the
            chosen depths and the output is `ar`'s, token for token.

What it is for: the cost model's curve (speed-up against alpha at this k and this machine's verify
cost) measured rather than drawn. The draft costs nothing (no model runs), so the speed-up it
measures is the engine's at that acceptance: a real drafter's speed-up below it is its draft's cost.

The draws are balanced rather than independent (depth d passes when its count of passes is below
a_d times the rounds that reached it, rounded to the nearest round), so a run of a few hundred rounds reproduces the
profile to about one round per depth, and the run is the same every time (no random numbers).
Greedy only: under sampling the target's own draw, not the profile, would decide.

Recorded per round, per judged depth: Decision("synthetic", {"depth", "reached", "kept"},
threshold=a_d, output="pass" | "fail", at=d).
"""
from __future__ import annotations

from speclab.decoding.drafters.oracle import OracleDrafter
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision


def parse_profile(profile, alpha: float, k: int | None) -> list[float]:
    """The per-depth conditional acceptance a_1..a_k: `profile` (a list of rates in [0, 1], or a string
    "0.9/0.8/0.7") or, when it is None, `alpha` at each of k depths (k None: 4)."""
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a rate in [0, 1], got {alpha!r}")
    if profile is None:
        return [float(alpha)] * (4 if k is None else k)
    if isinstance(profile, str):
        try:
            rates = [float(x) for x in profile.replace(",", "/").split("/") if x.strip()]
        except ValueError:
            raise ValueError(f"profile {profile!r}: give the per-depth acceptance rates as numbers, e.g. "
                             "profile=0.9/0.8/0.7 or profile=[0.9,0.8,0.7]") from None
    elif isinstance(profile, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                    for x in profile):
        rates = [float(x) for x in profile]
    else:
        raise ValueError(f"profile must be a list of rates or a string like 0.9/0.8/0.7, got {profile!r}")
    if not rates:
        raise ValueError("profile is empty: give one acceptance rate per draft depth, e.g. profile=0.9/0.8/0.7")
    if k is not None and len(rates) != k:
        raise ValueError(f"profile has {len(rates)} rates but k={k}: give one rate per draft depth, or leave k "
                         "out (it is the profile's length)")
    bad = [r for r in rates if not 0.0 <= r <= 1.0]
    if bad:
        raise ValueError(f"acceptance rates must lie in [0, 1], got {bad[0]!r}")
    return rates


class SyntheticDrafter(OracleDrafter):
    name = "synthetic"

    def __init__(self, reference: list[int], k: int | None = None, alpha: float = 0.8, profile=None):
        rates = parse_profile(profile, alpha, k)
        super().__init__(reference, len(rates))
        self.rates = rates

    def begin(self, ctx, target, sampler, gen, record="light"):
        if not sampler.greedy:
            raise ValueError("synthetic is greedy only (temperature 0): under sampling the target's own draw, not "
                             "the profile, decides what is accepted")
        super().begin(ctx, target, sampler, gen, record)
        self.reached = [0] * self.k         # rounds whose draft was judged at depth d
        self.kept = [0] * self.k            # ... and passed there

    def propose(self, ctx: Context) -> DraftTree:
        answer = super().propose(ctx).tokens
        if not answer:                      # off the reference, or at its end: nothing to draft
            return DraftTree(info={"off_reference": True})
        decisions, passed = [], 0
        for d in range(len(answer)):
            a, n = self.rates[d], self.reached[d]
            ok = self.kept[d] < int(a * (n + 1) + 0.5)    # balanced: kept stays a_d of reached, rounded
            self.reached[d] += 1
            self.kept[d] += ok
            if self.record:
                decisions.append(Decision(self.name, {"depth": d + 1, "reached": n + 1, "kept": self.kept[d]},
                                          threshold=a, output="pass" if ok else "fail", at=d + 1))
            if not ok:
                break
            passed += 1
        tokens = answer[:passed]
        if passed < len(answer):            # a token the answer does not have there, then filler to k
            right = answer[passed]
            tokens += [right - 1 if right > 0 else right + 1] + answer[passed + 1:]
        out = DraftTree.chain(tokens, [1.0] * len(tokens), "synthetic", passes=passed)
        out.decisions = decisions
        return out


def decode_answer(params: dict, ar) -> dict:
    """The row's setup: its parameters checked, then the answer it drafts from decoded (ar's output, with
    the run's own sampler, seed and backend), before the run and outside its timing."""
    if params.get("reference") is not None:
        return params
    SyntheticDrafter([], **{k: v for k, v in params.items() if k != "reference"})
    return dict(params, reference=ar())
