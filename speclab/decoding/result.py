"""What a run returns, whatever its engine: the text, the new ids and the trace (`Result`)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from speclab import metrics, records
from speclab.trace import Trace, TraceError


@dataclass
class Result:
    text: str
    ids: list[int]                 # new token ids
    trace: Trace

    def __post_init__(self):
        # the suite (tests/conftest.py) runs every method with strict records: a key no record type
        # declares is a method's fact no reader can trust, found the day it is written
        if os.environ.get(records.STRICT_ENV) == "1" and (keys := records.undeclared(self.trace)):
            raise TraceError(f"{self.trace.method} wrote info keys no record type declares: {sorted(keys)}; "
                             "declare them (speclab.records.record) beside the method")

    @property
    def stats(self) -> dict:
        t = self.trace.totals
        return dict(new_tokens=t.new_tokens, target_forwards=t.target_forwards,
                    draft_forwards=t.draft_forwards, tau=t.tau, wall_s=t.wall_s,
                    # alpha: the papers' per-token rate (accepted / judged), the cost model's; kept:
                    # accepted / drafted, every drafted token counted (metrics' docstring)
                    alpha=metrics.token_alpha(self.trace.rounds), kept=t.alpha,
                    drafted=t.drafted, accepted=t.accepted, draft_s=t.draft_s, verify_s=t.verify_s)
