"""A learned length policy over a run (SpecKV): what it read, what it chose, what the target did.

    length_figure(trace, step)   left: each round at its draft features (confidence, entropy),
                                 coloured by the draft length the policy chose, hollow where the
                                 target accepted the whole draft; the current round ringed. Right:
                                 per chosen length, the rounds that chose it and their mean
                                 accepted tokens, beside the length itself (all accepted)
    has_length_choices(trace)    some round recorded a DraftLength record (chosen_k)

It is the DraftLength record's figure (speclab.records: info["chosen_k"], info["confidence"],
info["entropy"]); the expected tokens per cost of every length are the rounds' `speckv` decisions.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.trace import Trace


def has_length_choices(trace: Trace) -> bool:
    return trace.steps_row().verify and any("chosen_k" in r.info for r in trace.rounds)


def choices(trace: Trace) -> list[tuple[int, float, float, int, int]]:
    """(round, confidence, entropy, chosen length, accepted) of every round that recorded a choice."""
    return [(i, r.info["confidence"], r.info["entropy"], r.info["chosen_k"], len(r.accepted))
            for i, r in enumerate(trace.rounds) if "chosen_k" in r.info]


def length_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    rows = choices(trace)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("the draft's features, coloured by the length chosen",
                                        "accepted tokens per chosen length"))
    fig.add_trace(go.Scatter(
        x=[r[1] for r in rows] or [None], y=[r[2] for r in rows] or [None], mode="markers", name="rounds",
        marker=dict(color=[r[3] for r in rows] or None, colorscale="Viridis", size=8, showscale=True,
                    colorbar=dict(title="length", x=0.5, len=0.8),
                    symbol=["circle-open" if r[4] == r[3] else "circle" for r in rows] or None),
        customdata=[[r[0] + 1, r[3], r[4]] for r in rows] or None,
        hovertemplate="round %{customdata[0]}: confidence %{x:.3f}, entropy %{y:.2f}: length %{customdata[1]}, "
                      "%{customdata[2]} accepted<extra></extra>", showlegend=False), row=1, col=1)
    here = [r for r in rows if r[0] == step]
    fig.add_trace(go.Scatter(x=[r[1] for r in here] or [None], y=[r[2] for r in here] or [None], mode="markers",
                             name="current", marker=dict(size=16, color="rgba(0,0,0,0)",
                                                         line=dict(color=colors.CURRENT, width=2)),
                             hoverinfo="skip", showlegend=False), row=1, col=1)
    lengths = sorted({r[3] for r in rows})
    mean = [sum(r[4] for r in rows if r[3] == k) / sum(1 for r in rows if r[3] == k) for k in lengths]
    count = [sum(1 for r in rows if r[3] == k) for k in lengths]
    fig.add_trace(go.Bar(x=lengths or [None], y=mean or [None], name="mean accepted",
                         marker_color=colors.ORIGIN["accepted"], customdata=count or None,
                         hovertemplate="length %{x}: %{y:.2f} accepted on average over %{customdata} rounds"
                                       "<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter(x=lengths or [None], y=lengths or [None], mode="markers", name="all accepted",
                             marker=dict(color=colors.CONTEXT, symbol="line-ew-open", size=14, line=dict(width=2)),
                             hoverinfo="skip"), row=1, col=2)
    n = len(rows)
    fig.update_layout(
        title=f"{trace.method}: {n} lengths chosen, mean {num(sum(r[3] for r in rows) / n) if n else '—'}; "
              f"accepted {num(sum(r[4] for r in rows) / n) if n else '—'} a round",
        height=360, margin=dict(l=50, r=10, t=70, b=40), plot_bgcolor="white", bargap=0.3,
        legend=dict(orientation="h", y=-0.2, x=1, xanchor="right"))
    fig.update_xaxes(title="confidence (max q)", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title="entropy (nats)", row=1, col=1)
    fig.update_xaxes(title="chosen length", dtick=1, row=1, col=2)
    fig.update_yaxes(title="tokens", rangemode="tozero", row=1, col=2)
    return fig
