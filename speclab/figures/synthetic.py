"""Synthetic acceptance: the profile asked for against the acceptance the run's verify recorded.

    has_synthetic(trace)          the trace recorded the synthetic drafter's decisions
    asked_profile(trace)          the per-depth rates a_1..a_k the run was asked for (its decisions'
                                  thresholds)
    synthetic_figure(trace, step) per draft depth: the rate asked for (bars) and the conditional
                                  acceptance the verify gave (speclab.metrics.per_position), over the
                                  whole run (line) and over rounds 1..step + 1 (hollow markers, which
                                  move as the player steps); the tokens per round the profile implies
                                  (metrics.tree_tau) beside the run's tau in the title

What the figure shows is the engine's own verdicts, not the drafter's plan: a bar the line misses
would mean the verify accepted what the drafter meant to fail, or the reverse (the text left the
answer). Shown for traces of `synthetic` through the view spec (figures.views wires it).
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab import metrics
from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.trace import Trace

POLICY = "synthetic"


def has_synthetic(trace: Trace) -> bool:
    return any(d.policy == POLICY for r in trace.rounds for d in r.decisions)


def asked_profile(trace: Trace) -> list[float]:
    rates: dict[int, float] = {}
    for r in trace.rounds:
        for d in r.decisions:
            if d.policy == POLICY and d.at is not None and d.threshold is not None:
                rates.setdefault(int(d.at), float(d.threshold))
    return [rates[d] for d in sorted(rates)]


def synthetic_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    asked = asked_profile(trace)
    xs = list(range(1, len(asked) + 1))
    _, whole, _ = metrics.per_position(trace.rounds)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=asked, name="asked for", marker_color="#c7d7ea",
                         hovertemplate="depth %{x}: asked %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=xs[:len(whole)], y=whole[:len(asked)], mode="lines+markers", name="verify, whole run",
                             line=dict(color=colors.ORIGIN["accepted"], width=2),
                             hovertemplate="depth %{x}: accepted %{y:.3f} of the rounds that reached it<extra></extra>"))
    if step is not None:
        _, sofar, _ = metrics.per_position(trace.rounds[:step + 1])
        fig.add_trace(go.Scatter(x=xs[:len(sofar)], y=sofar[:len(asked)], mode="markers",
                                 name=f"rounds 1-{step + 1}",
                                 marker=dict(symbol="circle-open", size=11, color=colors.CURRENT, line=dict(width=2)),
                                 hovertemplate="depth %{x}: %{y:.3f} by this round<extra></extra>"))
    implied = metrics.tree_tau(asked) if asked else 1.0
    fig.update_layout(title=f"acceptance asked for and given per draft depth: the profile implies {implied:.2f} "
                            f"tokens a round, the run made {trace.totals.tau:.2f}",
                      xaxis=dict(title="draft depth", dtick=1), yaxis=dict(title="conditional acceptance",
                                                                           range=[0, 1.05]),
                      barmode="overlay", height=340, margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(orientation="h", y=-0.25))
    return fig
