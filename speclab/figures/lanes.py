"""Timing lanes: work that overlaps in time (a drafter thread beside a verify stream, PEARL), as a
Gantt chart with a row per lane.

    lanes_figure(trace, step)   a bar per span at its start and end (seconds from the start of the
                                decode), a colour per kind of work; `step`'s spans outlined

The spans come from `Trace.lanes` (a `Lane` a thread or stream, `Span(start_s, end_s, what, step)`).
Traces: one bar trace per kind of work, then "this step" (the outlines, redrawn as the step moves).
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.figures.steps import step_label
from speclab.metrics import n_steps
from speclab.trace import Trace

KIND_COLOR = {"draft": colors.DRAFT_TIME, "verify": colors.VERIFY_TIME}
PALETTE = ("#f4a259", "#8fd19e", "#c9b6e4", "#e377c2", "#bcbd22", "#17becf")
ROW_PX = 48


def has_lanes(trace: Trace) -> bool:
    return any(lane.spans for lane in trace.lanes)


def kinds(trace: Trace) -> list[str]:
    return list(dict.fromkeys(s.what for lane in trace.lanes for s in lane.spans))


def kind_color(trace: Trace, what: str) -> str:
    others = [k for k in kinds(trace) if k not in KIND_COLOR]
    return KIND_COLOR.get(what) or PALETTE[others.index(what) % len(PALETTE)]


def lanes_figure(trace: Trace, step: int | None = None) -> go.Figure:
    """The lanes as a Gantt chart, the first lane on top; `step` (0-based) outlines its spans."""
    # any step of the run can be current, whether or not a span belongs to it
    n = max([n_steps(trace)] + [s.step + 1 for lane in trace.lanes for s in lane.spans])
    step = check_step(trace, step, n) if step is not None else None
    names = [lane.name for lane in trace.lanes]
    spans = [(lane.name, s) for lane in trace.lanes for s in lane.spans]
    label = step_label(trace)
    fig = go.Figure()
    for what in kinds(trace):
        mine = [(name, s) for name, s in spans if s.what == what]
        fig.add_trace(go.Bar(
            orientation="h", y=[name for name, _ in mine], base=[s.start_s for _, s in mine],
            x=[s.end_s - s.start_s for _, s in mine], name=what, marker_color=kind_color(trace, what),
            hovertext=[f"{name}: {what}, {label} {s.step + 1}: {s.start_s * 1e3:.1f} to {s.end_s * 1e3:.1f} ms "
                       f"({(s.end_s - s.start_s) * 1e3:.1f} ms)" for name, s in mine],
            hovertemplate="%{hovertext}<extra></extra>"))
    now = [(name, s) for name, s in spans if step is not None and s.step == step]
    fig.add_trace(go.Bar(
        orientation="h", y=[name for name, _ in now] or [None], base=[s.start_s for _, s in now] or [None],
        x=[s.end_s - s.start_s for _, s in now] or [None], name="this step", showlegend=False,
        marker=dict(color="rgba(0,0,0,0)", line=dict(color=colors.CURRENT, width=2.5)), hoverinfo="skip"))
    start = min((s.start_s for _, s in spans), default=0.0)
    end = max((s.end_s for _, s in spans), default=1.0)
    busy = sum(s.end_s - s.start_s for _, s in spans)
    fig.update_layout(
        title=f"timing lanes: {len(names)} lanes, {busy:.3f} s of work in {end - start:.3f} s of wall time",
        barmode="overlay", height=110 + ROW_PX * max(len(names), 1), plot_bgcolor="white",
        margin=dict(l=10, r=10, t=50, b=40), legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        xaxis=dict(title="seconds from the start", gridcolor="#eeeeee"),
        yaxis=dict(categoryorder="array", categoryarray=names[::-1], automargin=True))
    return fig
