"""What a run returns, whatever its engine: the text, the new ids and the trace (`Result`)."""
from __future__ import annotations

from dataclasses import dataclass

from speclab import metrics
from speclab.trace import Trace


@dataclass
class Result:
    text: str
    ids: list[int]                 # new token ids
    trace: Trace

    @property
    def stats(self) -> dict:
        t = self.trace.totals
        return dict(new_tokens=t.new_tokens, target_forwards=t.target_forwards,
                    draft_forwards=t.draft_forwards, tau=t.tau, wall_s=t.wall_s,
                    # alpha: the papers' per-token rate (accepted / judged), the cost model's; kept:
                    # accepted / drafted, every drafted token counted (metrics' docstring)
                    alpha=metrics.token_alpha(self.trace.rounds), kept=t.alpha,
                    drafted=t.drafted, accepted=t.accepted, draft_s=t.draft_s, verify_s=t.verify_s)
