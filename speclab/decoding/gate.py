"""Speculate only while it pays: a cost model around any drafter (SmartSpec's lesson: k = 0 is a
valid speculation length).

The gate times every round from one propose() to the next: that period holds everything the round
cost (drafting, the verify forward, acceptance, the drafter's own bookkeeping). It keeps the last
`window` periods of each mode

    spec rounds   seconds per round and tokens committed per round -> seconds per token with drafting
    ar rounds     seconds per round (one token each)               -> seconds per token without

and drafts in a round only while the first cost is no higher than the second (`choose`). Each
cost is a MEDIAN of recent periods, not a running mean: on a busy machine one round in a few is
descheduled and takes many times its cost, and a mean let that one round decide (a slow ar round
made drafting look cheap, a slow spec round the reverse). The ar cost is measured early: right
after `warm` drafting rounds, `ar_samples` plain rounds, so the first decision already compares two
medians. The other mode is probed now and then so its estimate stays fresh: after `probe` rounds,
doubling each time a probe confirms the current choice (up to `max_probe`), back to `probe` when a
probe wins.

What the gate itself costs is bounded, so that a drafter it switches off still runs at ~ar's speed
on a short run (64 tokens): the prompt's prefill round drafts nothing (its draft would push the
whole prompt through the drafter before anything says drafting pays); the plain rounds that
measure ar come first (they cost what ar's do); the warm-up's drafting rounds stop at the first
that costs over LOSING times ar per token; and a probe of a drafter that loses waits until its
expected loss (its round's seconds beyond what its tokens cost plain) is at most PROBE_SHARE of
the time since the last probe, however the doubling schedule stands. A drafter whose round costs
six ar steps for one token then costs one such round in 64 tokens, not six. Under `gate="auto"` it decides for greedy decoding only (see CostGate), so a seeded
sampled run stays reproducible. An ar round is a drafter that proposes nothing: lossless by
construction. Each round's decision and its inputs go into the round's info (`gate`, `spec_tok_s`,
`ar_tok_s`), so the trace shows why a round did not draft.

A plain round must cost what `ar`'s round costs, or the gate compares against the wrong baseline
and every round pays the difference: an inner drafter that makes the target capture hidden states
only for its own use in drafting rounds (`captures_only_when_drafting`, layer-skip's exit scoring:
29 captured layers split the native forward into 29 calls) has the captures switched off in plain
rounds and back on before it drafts again.

The inner drafter observes every round either way (its caches and online statistics stay in step
with the committed text; layer-skip keeps scoring its exits), so switching back costs nothing.
"""
from __future__ import annotations

import statistics
import time
from collections import deque

from speclab.decoding.speculative import Context, Drafter, Outcome, forwards_of
from speclab.decoding.tree import DraftTree

WINDOW = 8          # recent periods per mode whose median is its cost
LOSING = 1.5        # a warm-up drafting round this many times ar's cost per token ends the warm-up
PROBE_SHARE = 0.05  # a losing drafter's probe may cost at most this share of the rounds since the last


def choose(spec: list[tuple[float, int]], ar: list[float]) -> str | None:
    """The cheaper mode per token from measured rounds: spec = [(seconds, tokens committed), ...],
    ar = [seconds, ...] (one token each). Medians of the seconds, so one descheduled round among
    several moves neither cost. Ties go to "spec". None while either mode has no measurement."""
    if not spec or not ar:
        return None
    spec_cost = statistics.median(s for s, _ in spec) / (sum(t for _, t in spec) / len(spec))
    return "spec" if spec_cost <= statistics.median(ar) else "ar"


def probe_wait(spec: list[tuple[float, int]], ar: list[float], share: float = PROBE_SHARE) -> int:
    """Plain rounds to run before probing a drafter that loses, so that the probe's expected loss
    (its median round's seconds beyond what its mean tokens cost in plain rounds) is at most
    `share` of those rounds' time. 0 when a drafting round costs no more than its tokens plain."""
    if not spec or not ar:
        return 0
    a = statistics.median(ar)
    loss = statistics.median(p for p, _ in spec) - a * sum(t for _, t in spec) / len(spec)
    return max(0, int(loss / (share * a) + 0.999)) if loss > 0 else 0


