"""M2R2's accelerated residual stream: how early it lines up with the final layer, and where it exited.

    stream_figure(trace, step)   left: per layer the share of held-out rows whose exit top-1 is the
                                 final layer's, for the target's plain exits (layers 1..L) and the
                                 accelerated stream (layers 1..E), the exit layer the run drafted
                                 from marked; right: every drafted token of the run at (round, the
                                 layer it exited after), coloured by the verify's verdict, its
                                 confidence against the threshold in the hover; `step` marked
    has_stream_exits(trace)      some round recorded the StreamExit record (m2r2_exits)

It is the StreamExit record's figure (speclab.records); the alignment curves are the part's held-out
measurement (speclab train m2r2), recorded once, on the first round. The masks per round are the
SkipMask record's (figures.skips).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.records import StreamExit
from speclab.trace import Trace

PLAIN, FAST = "#7f7f7f", "#1f77b4"


def has_stream_exits(trace: Trace) -> bool:
    return any("m2r2_exits" in r.info for r in trace.rounds)


def _verdict(r, i: int) -> str:
    n = len(r.accepted)
    return "accepted" if i < n else "rejected" if i == n else "not_reached"


def stream_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    recs = [(x, r, StreamExit.of(r)) for x, r in enumerate(trace.rounds, 1)]
    first = next((s for _, _, s in recs if s is not None and s.m2r2_align_plain is not None), None)
    plain = list(first.m2r2_align_plain or []) if first else []
    fast = list(first.m2r2_align_fast or []) if first else []
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6], horizontal_spacing=0.1, subplot_titles=(
        "agreement with the final layer (held out)", "exit of each drafted token"))
    for name, ys, colour in (("plain exits", plain, PLAIN), ("accelerated stream", fast, FAST)):
        fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)) or [None], y=ys or [None], name=name,
                                 mode="lines+markers", line=dict(color=colour),
                                 hovertemplate=f"{name}, layer %{{x}}: %{{y:.1%}}<extra></extra>"), 1, 1)
    rate = next((s.m2r2_rate for _, _, s in recs if s is not None and s.m2r2_rate), None)
    threshold = next((s.m2r2_threshold for _, _, s in recs if s is not None and s.m2r2_threshold is not None), None)
    points = {v: ([], [], []) for v in colors.DECISION}
    for x, r, s in recs:
        if s is None or not s.m2r2_exits:
            continue
        conf = s.m2r2_conf or [None] * len(s.m2r2_exits)
        for i, (layer, c) in enumerate(zip(s.m2r2_exits, conf)):
            v = _verdict(r, i)
            xs, ys, hov = points[v]
            xs.append(x + (i - (len(s.m2r2_exits) - 1) / 2) * 0.08)
            ys.append(layer)
            rule = ("fixed exit" if threshold is None else
                    f"confidence {'>=' if c is not None and c >= threshold else '<'} threshold {threshold:g}")
            hov.append(f"round {x}, draft token {i + 1}: exited after layer {layer}, confidence "
                       f"{'?' if c is None else f'{c:.3f}'} ({rule}); {colors.DECISION_LABEL[v]}")
    for v, (xs, ys, hov) in points.items():
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], mode="markers", name=colors.DECISION_LABEL[v],
                                 marker=dict(color=colors.DECISION[v], size=7), text=hov or None, hoverinfo="text"),
                      1, 2)
    exits = [layer for _, _, s in recs if s is not None for layer in (s.m2r2_exits or [])]
    if exits:
        top = max(exits)
        fig.add_vline(x=top, line=dict(color=colors.THRESHOLD, dash="dash"), row=1, col=1,
                      annotation_text=f"exit {top}", annotation_position="bottom right")
    L = len(plain) or max(exits, default=1)
    fig.add_trace(go.Scatter(x=[None if step is None else step + 1] * 2, y=[0.5, L + 0.5], mode="lines",
                             name="current", showlegend=False, hoverinfo="skip",
                             line=dict(color=colors.CURRENT, width=2)), 1, 2)
    if exits:
        early = sum(e < max(exits) for e in exits)
        what = (f"{len(exits)} drafted tokens, {early} exited before layer {max(exits)}" if threshold is not None
                else f"{len(exits)} drafted tokens, each after layer {max(exits)}")
    else:
        what = "no drafted tokens"
    lead = (f"fast layer {len(fast)}: {fast[-1]:.0%} against the plain exit's {plain[len(fast) - 1]:.0%}; "
            if fast and len(plain) >= len(fast) else "")
    fig.update_layout(height=360, margin=dict(l=60, r=10, t=70, b=50), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.22, x=1, xanchor="right"),
                      title=f"{trace.method}: accelerated residual stream"
                            f"{f' (rate {rate:g})' if rate else ''}; {lead}{what}")
    fig.update_yaxes(title_text="share of rows", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="round", row=1, col=2)
    fig.update_yaxes(title_text="exit layer", dtick=1, range=[0.5, L + 0.5], row=1, col=2)
    return fig
