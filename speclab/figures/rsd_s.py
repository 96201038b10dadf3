"""RSD-S's stochastic beam, one round at a time: per level, the candidates the beam kept and the best
it dropped, on their beam scores.

    has_beam(trace)          the trace recorded tree-rsd-s's per-level decisions
    beam_levels(rnd)         a round's `tree-rsd-s` decisions, by level
    beam_figure(trace, step) round `step`: x the level, y a candidate's beam score G (the truncated
                             Gumbel of its sequence; greedy: its draft log-probability). Kept
                             candidates filled and joined to their parent (the lineage), coloured
                             by the verify's verdict; dropped ones hollow grey; the cut per level a
                             red tick (the lowest kept score). Hover: the token, its sequence's
                             draft log-probability phi, G, the parent. The title counts the
                             sequences each level cut early (kept no child).

Drawn from the round's Decision("tree-rsd-s", {"level", "parents", "truncated", "candidates"},
threshold, output) records (drafters/rsd_s.py), so it needs record="light" or "full". It is the
BeamSearch record's figure (speclab.records; figures.views.add_record_figure at the bottom): every
trace holding a stochastic beam shows it in the player, the dashboard and the export.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step, num, tok
from speclab.figures.views import FigureSpec, add_record_figure
from speclab.records import BeamSearch
from speclab.trace import NOT_REACHED, Trace

POLICY = "tree-rsd-s"
DROPPED = "#9e9e9e"


def has_beam(trace: Trace) -> bool:
    return any(BeamSearch.of(r) is not None and any(d.policy == POLICY for d in r.decisions) for r in trace.rounds)


def beam_levels(rnd) -> list:
    return sorted((d for d in rnd.decisions if d.policy == POLICY), key=lambda d: d.at)


def beam_figure(trace: Trace, step: int = 0) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    rnd = trace.rounds[step]
    levels = beam_levels(rnd)
    nodes = {n.id: n for n in rnd.nodes}
    score = {-1: 0.0}                                          # node -> its beam score (the root: 0)
    fig = go.Figure()
    ex, ey = [], []                                            # lineage edges
    kept = {dec: dict(x=[], y=[], text=[], hover=[]) for dec in colors.DECISION}
    drop = dict(x=[], y=[], text=[], hover=[])
    cut_x, cut_y = [], []
    for d in levels:
        lv = int(d.at)
        for parent, token, phi, g, node in d.inputs["candidates"]:
            where = "the committed text" if parent < 0 else f"node {parent} ({tok(trace, nodes[parent].token)})" \
                if parent in nodes else f"node {parent}"
            hover = f"level {lv}: {tok(trace, token)} after {where}<br>phi {num(phi)}, G {num(g)}"
            if node >= 0:
                score[node] = g
                dec = nodes[node].decision if node in nodes else NOT_REACHED
                bucket = kept[dec]
                hover += f"<br>kept as node {node}: {colors.DECISION_LABEL[dec]}"
                if parent in score:
                    ex += [lv - 1, lv, None]
                    ey += [score[parent], g, None]
            else:
                bucket = drop
                hover += "<br>dropped: below the cut"
            bucket["x"].append(lv)
            bucket["y"].append(g)
            bucket["text"].append(tok(trace, token))
            bucket["hover"].append(hover)
        if d.threshold is not None:
            cut_x += [lv - 0.25, lv + 0.25, None]
            cut_y += [d.threshold, d.threshold, None]
    fig.add_trace(go.Scatter(x=ex or [None], y=ey or [None], mode="lines", line=dict(color=colors.EDGE, width=1.5),
                             hoverinfo="skip", name="lineage", showlegend=False))
    fig.add_trace(go.Scatter(x=[0], y=[0], mode="markers", name="committed text", showlegend=False,
                             marker=dict(symbol="square", size=12, color=colors.CONTEXT),
                             hovertext=["the committed text: phi = G = 0"], hoverinfo="text"))
    fig.add_trace(go.Scatter(x=cut_x or [None], y=cut_y or [None], mode="lines", name="cut (lowest kept score)",
                             line=dict(color=colors.THRESHOLD, width=2), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=drop["x"] or [None], y=drop["y"] or [None], mode="markers+text", name="dropped",
                             text=drop["text"] or None, textposition="middle right",
                             textfont=dict(size=10, color=DROPPED),
                             marker=dict(symbol="circle-open", size=10, color=DROPPED, line=dict(width=1.5)),
                             hovertext=drop["hover"] or None, hoverinfo="text"))
    for dec, b in kept.items():
        fig.add_trace(go.Scatter(x=b["x"] or [None], y=b["y"] or [None], mode="markers+text",
                                 name=f"kept, {colors.DECISION_LABEL[dec]}", text=b["text"] or None,
                                 textposition="middle left", textfont=dict(size=11),
                                 marker=dict(size=12, color=colors.DECISION[dec], line=dict(width=1, color="#333333")),
                                 hovertext=b["hover"] or None, hoverinfo="text"))
    cut = [len(d.inputs.get("truncated") or []) for d in levels]
    width = len(levels[0].output) if levels else 0
    fig.update_layout(
        title=f"round {step + 1}: the stochastic beam keeps {width} sequences a level; "
              f"sequences cut early per level: {', '.join(map(str, cut)) or '—'}",
        xaxis=dict(title="level (draft depth)", dtick=1, range=[-0.4, len(levels) + 0.6]),
        yaxis=dict(title="beam score G (truncated Gumbel of the sequence)"),
        height=420, margin=dict(l=60, r=30, t=60, b=50), plot_bgcolor="white",
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom", x=1, xanchor="right"))
    return fig


BEAM = add_record_figure(FigureSpec("stochastic beam", beam_figure, "step", when=has_beam, height=440,
                                    record=BeamSearch))