def rates(spec, ar) -> tuple[float | None, float | None]:
    """Tokens per second of each mode (the medians `choose` compares), None without a measurement."""
    s = (sum(t for _, t in spec) / len(spec)) / statistics.median(p for p, _ in spec) if spec else None
    return s, (1.0 / statistics.median(ar) if ar else None)


class CostGate(Drafter):
    """greedy_only: stand aside under sampling. Its decisions follow measured times, so under
    sampling they would change which random numbers a run draws: the same seed would give another
    (equally distributed) text from run to run. Greedy output never depends on them.
    clock: the time source (seconds); a test passes its own to drive the decisions."""

    def __init__(self, inner: Drafter, probe: int = 8, max_probe: int = 64, warm: int = 3,
                 greedy_only: bool = False, window: int = WINDOW, ar_samples: int = 2, clock=time.perf_counter):
        self.inner, self.probe0, self.max_probe, self.warm = inner, probe, max_probe, warm
        self.greedy_only, self.window, self.ar_samples, self.clock = greedy_only, window, ar_samples, clock
        self.name = inner.name

    forwards = forwards_of("inner")

    @property
    def all_rows(self):
        return self.inner.all_rows

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.inner.begin(ctx, target, sampler, gen, record)
        self.spec, self.ar = deque(maxlen=self.window), deque(maxlen=self.window)
        self.mode, self.last_mode, self.t_last = "spec", None, None
        self.since, self.interval = 0, self.probe0
        self.warming = True
        self.committed = 0
        self.active = sampler.greedy or not self.greedy_only
        self.paused = None                  # the target's capture_layers while plain rounds run without them

    def end(self):
        self._resume_captures()
        self.inner.end()

    def _account(self, dt: float):
        """Charge the period since the last propose() to the mode that round ran in."""
        if self.last_mode == "spec":
            self.spec.append((dt, self.committed))
        else:
            self.ar.append(dt)

    def rates(self) -> tuple[float | None, float | None]:
        return rates(self.spec, self.ar)

    def _decide(self) -> str:
        if len(self.ar) < self.ar_samples:  # what a plain round costs, measured first
            return "ar"
        if self.warming and len(self.spec) < self.warm:
            spec = list(self.spec)
            if not spec or choose([(p / LOSING, t) for p, t in spec], list(self.ar)) == "spec":
                return "spec"
        self.warming = False                # warm-up over (or cut short by a drafter that loses)
        best = choose(list(self.spec), list(self.ar))
        if best != self.mode:               # the estimates moved: switch, probe soon
            self.mode, self.since, self.interval = best, 0, self.probe0
        self.since += 1
        wait = self.interval if self.mode == "spec" else max(self.interval, probe_wait(list(self.spec), list(self.ar)))
        if self.since >= wait:              # probe the other mode once
            self.since = 0
            self.interval = min(self.max_probe, self.interval * 2)
            return "ar" if self.mode == "spec" else "spec"
        return self.mode

    def _pause_captures(self):
        if self.paused is None and getattr(self.inner, "captures_only_when_drafting", False):
            self.paused = tuple(getattr(self.target, "capture_layers", ()) or ())
            if self.paused:
                self.target.capture_layers = ()

    def _resume_captures(self):
        if self.paused is not None:
            if self.paused:
                self.target.capture_layers = self.paused
            self.paused = None

    def propose(self, ctx: Context) -> DraftTree:
        if not self.active:
            return self.inner.propose(ctx)
        now = self.clock()
        if self.last_mode is not None:
            self._account(now - self.t_last)
        self.t_last = now
        if ctx.pending > 1:     # the prompt's prefill round: plain, and its period says nothing about either mode
            mode, self.last_mode = "ar", None
        else:
            mode = self.last_mode = self._decide()
        spec, ar = self.rates()
        info = {"gate": mode, "spec_tok_s": None if spec is None else round(spec, 2),
                "ar_tok_s": None if ar is None else round(ar, 2)}
        if mode == "ar":
            self._pause_captures()
            return DraftTree(info=info)
        self._resume_captures()
        tree = self.inner.propose(ctx)
        tree.info.update(info)
        return tree

    def observe(self, out: Outcome) -> None:
        self.committed = len(out.path) + 1
        self.inner.observe(out)
