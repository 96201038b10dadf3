"""SpecDec++'s stopping rule over a run: what its acceptance head predicted, against what the target
did, and the draft length it chose.

    head_pairs(trace)              (round, draft depth d, the head's p_accept of y_d, accepted?) for
                                   every draft token the target judged that the head scored
    stopping_figure(trace, step)   left: calibration, the head's p_accept in 10 bins against the
                                   share of those tokens the target accepted (marker area ~ tokens;
                                   on the diagonal, the head knows); right: per round, the K the
                                   rule drafted over the tokens accepted of them, the stop reason in
                                   the hover; `step` marked
    has_stop_decisions(trace)      some round recorded specdec++ decisions

The pairs come from the rounds' `specdec++` decisions: each names the draft token its estimate is
for (`of`: y_{K-1} for the paper's head, which reads a token's state in the forward that drafts the
next one, so the last token of a draft is never scored; y_K for a head that reads the state that
drafted it); y_d is judged when every token before it was accepted.
The per-step decisions themselves (P(some rejection) against the threshold) are drawn by the
decisions table and summary of every method. Shown for traces of `specdec++` through the view spec
(figures.views wires it: this module imports no view).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.figures.summary import current
from speclab.trace import Trace

POLICY = "specdec++"
BINS = 10


def has_stop_decisions(trace: Trace) -> bool:
    return trace.steps_row().verify and any(d.policy == POLICY for r in trace.rounds for d in r.decisions)


def head_pairs(trace: Trace) -> list[tuple[int, int, float, bool]]:
    out = []
    for i, r in enumerate(trace.rounds):
        n_acc = len(r.accepted)
        for d in r.decisions:
            if d.policy != POLICY or d.at is None:
                continue
            depth = d.inputs.get("of", d.at - 1)        # the draft token the estimate is for (1-based)
            if 1 <= depth <= r.drafted and depth <= n_acc + 1:      # judged: its predecessors were accepted
                out.append((i, depth, float(d.inputs["p_accept"]), depth <= n_acc))
    return out


def stopping_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    pairs = head_pairs(trace)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.38, 0.62], horizontal_spacing=0.1,
                        subplot_titles=("head's p_accept against the target", "draft length chosen per round"))
    cells = [[p for p in pairs if min(int(p[2] * BINS), BINS - 1) == b] for b in range(BINS)]
    pts = [(sum(p[2] for p in c) / len(c), sum(p[3] for p in c) / len(c), len(c)) for c in cells if c]
    total = max(1, len(pairs))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color=colors.REFERENCE, dash="dot"),
                             name="calibrated", hoverinfo="skip", showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=[a for a, _, _ in pts] or [None], y=[s for _, s, _ in pts] or [None], mode="lines+markers",
        name="head", line=dict(color=colors.DECISION["accepted"]), showlegend=False,
        marker=dict(size=[6 + 24 * (n / total) ** 0.5 for *_, n in pts] or None),
        customdata=[n for *_, n in pts] or None,
        hovertemplate="p_accept %{x:.2f}: %{y:.2f} accepted of %{customdata} tokens<extra></extra>"), row=1, col=1)
    xs = list(range(1, len(trace.rounds) + 1))
    acc, drafted = [len(r.accepted) for r in trace.rounds], [r.drafted for r in trace.rounds]
    why = [r.info.get("stop", "") or "—" for r in trace.rounds]
    fig.add_trace(go.Bar(x=xs, y=acc, name="accepted", marker_color=colors.ORIGIN["accepted"],
                         customdata=list(zip(drafted, why)),
                         hovertemplate="round %{x}: %{y} accepted of %{customdata[0]} drafted "
                                       "(stopped: %{customdata[1]})<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter(x=xs, y=drafted, mode="markers", name="drafted K",
                             marker=dict(color=colors.CONTEXT, symbol="line-ew-open", size=12, line=dict(width=2)),
                             hoverinfo="skip"), row=1, col=2)
    top = max(drafted + [1]) + 0.5
    fig.add_trace(current(step, top), row=1, col=2)
    hit = sum(p[3] for p in pairs)
    fig.update_layout(
        title=f"{trace.method}: {len(pairs)} draft tokens scored by the head, {hit} accepted "
              f"(mean p_accept {num(sum(p[2] for p in pairs) / len(pairs)) if pairs else '—'}); "
              f"mean K {num(sum(drafted) / max(1, sum(1 for d in drafted if d)))}",
        height=340, margin=dict(l=50, r=10, t=70, b=40), plot_bgcolor="white", bargap=0.15,
        legend=dict(orientation="h", y=-0.2, x=1, xanchor="right"))
    fig.update_xaxes(title="p_accept (the head)", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title="accepted", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title="round", range=[0.4, len(xs) + 0.6], row=1, col=2)
    fig.update_yaxes(title="tokens", range=[0, top], row=1, col=2)
    return fig

