"""Where a grafting tree's accepted tokens came from: the head's guesses or the retrieved copy.

    graft_figure(trace, step)   per round, the accepted draft tokens from the head and from the copy
                                (stacked bars); markers above for the copy nodes grafted in and the
                                head's leaves pruned to make room (Graft); `step` marked
    has_grafts(trace)           some round recorded grafted copy nodes

It is the HeadCoverage record's figure (speclab.records: info["grafted"], info["pruned"]): every
run that grafts a copy into a head's tree shows it (graft, eagle[lookup=K]). A node's origin is its
`source` ("h41+1": the head on hidden state 41; "3-gram@12": a copy after a 3-gram match;
"suffix:self": a suffix match's copy drafting alone, eagle's override=N), so the
split needs node records (record "light" or "full"); at record=None the counts still show.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.figures.summary import current
from speclab.trace import Trace

COPY = "#9467bd"


def has_grafts(trace: Trace) -> bool:
    return trace.steps_row().verify and any("grafted" in r.info or "overridden" in r.info for r in trace.rounds)


def copied(source: str) -> bool:
    return "-gram@" in source or source.startswith("suffix:")


def graft_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    xs = list(range(1, len(trace.rounds) + 1))
    head, copy = [], []
    for r in trace.rounds:
        by_id = {n.id: n for n in r.nodes}
        got = [by_id[a] for a in r.accepted if a in by_id]
        copy.append(sum(copied(n.source) for n in got))
        head.append(len(got) - copy[-1])
    grafted = [r.info.get("grafted", 0) for r in trace.rounds]
    pruned = [r.info.get("pruned", 0) for r in trace.rounds]
    alone = [x for x, r in zip(xs, trace.rounds) if "overridden" in r.info]
    top = max([h + c for h, c in zip(head, copy)] + grafted + pruned + [1]) + 1
    fig = go.Figure([
        go.Bar(x=xs, y=head, name="accepted from the head", marker_color=colors.ORIGIN["accepted"],
               hovertemplate="round %{x}: %{y} accepted from the head<extra></extra>"),
        go.Bar(x=xs, y=copy, name="accepted from the copy", marker_color=COPY,
               hovertemplate="round %{x}: %{y} accepted from the copy<extra></extra>"),
        go.Scatter(x=xs, y=grafted, mode="markers", name="copy nodes grafted", marker=dict(symbol="triangle-up",
                   color=COPY, size=9), hovertemplate="round %{x}: %{y} copy nodes grafted<extra></extra>"),
        go.Scatter(x=xs, y=pruned, mode="markers", name="head leaves pruned", marker=dict(symbol="x", color="#d62728",
                   size=8), hovertemplate="round %{x}: %{y} head leaves pruned for the copy<extra></extra>"),
        go.Scatter(x=alone, y=[top - 0.5] * len(alone), mode="markers", name="the copy alone (head rested)",
                   marker=dict(symbol="square", color=COPY, size=7),
                   hovertemplate="round %{x}: a long match; the copy drafted alone<extra></extra>"),
        current(step, top)])
    a_head, a_copy = sum(head), sum(copy)
    fig.update_layout(
        barmode="stack", height=320, margin=dict(l=50, r=10, t=60, b=80), plot_bgcolor="white",
        title=f"accepted draft tokens by origin: {a_head} from the head, {a_copy} from the copy "
              f"({sum(grafted)} copy nodes grafted, {sum(pruned)} head leaves pruned"
              + (f", {len(alone)} rounds the copy alone)" if alone else ")"),
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom"), bargap=0.15,
        xaxis=dict(title="round", range=[0.4, len(xs) + 0.6]), yaxis=dict(title="tokens", range=[0, top]))
    return fig
