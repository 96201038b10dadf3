"""ETE's information meter (dllm-ete): the bits-to-rounds principle over one run.

    ete_figure(trace, step)   top: the nats each round committed, the exploited and the explored
                              share stacked, against the budget B (dashed); the current round
                              outlined. Middle: each round's cascade (slots below the threshold that
                              crossed it since the round before explored) and its commits outside
                              the active block. Bottom: rounds so far against the nats so far, beside
                              the line rounds = NLL / B (the fewest rounds a run of NLL nats needs
                              when no round carries more than B)
    has_ete(trace)            some step recorded an EteRound (speclab.records: info["information"])
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.trace import Trace


def has_ete(trace: Trace) -> bool:
    return any("information" in s.info and "information_total" in s.info for s in trace.denoise)


def rounds(trace: Trace) -> list[dict]:
    """One row per recorded round: round number, nats (exploited, explored), nats so far, cascade
    size, commits outside the active block."""
    out = []
    for i, s in enumerate(trace.denoise):
        if "information" not in s.info:
            continue
        explore = s.info.get("explore_information", 0.0)
        out.append(dict(round=i + 1, exploit=s.info["information"] - explore, explore=explore,
                        total=s.info.get("information_total"), cascade=s.info.get("crossed", 0),
                        outside=s.info.get("outside_block", 0), explored=len(s.info.get("explored", []))))
    return out


def ete_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.denoise))
    rows = rounds(trace)
    B = float(trace.params.get("budget", 1.0))
    x = [r["round"] for r in rows] or [None]
    fig = make_subplots(rows=3, cols=1, row_heights=[0.4, 0.25, 0.35], vertical_spacing=0.09,
                        subplot_titles=("information per round (nats) against the budget B",
                                        "cascade and cross-block commits",
                                        "rounds so far against the bits-to-rounds line NLL / B"))
    cur = None if step is None else step + 1
    line = dict(width=[2 if r["round"] == cur else 0 for r in rows] or None, color=colors.CURRENT)
    fig.add_trace(go.Bar(x=x, y=[r["exploit"] for r in rows] or [None], name="exploited (p >= threshold)",
                         marker=dict(color=colors.CANVAS["earlier"], line=line),
                         hovertemplate="round %{x}: %{y:.3f} nats exploited<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=[r["explore"] for r in rows] or [None], name="explored",
                         marker=dict(color=colors.CANVAS["now"], line=line),
                         customdata=[r["explored"] for r in rows] or None,
                         hovertemplate="round %{x}: %{y:.3f} nats over %{customdata} explored slots<extra></extra>"),
                  row=1, col=1)
    fig.add_hline(y=B, line=dict(color=colors.THRESHOLD, dash="dash"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=[r["cascade"] for r in rows] or [None], name="crossed the threshold since",
                             mode="lines+markers", line=dict(color=colors.PROPOSAL["block"]),
                             hovertemplate="round %{x}: %{y} slots crossed<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=x, y=[r["outside"] for r in rows] or [None], name="committed outside the block",
                             mode="markers", marker=dict(color=colors.CONTEXT, symbol="diamond"),
                             hovertemplate="round %{x}: %{y} commits in other blocks<extra></extra>"), row=2, col=1)
    tot = [r["total"] for r in rows]
    fig.add_trace(go.Scatter(x=tot or [None], y=[r["round"] for r in rows] or [None], mode="lines+markers",
                             name="rounds so far", line=dict(color=colors.CONTEXT),
                             hovertemplate="%{x:.2f} nats in %{y} rounds<extra></extra>"), row=3, col=1)
    top = max(tot, default=0.0) or 1.0
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top / B] if B > 0 else [None, None], mode="lines",
                             name="NLL / B", line=dict(color=colors.THRESHOLD, dash="dash"), hoverinfo="skip"),
                  row=3, col=1)
    n, nll = len(rows), (tot[-1] if tot else 0.0)
    fig.update_layout(
        title=f"{trace.method}: {n} rounds for {num(nll, 3)} nats (NLL / B = {num(nll / B, 3) if B else '—'}); "
              f"{sum(r['explored'] for r in rows)} explored, {sum(r['outside'] for r in rows)} commits outside "
              f"their block",
        barmode="stack", height=560, margin=dict(l=50, r=10, t=80, b=40), plot_bgcolor="white",
        legend=dict(orientation="h", y=-0.08, x=1, xanchor="right"))
    fig.update_xaxes(title="round", row=1, col=1)
    fig.update_xaxes(title="round", row=2, col=1)
    fig.update_xaxes(title="nats committed so far (the text's NLL under the model, at the end)", row=3, col=1)
    fig.update_yaxes(title="nats", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="slots", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title="rounds", rangemode="tozero", row=3, col=1)
    return fig
