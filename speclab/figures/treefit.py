"""A draft tree sized to the machine: how many nodes each round verified, and why.

    fit_figure(trace, step)   per round, the nodes kept (bars) against the tokens the round expected
                              to commit and those it did (lines), `step` marked; the title gives the
                              measured verify costs c(T) the choice read
    has_fits(trace)           some round recorded a fitted tree

It is the TreeFit record's figure (speclab.records; decoding.costs): `eagle[budget=auto]` keeps,
each round, the n best nodes of its grown tree that maximise expected tokens per unit of cost on
this machine, so on a CPU where extra verify rows are dear (AVX2) the trees are small, and where
they hide behind the weight stream (AVX512-BF16, a GPU) they stay large. `prompt-lookup[k=auto]`
records its chain's length the same way.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.figures.summary import current
from speclab.trace import Trace


def has_fits(trace: Trace) -> bool:
    return trace.steps_row().verify and any("fit_nodes" in r.info for r in trace.rounds)


def fit_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    xs = list(range(1, len(trace.rounds) + 1))
    kept = [r.info.get("fit_nodes") for r in trace.rounds]
    expect = [r.info.get("fit_expect") for r in trace.rounds]
    got = [len(r.accepted) + 1 if "fit_nodes" in r.info else None for r in trace.rounds]
    curve = next((r.info["fit_curve"] for r in trace.rounds if "fit_curve" in r.info), None)
    top = max([v for v in kept + expect + got if v is not None] + [1]) + 1
    fig = go.Figure([
        go.Bar(x=xs, y=kept, name="nodes verified", marker_color=colors.ORIGIN["accepted"], opacity=0.55,
               hovertemplate="round %{x}: %{y} draft nodes verified<extra></extra>"),
        go.Scatter(x=xs, y=expect, mode="lines+markers", name="tokens expected", line=dict(color="#ff7f0e"),
                   hovertemplate="round %{x}: %{y:.2f} tokens expected<extra></extra>"),
        go.Scatter(x=xs, y=got, mode="markers", name="tokens committed", marker=dict(color="#2ca02c", size=8),
                   hovertemplate="round %{x}: %{y} tokens committed<extra></extra>"),
        current(step, top)])
    n = [k for k in kept if k is not None]
    costs = ", ".join(f"{c:.2f}" for c in curve) if curve else "not recorded"
    fig.update_layout(
        height=340, margin=dict(l=50, r=10, t=70, b=80), plot_bgcolor="white", bargap=0.15,
        title=dict(text=f"tree sized to this machine: {sum(n) / max(len(n), 1):.1f} nodes a round, "
                        f"{sum(e for e in expect if e is not None):.0f} tokens expected, "
                        f"{sum(g for g in got if g is not None)} committed<br><sub>a verify of T = 1, 2, ... rows "
                        f"costs {costs} one-row forwards here</sub>"),
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom"),
        xaxis=dict(title="round", range=[0.4, len(xs) + 0.6]), yaxis=dict(title="nodes / tokens", range=[0, top]))
    return fig
