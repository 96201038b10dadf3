"""Several acceptance rules judging one draft: where a lossy rule accepted what another rule (the
exact one) would not have, the token was "rescued".

A draft node's `decision` and `rule` are the ruling verdict; `verdicts` holds every rule's own
(rule -> "accepted" / "rejected" / "not_reached"), kept where a lossy rule ran (typical acceptance,
LANTERN, Judge). The draft tree marks the nodes where they disagree; the summary counts rescued
tokens per round.

    rescued(node)                 accepted by the ruling rule, not by every rule that judged it
    verdict_text(node)            "exact: rejected, typical: accepted": for hovers and tables
    rescued_figure(trace, step)   rescued tokens per round beside those every rule accepted
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.figures.summary import current, rounds_axis
from speclab.trace import ACCEPTED, DraftNode, Round, Trace

RESCUED = "#ff7f0e"         # the ring round a rescued node, its bars in the summary


def rescued(n: DraftNode) -> bool:
    return n.decision == ACCEPTED and any(v != ACCEPTED for v in n.verdicts.values())


def disagrees(n: DraftNode) -> bool:
    return len(set(n.verdicts.values()) | {n.decision}) > 1 if n.verdicts else False


def verdict_text(n: DraftNode) -> str:
    return ", ".join(f"{rule}: {v.replace('_', ' ')}" for rule, v in n.verdicts.items())


def has_verdicts(trace: Trace) -> bool:
    return any(n.verdicts for r in trace.rounds for n in r.nodes)


def rescued_in(r: Round) -> int:
    return sum(rescued(n) for n in r.nodes)


def rescued_figure(trace: Trace, step: int | None = None) -> go.Figure:
    """Per round, the accepted draft tokens every rule accepted and those only the ruling rule
    did (stacked); `step` marked. Traces: 0 agreed, 1 rescued, 2 current."""
    step = check_step(trace, step, len(trace.rounds)) if step is not None else None
    xs = rounds_axis(trace)
    saved = [rescued_in(r) for r in trace.rounds]
    agreed = [sum(n.decision == ACCEPTED for n in r.nodes) - k for r, k in zip(trace.rounds, saved)]
    rules = sorted({n.rule for r in trace.rounds for n in r.nodes if rescued(n) and n.rule})
    others = sorted({k for r in trace.rounds for n in r.nodes if rescued(n) for k, v in n.verdicts.items()
                     if v != ACCEPTED})
    fig = go.Figure([
        go.Bar(x=xs, y=agreed, name="accepted by every rule", marker_color=colors.ORIGIN["accepted"],
               hovertemplate="round %{x}: %{y} accepted by every rule<extra></extra>"),
        go.Bar(x=xs, y=saved, name="rescued", marker_color=RESCUED,
               hovertemplate="round %{x}: %{y} rescued<extra></extra>"),
        current(step, max((a + s for a, s in zip(agreed, saved)), default=0) + 0.5)])
    who = f" by {', '.join(rules)} (rejected by {', '.join(others)})" if rules else ""
    fig.update_layout(barmode="stack", bargap=0.05, height=260, plot_bgcolor="white",
                      title=f"{sum(saved)} draft tokens rescued{who}", margin=dict(l=40, r=10, t=50, b=40),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      xaxis=dict(title="round", range=[0.4, len(xs) + 0.6]), yaxis=dict(title="tokens"))
    return fig
