"""FiRST's one choice per request: what each layer's router said about this prompt, and what it skipped.

    router_figure(trace, step)   per layer a bar of the router's score for this prompt (the first
                                 and last layers always run: no bar), dark where the layer is
                                 skipped while decoding, light where it runs; the threshold as a line;
                                 below, the mask every decoded token runs with ("x" skipped); the
                                 title names the layers skipped, the budget and the mode (router, or
                                 the fixed set's training label frequencies)
    has_router_choice(trace)     some round recorded a RouterChoice record (router_scores)

It is the RouterChoice record's figure (speclab.records); the masks per round are the SkipMask
record's (figures.skips draws them over the run). The choice is made once, so `step` only picks
which round is marked as current in the title.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.records import RouterChoice
from speclab.trace import Trace


def has_router_choice(trace: Trace) -> bool:
    return any("router_scores" in r.info for r in trace.rounds)


def choice(trace: Trace) -> RouterChoice | None:
    return next((RouterChoice.of(r) for r in trace.rounds if "router_scores" in r.info), None)


def router_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    c = choice(trace)
    scores = list(c.router_scores or []) if c else []
    skipped = set(c.router_skipped or []) if c else set()
    L = len(scores)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.8, 0.2], shared_xaxes=True, vertical_spacing=0.08)
    for name, keep in (("skipped while decoding", True), ("runs", False)):
        idx = [i for i in range(L) if scores[i] is not None and (i in skipped) == keep]
        fig.add_trace(go.Bar(x=idx or [None], y=[scores[i] for i in idx] or [None], name=name,
                             marker_color=colors.SKIP["x"] if keep else colors.SKIP["."],
                             marker_line=dict(color=colors.CONTEXT, width=1),
                             hovertemplate="layer %{x}: score %{y:.3f}" + (" (skipped)" if keep else "")
                                           + "<extra></extra>"), row=1, col=1)
    ends = [i for i in range(L) if scores[i] is None]
    fig.add_trace(go.Scatter(x=ends or [None], y=[0] * len(ends) or [None], mode="markers", name="always runs",
                             marker=dict(symbol="line-ew-open", size=14, color=colors.CONTEXT, line=dict(width=2)),
                             hovertemplate="layer %{x}: always runs (no router)<extra></extra>"), row=1, col=1)
    if c is not None and c.router_threshold:
        fig.add_hline(y=c.router_threshold, line=dict(color=colors.THRESHOLD, dash="dash"), row=1, col=1,
                      annotation_text=f"threshold {c.router_threshold:g}", annotation_position="top left")
    mask = "".join("x" if i in skipped else "." for i in range(L))
    fig.add_trace(go.Heatmap(z=[[1 if ch == "x" else 0 for ch in mask]] if L else [[None]], x=list(range(L)) or None,
                             y=["mask"], colorscale=[[0, colors.SKIP["."]], [1, colors.SKIP["x"]]], showscale=False,
                             xgap=1, customdata=[list(mask)] if L else None,
                             hovertemplate="layer %{x}: %{customdata}<extra></extra>"), row=2, col=1)
    if c is None:
        title = f"{trace.method}: no router choice recorded"
    else:
        what = ("routers' scores for this prompt" if c.router_mode != "fixed"
                else "the fixed set: training label frequencies")
        title = (f"{trace.method}: {what}; skips {len(skipped)} of {L} layers "
                 f"({', '.join(map(str, sorted(skipped))) or 'none'}; budget {c.router_budget})"
                 + ("" if step is None else f" · round {step + 1}"))
    fig.update_layout(title=title, height=380, margin=dict(l=50, r=10, t=60, b=40), plot_bgcolor="white",
                      bargap=0.2, legend=dict(orientation="h", y=-0.25, x=1, xanchor="right"))
    fig.update_yaxes(title="score", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title="layer", dtick=1 if L <= 32 else None, row=2, col=1)
    return fig
