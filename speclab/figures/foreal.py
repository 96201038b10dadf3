"""FoReaL's sentence handoff over a run: who wrote each round's tokens, and where the draft parted
ways with the leader.

    handoff_figure(trace, step)   per round, stacked bars: the leader's token, the draft's tokens the
                                  leader would also have written (exact's verdict: accepted) and
                                  those it would not (exact rejects: the misalignment the paper
                                  measures); a marker above each round where a sentence started,
                                  its gate's owner and u in the hover; `step` marked
    has_handoff(trace)            some round recorded a Handoff record (owner)

It is the Handoff record's figure (speclab.records: info["owner"], info["sentence"], info["starts"]).
The split of the draft's tokens needs node records with both verdicts (record "light" or "full");
at record=None the bars show the draft's tokens whole. The gate draws are the rounds' `foreal-gate`
decisions.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.figures.summary import current
from speclab.trace import ACCEPTED, Trace

GATE = "foreal-gate"
AGREE, APART = "#8fd19e", "#d62728"


def has_handoff(trace: Trace) -> bool:
    return trace.steps_row().verify and any("owner" in r.info for r in trace.rounds)


def handoff_counts(trace: Trace) -> tuple[list[int], list[int], list[int]]:
    """Per round: the leader's tokens (the emitted one), the draft's kept tokens exact would also have
    accepted, and those it would have rejected (no verdicts recorded: all counted as agreeing)."""
    lead, agree, apart = [], [], []
    for r in trace.rounds:
        n_draft = min(len(r.accepted), r.kept)       # the cut at max_new_tokens or the end of text
        lead.append(1 if r.kept > n_draft else 0)
        kept = r.accepted[:n_draft]
        by_id = {n.id: n for n in r.nodes}
        off = sum(1 for a in kept if a in by_id and by_id[a].verdicts and by_id[a].verdicts.get("exact") != ACCEPTED)
        agree.append(len(kept) - off)
        apart.append(off)
    return lead, agree, apart


def handoff_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    xs = list(range(1, len(trace.rounds) + 1))
    lead, agree, apart = handoff_counts(trace)
    fig = go.Figure()
    for name, ys, color in (("leader (target)", lead, colors.ORIGIN["target"]),
                            ("draft, as the leader would", agree, AGREE),
                            ("draft, where the leader differs", apart, APART)):
        fig.add_trace(go.Bar(x=xs, y=ys, name=name, marker_color=color,
                             hovertemplate="round %{x}: %{y} " + name + "<extra></extra>"))
    top = max([a + b + c for a, b, c in zip(lead, agree, apart)] + [1]) + 1.5
    sx, sy, hover = [], [], []
    for i, r in enumerate(trace.rounds):
        gates = [d for d in r.decisions if d.policy == GATE]
        if r.info.get("starts") or gates:
            sx.append(i + 1)
            sy.append(lead[i] + agree[i] + apart[i] + 0.6)
            hover.append("; ".join(f"sentence {d.at}: {d.output} (u {num(d.inputs.get('u'))} vs p {num(d.threshold)})"
                                   for d in gates) or "a sentence started")
    fig.add_trace(go.Scatter(x=sx or [None], y=sy or [None], mode="markers", name="sentence start",
                             marker=dict(symbol="triangle-down", size=9, color=colors.CONTEXT),
                             text=hover or None, hovertemplate="round %{x}: %{text}<extra></extra>"))
    fig.add_trace(current(step, top))
    drafted, total = sum(agree) + sum(apart), sum(lead) + sum(agree) + sum(apart)
    fig.update_layout(
        barmode="stack", height=320, margin=dict(l=50, r=10, t=60, b=40), plot_bgcolor="white", bargap=0.15,
        title=f"{trace.method}: {drafted} of {total} tokens by the draft, {sum(apart)} where the leader differs; "
              f"{sum(1 for r in trace.rounds for d in r.decisions if d.policy == GATE and d.output == 'leader')} "
              f"of {sum(1 for r in trace.rounds for d in r.decisions if d.policy == GATE)} sentences led",
        legend=dict(orientation="h", y=-0.2, x=1, xanchor="right"))
    fig.update_xaxes(title="round", range=[0.4, len(xs) + 0.6])
    fig.update_yaxes(title="tokens", range=[0, top])
    return fig
