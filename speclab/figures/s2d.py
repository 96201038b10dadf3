"""Which sub-draft of a sorted draft serves this target (S2D).

    subdraft_figure(trace, step)   left: per sorted depth of the draft, its acceptance on this run's
                                   target up to round `step` (the share of the target's tokens that
                                   sub-draft's greedy token matched), the depth drafted from at that
                                   round dark, the threshold of the depth choice as a line; right:
                                   the depth drafted from, round by round, `step` marked. The title
                                   names the target: two targets served by one sorted draft, two
                                   figures side by side, show which depth serves which
    has_subdrafts(trace)           some round recorded a SubDraft record

It is the SubDraft record's figure (speclab.records: info["s2d_depth"], ["s2d_depths"],
["s2d_scored"], ["s2d_hits"]); the threshold is the s2d-depth decision's, where the depth was chosen.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.figures.summary import current
from speclab.records import SubDraft
from speclab.trace import Trace

LIGHT, DARK = "#c6dbef", "#2171b5"


def has_subdrafts(trace: Trace) -> bool:
    return any("s2d_depth" in r.info for r in trace.rounds)


def acceptance_by_depth(trace: Trace, step: int | None = None) -> tuple[list[int], list[float], int]:
    """(sorted depths, each one's acceptance on the target up to round `step` (the last if None),
    the target tokens scored)."""
    rounds = [r for r in trace.rounds[:None if step is None else step + 1] if "s2d_depth" in r.info]
    if not rounds:
        return [], [], 0
    s = SubDraft.of(rounds[-1])
    n = s.s2d_scored or 0
    return list(s.s2d_depths or []), [h / n if n else 0.0 for h in (s.s2d_hits or [])], n


def subdraft_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    depths, acc, n = acceptance_by_depth(trace, step)
    chosen = [SubDraft.of(r).s2d_depth if "s2d_depth" in r.info else None for r in trace.rounds]
    here = chosen[step] if step is not None and step < len(chosen) else (chosen[-1] if chosen else None)
    threshold = next((d.threshold for r in trace.rounds for d in r.decisions if d.policy == "s2d-depth"), None)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.1,
                        subplot_titles=("acceptance on this target, per sub-draft depth", "depth drafted from"))
    fig.add_trace(go.Bar(x=depths or [None], y=acc or [None], name="sub-draft acceptance",
                         marker_color=[DARK if d == here else LIGHT for d in depths] or None,
                         customdata=[round(a * n) for a in acc] or None,
                         hovertemplate="depth %{x}: %{y:.3f} (%{customdata} of " + str(n) + " tokens)<extra></extra>"),
                  row=1, col=1)
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color=colors.THRESHOLD, dash="dash"), row=1, col=1,
                      annotation_text=f"threshold {threshold:g}", annotation_position="top left")
    xs = [i + 1 for i, d in enumerate(chosen) if d is not None]
    fig.add_trace(go.Scatter(x=xs or [None], y=[d for d in chosen if d is not None] or [None], mode="lines+markers",
                             line=dict(color=DARK, shape="hv"), name="depth",
                             hovertemplate="round %{x}: depth %{y}<extra></extra>"), row=1, col=2)
    top = max(depths or [1])
    fig.add_trace(current(step, top + 0.5), row=1, col=2)
    target = trace.models.get("target")
    who = target.name if target is not None else "the target"
    best = max(zip(acc, depths))[1] if acc else None
    title = (f"{who}: drafts from depth {here} of {top}; best sub-draft so far depth {best} "
             f"({n} tokens scored)" if depths else f"{trace.method}: no sub-draft recorded")
    fig.update_layout(title=title, height=360, margin=dict(l=50, r=10, t=80, b=40), plot_bgcolor="white",
                      showlegend=False)
    fig.update_yaxes(title="acceptance", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title="sub-draft depth (layers)", dtick=1, row=1, col=1)
    fig.update_yaxes(title="depth", range=[0.5, top + 0.5], dtick=1, row=1, col=2)
    fig.update_xaxes(title="round", row=1, col=2)
    return fig
