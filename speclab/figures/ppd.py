"""PPD's tree sized to the machine, and how deep its prompt tokens' guesses were accepted.

    ppd_figure(trace, step)   left: per depth d (prompt token d's offset, token d+1 past the last
                              emitted one), the share of tree rounds that accepted d tokens or more,
                              against the fit's prediction; the current round's depth marked. Middle:
                              the static tree chosen, one marker per candidate (rank path), coloured
                              by how often the verify accepted it, a diamond where prompt tokens were
                              attached (the root always is). Right: the rate weighed per candidate
                              count (tokens per one-row forward), the chosen count marked; the title
                              gives the measured verify costs c(T)
    has_ppd_fit(trace)        some round recorded a PpdFit record

It is the PpdFit record's figure (speclab.records: info["ppd_paths"], ["ppd_attach"], ["ppd_reach"],
["ppd_weighed"], ...), written once per run by the `ppd` drafter (decoding/drafters/ppd.py).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.trace import Trace


def has_ppd_fit(trace: Trace) -> bool:
    return trace.steps_row().verify and any("ppd_nodes" in r.info for r in trace.rounds)


def ppd_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    fit = next(r.info for r in trace.rounds if "ppd_nodes" in r.info)
    paths = [tuple(p) for p in fit.get("ppd_paths") or []]
    attach = set(fit.get("ppd_attach") or [])
    trees = [r for r in trace.rounds if r.drafted]
    D = max((len(p) for p in paths), default=0)
    fig = make_subplots(rows=1, cols=3, column_widths=[0.34, 0.33, 0.33], horizontal_spacing=0.09,
                        subplot_titles=("accepted to depth d or more", "the tree chosen", "rate weighed per size"))
    # 1. acceptance by depth, against the prediction
    depths = list(range(1, D + 1))
    got = [sum(len(r.accepted) >= d for r in trees) / max(len(trees), 1) for d in depths]
    fig.add_trace(go.Bar(x=depths or [None], y=got or [None], name="measured", marker_color=colors.ORIGIN["accepted"],
                         customdata=[len(trees)] * len(depths) or None,
                         hovertemplate="depth %{x}: %{y:.2f} of %{customdata} tree rounds<extra></extra>"), row=1, col=1)
    reach = fit.get("ppd_reach") or []
    fig.add_trace(go.Scatter(x=depths[:len(reach)] or [None], y=reach or [None], mode="lines+markers",
                             name="predicted", line=dict(color="#ff7f0e"),
                             hovertemplate="depth %{x}: %{y:.2f} predicted<extra></extra>"), row=1, col=1)
    if step is not None and trace.rounds[step].drafted:
        a = len(trace.rounds[step].accepted)
        fig.add_trace(go.Scatter(x=[a, a], y=[0, 1], mode="lines", line=dict(color=colors.CURRENT, width=2),
                                 name="this round", hoverinfo="skip", showlegend=False), row=1, col=1)
    # 2. the tree: depth across, candidates in order down each depth
    y_of, rows_at = {(): 0.0}, {}
    for p in paths:
        rows_at[len(p)] = rows_at.get(len(p), 0) + 1
        y_of[p] = -(rows_at[len(p)] - 1)
    for p in paths:
        fig.add_trace(go.Scatter(x=[len(p) - 1, len(p)], y=[y_of[p[:-1]], y_of[p]], mode="lines",
                                 line=dict(color=colors.CONTEXT, width=1), hoverinfo="skip", showlegend=False),
                      row=1, col=2)
    rate = [sum(i in r.accepted for r in trees) / max(len(trees), 1) for i in range(len(paths))]
    fig.add_trace(go.Scatter(
        x=[0] + [len(p) for p in paths], y=[0.0] + [y_of[p] for p in paths], mode="markers", name="candidates",
        marker=dict(size=14, color=[1.0] + rate, colorscale="Greens", cmin=0, cmax=1, line=dict(color="#444", width=1),
                    symbol=["diamond"] + ["diamond" if i in attach else "circle" for i in range(len(paths))],
                    showscale=True, colorbar=dict(title="accepted", x=0.64, len=0.8)),
        customdata=[["root", "", "yes"]] + [[f"ranks {list(p)}", f"{rate[i]:.2f}", "yes" if i in attach else "no"]
                                            for i, p in enumerate(paths)],
        hovertemplate="%{customdata[0]}: accepted in %{customdata[1]} of tree rounds; prompt tokens "
                      "attached: %{customdata[2]}<extra></extra>", showlegend=False), row=1, col=2)
    # 3. the rate per candidate count
    weighed = fit.get("ppd_weighed") or []
    fig.add_trace(go.Scatter(x=[w[0] for w in weighed] or [None], y=[w[5] for w in weighed] or [None],
                             mode="lines+markers", name="rate", line=dict(color=colors.ORIGIN["accepted"]),
                             customdata=[[w[1], w[2], w[3], w[4]] for w in weighed] or None,
                             hovertemplate="%{x} candidates, %{customdata[0]} attached: %{customdata[1]} rows, "
                                           "%{customdata[2]:.2f} tokens for %{customdata[3]:.2f} forwards = %{y:.3f}"
                                           "<extra></extra>", showlegend=False), row=1, col=3)
    if weighed:
        fig.add_trace(go.Scatter(x=[fit["ppd_nodes"]], y=[fit.get("ppd_rate")], mode="markers", name="chosen",
                                 marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(color=colors.CURRENT, width=2)),
                                 hoverinfo="skip", showlegend=False), row=1, col=3)
    curve = fit.get("ppd_curve")
    costs = ", ".join(f"{c:.2f}" for c in curve) if curve else "not measured (a fixed budget)"
    fig.update_layout(
        height=380, margin=dict(l=50, r=10, t=90, b=50), plot_bgcolor="white", barmode="overlay",
        title=dict(text=f"PPD: {len(paths)} candidates, prompt tokens on the root and {len(attach)} of them, "
                        f"{fit.get('ppd_rows')} verify rows<br><sub>a verify of T = 1, 2, ... rows costs {costs} "
                        f"one-row forwards here</sub>"),
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom"))
    fig.update_xaxes(title_text="depth d", dtick=1, row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="depth", dtick=1, row=1, col=2)
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_xaxes(title_text="candidates", row=1, col=3)
    fig.update_yaxes(title_text="tokens / forward", row=1, col=3)
    return fig
