"""Whole-run figures: accepted length per round, its histogram, per-position acceptance, the
draft's calibration, timing.

Accepted length of a round = draft tokens the target accepted (the emitted token not counted).
Rounds are numbered from 1 on every axis (speclab.figures.steps); `step` arguments are 0-based
indices into `trace.rounds`, marked by a "current" line that a player moves.
Per-position acceptance (conditional and unconditional) comes from speclab.metrics, where its
denominators are written down.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.metrics import calibration, token_alpha
from speclab.metrics import per_position as _per_position
from speclab.trace import Trace


def per_position(trace: Trace) -> tuple[list[int], list[float], list[float]]:
    """(depths 1..D, conditional acceptance, unconditional acceptance) of a trace's rounds
    (speclab.metrics.per_position)."""
    return _per_position(trace.rounds)


def calibration_figure(traces: Trace | list[Trace], bins: int = 10) -> go.Figure:
    """Does the draft know what it knows? Per bin of its probability q of a node's token, the
    share of such nodes the target accepted (speclab.metrics.calibration), over one run or several
    (e.g. a prompt set, one trace each); marker area ~ nodes in the bin. On the diagonal, the
    draft's own q ranks a tree's nodes as the target will: a tree grown by cumulative q (EAGLE-2)
    is then as good as that draft allows, and more tau needs a draft that knows more."""
    traces = [traces] if isinstance(traces, Trace) else list(traces)
    if not traces or any(not t.steps_row().verify for t in traces):
        raise ValueError("calibration_figure takes speculative traces (one run or a list of runs)")
    rows = calibration([r for t in traces for r in t.rounds], bins)
    pts = [(q, share, n) for _, q, n, share in rows if n]
    if not pts:
        raise ValueError("no recorded draft node carries a q: record the runs with record='light' or 'full' "
                         "and a method whose draft has probabilities (draft-model, eagle, medusa, trees)")
    total = sum(n for *_, n in pts)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#bbbbbb", dash="dot"),
                             name="calibrated", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[q for q, _, _ in pts], y=[s for _, s, _ in pts], mode="lines+markers",
                             line=dict(color=colors.DECISION["accepted"]), name="draft",
                             marker=dict(size=[6 + 24 * (n / total) ** 0.5 for *_, n in pts]),
                             customdata=[n for *_, n in pts],
                             hovertemplate="q %{x:.2f}: %{y:.2f} accepted of %{customdata} nodes<extra></extra>"))
    method = traces[0].method
    fig.update_layout(title=f"{method}: accepted share by the draft's own q ({total} nodes put to the target)",
                      height=330, margin=dict(l=50, r=10, t=40, b=40), plot_bgcolor="white",
                      xaxis=dict(title="draft probability q of the node's token", range=[0, 1]),
                      yaxis=dict(title="accepted", range=[0, 1.02]), showlegend=False)
    return fig


def round_strip(trace: Trace, step: int | None = None) -> go.Figure:
    """Accepted length per round as stacked bars (accepted draft + the emitted token); `step` marked.
    Meant for long runs: the whole run at a glance under the detailed view of one round."""
    step = check_step(trace, step, len(trace.rounds)) if step is not None else None
    xs = rounds_axis(trace)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[len(r.accepted) for r in trace.rounds], name="accepted draft",
                         marker_color=colors.ORIGIN["accepted"],
                         hovertemplate="round %{x}: %{y} accepted of %{customdata} drafted<extra></extra>",
                         customdata=[r.drafted for r in trace.rounds]))
    fig.add_trace(go.Bar(x=xs, y=[1 if r.kept > len(r.accepted) else 0 for r in trace.rounds],
                         name="emitted", marker_color=[colors.ORIGIN[r.emitted_kind] for r in trace.rounds],
                         customdata=[r.emitted_kind for r in trace.rounds],
                         hovertemplate="round %{x}: %{customdata}<extra></extra>"))
    top = max((r.drafted for r in trace.rounds), default=1) + 1
    fig.add_trace(current(step, top))
    fig.update_layout(barmode="stack", bargap=0.05, height=170, margin=dict(l=40, r=10, t=30, b=30),
                      title=f"tokens per round (tau {trace.totals.tau:.2f})", plot_bgcolor="white",
                      legend=dict(orientation="h", y=1.15, x=1, xanchor="right"),
                      xaxis=dict(title=None, range=[0.4, len(xs) + 0.6]), yaxis=dict(range=[0, top]))
    return fig


def rounds_axis(trace: Trace) -> list[int]:
    return list(range(1, len(trace.rounds) + 1))


def current(step: int | None, top: float) -> go.Scatter:
    """The vertical line at round `step` (0-based; drawn at its 1-based number), or an empty trace."""
    here = step is not None
    return go.Scatter(x=[step + 1, step + 1] if here else [None], y=[0, top] if here else [None], mode="lines",
                      line=dict(color=colors.CURRENT, width=2), name="current", hoverinfo="skip", showlegend=False)


def acceptance_summary(trace: Trace, step: int | None = None) -> go.Figure:
    """Accepted length per round (`step` marked), its histogram, and per-position acceptance."""
    step = check_step(trace, step, len(trace.rounds))
    lengths = [len(r.accepted) for r in trace.rounds]
    depths, cond, uncond = per_position(trace)
    t = trace.totals
    a = token_alpha(trace.rounds)
    alpha = f"{a:.2f}" if a is not None else "—"
    fig = make_subplots(rows=1, cols=3, column_widths=[0.45, 0.25, 0.3], subplot_titles=(
        "accepted length per round", "histogram", "acceptance by draft position"))
    fig.add_trace(go.Bar(x=rounds_axis(trace), y=lengths, marker_color=colors.ORIGIN["accepted"],
                         name="accepted length", showlegend=False,
                         hovertemplate="round %{x}: %{y}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Histogram(x=lengths, xbins=dict(start=-0.5, size=1), marker_color=colors.ORIGIN["accepted"],
                               name="rounds", showlegend=False), row=1, col=2)
    fig.add_trace(go.Scatter(x=depths, y=cond, mode="lines+markers", name="conditional",
                             line=dict(color=colors.DECISION["accepted"])), row=1, col=3)
    fig.add_trace(go.Scatter(x=depths, y=uncond, mode="lines+markers", name="unconditional",
                             line=dict(color=colors.VERIFY_TIME, dash="dot")), row=1, col=3)
    fig.add_trace(current(step, max(lengths, default=0) + 0.5), row=1, col=1)      # last: fixed indices above
    fig.update_yaxes(range=[0, 1.05], row=1, col=3)
    fig.update_xaxes(title_text="round", row=1, col=1)
    fig.update_xaxes(title_text="accepted length", row=1, col=2)
    fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=3)
    fig.update_layout(title=f"{trace.method}: tau {t.tau:.2f}, alpha {alpha} (per judged draft token); "
                            f"{t.accepted} of {t.drafted} drafted tokens kept",
                      height=320, margin=dict(l=40, r=10, t=70, b=40), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.25))
    return fig


def timing(trace: Trace, step: int | None = None) -> go.Figure:
    """Draft vs verify seconds per round, stacked; `step` marked."""
    step = check_step(trace, step, len(trace.rounds))
    xs = rounds_axis(trace)
    top = max((r.draft_s + r.verify_s for r in trace.rounds), default=0.0)
    fig = go.Figure([
        go.Bar(x=xs, y=[r.draft_s for r in trace.rounds], name="draft", marker_color=colors.DRAFT_TIME),
        go.Bar(x=xs, y=[r.verify_s for r in trace.rounds], name="verify", marker_color=colors.VERIFY_TIME),
        current(step, top)])
    t = trace.totals
    fig.update_layout(barmode="stack", height=260, plot_bgcolor="white", margin=dict(l=50, r=10, t=50, b=40),
                      title=f"time per round: draft {t.draft_s:.2f} s, verify {t.verify_s:.2f} s, wall {t.wall_s:.2f} s",
                      xaxis_title="round", yaxis_title="seconds")
    return fig
