"""Speculate only while it pays: a cost model around any drafter (SmartSpec's lesson: k = 0 is a
valid speculation length).

The gate times every round from one propose() to the next: that period holds everything the round
cost (drafting, the verify forward, acceptance, the drafter's own bookkeeping). It keeps running
means of

    spec rounds   tokens committed per round and seconds per round   -> tokens/s with drafting
    ar rounds     seconds per round (one token each)                 -> tokens/s without

and drafts in a round only while the first rate beats the second. The other mode is probed now and
then so its estimate stays fresh: after `probe` rounds, doubling each time a probe confirms the
current choice (up to `max_probe`), back to `probe` when a probe wins. Under `gate="auto"` it decides for greedy decoding
only (see CostGate), so a seeded sampled run stays reproducible. An ar round is a drafter that
proposes nothing: lossless by construction. Each round's decision and its inputs go into the
round's info (`gate`, `spec_tok_s`, `ar_tok_s`), so the trace shows why a round did not draft.

The inner drafter observes every round either way (its caches and online statistics stay in step
with the committed text; layer-skip keeps scoring its exits), so switching back costs nothing.
"""
from __future__ import annotations

import time

from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree

EMA = 0.3


class CostGate(Drafter):
    """greedy_only: stand aside under sampling. Its decisions follow measured times, so under
    sampling they would change which random numbers a run draws: the same seed would give another
    (equally distributed) text from run to run. Greedy output never depends on them."""

    def __init__(self, inner: Drafter, probe: int = 8, max_probe: int = 64, warm: int = 3,
                 greedy_only: bool = False):
        self.inner, self.probe0, self.max_probe, self.warm = inner, probe, max_probe, warm
        self.greedy_only = greedy_only
        self.name = inner.name

    @property
    def forwards(self):
        return self.inner.forwards

    @forwards.setter
    def forwards(self, v):
        pass

    @property
    def all_rows(self):
        return self.inner.all_rows

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.inner.begin(ctx, target, sampler, gen, record)
        self.spec_s = self.spec_tok = self.ar_s = None     # running means
        self.n_spec = 0
        self.mode, self.last_mode, self.t_last = "spec", None, None
        self.since, self.interval = 0, self.probe0
        self.committed = 0
        self.active = sampler.greedy or not self.greedy_only

    def end(self):
        self.inner.end()

    def _account(self, dt: float):
        """Charge the period since the last propose() to the mode that round ran in."""
        ema = lambda old, new: new if old is None else (1 - EMA) * old + EMA * new
        if self.last_mode == "spec":
            self.spec_s, self.spec_tok = ema(self.spec_s, dt), ema(self.spec_tok, self.committed)
            self.n_spec += 1
        else:
            self.ar_s = ema(self.ar_s, dt)

    def rates(self) -> tuple[float | None, float | None]:
        spec = self.spec_tok / self.spec_s if self.spec_s else None
        return spec, (1.0 / self.ar_s if self.ar_s else None)

    def _decide(self) -> str:
        if self.n_spec < self.warm:
            return "spec"
        spec, ar = self.rates()
        if ar is None:                      # one ar round to learn what a plain round costs
            return "ar"
        best = "spec" if spec >= ar else "ar"
        if best != self.mode:               # the estimates moved: switch, probe soon
            self.mode, self.since, self.interval = best, 0, self.probe0
        self.since += 1
        if self.since >= self.interval:     # probe the other mode once
            self.since = 0
            self.interval = min(self.max_probe, self.interval * 2)
            return "ar" if self.mode == "spec" else "spec"
        return self.mode

    def propose(self, ctx: Context) -> DraftTree:
        if not self.active:
            return self.inner.propose(ctx)
        now = time.perf_counter()
        if self.last_mode is not None:
            self._account(now - self.t_last)
        self.t_last = now
        if ctx.pending > 1:     # the prompt's prefill round: its period says nothing about either mode
            mode, self.last_mode = "spec", None
        else:
            mode = self.last_mode = self._decide()
        spec, ar = self.rates()
        info = {"gate": mode, "spec_tok_s": None if spec is None else round(spec, 2),
                "ar_tok_s": None if ar is None else round(ar, 2)}
        if mode == "ar":
            return DraftTree(info=info)
        tree = self.inner.propose(ctx)
        tree.info.update(info)
        return tree

    def observe(self, out: Outcome) -> None:
        self.committed = len(out.path) + 1
        self.inner.observe(out)
