"""Which layers ran: the skip mask of every round, layers x rounds, over what the round accepted.

    skip_mask_figure(trace, step)   one column a round, one row a layer (the first at the bottom):
                                    the layer ran, its attention or its MLP was skipped, or both,
                                    as the round's `skip` mask says (SWIFT's draft, Unified Layer
                                    Skipping's every forward, layer-skip's early exit: the layers
                                    from the exit on); above it, the draft tokens each round
                                    accepted of those it drafted, and where SWIFT searched, each
                                    candidate's score and the best so far; `step` marked
    has_skip_masks(trace)           some round recorded a mask

The masks are the rounds' SkipMask records (speclab.records: info["skip"], a character a layer:
"." runs, "a" attention skipped, "m" MLP skipped, "x" both), so the figure draws at every recording
level; the search points come from `swift-search` decisions and show where decisions were recorded.
It is the SkipMask record's figure (figures.views.add_record_figure): every trace holding skip
masks shows it in the player, the dashboard and the export, whichever method skipped.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.figures.views import FigureSpec, add_record_figure
from speclab.records import SkipMask
from speclab.trace import Trace

STATES = ".amx"
STATE_LABEL = {".": "runs", "a": "attention skipped", "m": "MLP skipped", "x": "skipped"}
SEARCH_MARK = {"kept": "#2ca02c", "reverted": "#bbbbbb", "scored": "#1f77b4"}


def has_skip_masks(trace: Trace) -> bool:
    return trace.steps_row().verify and any(SkipMask.of(r) is not None and r.info.get("skip") for r in trace.rounds)


def _colorscale() -> list:
    """Discrete: state i of STATES fills [i/4, (i+1)/4) of the scale."""
    out = []
    for i, s in enumerate(STATES):
        out += [[i / len(STATES), colors.SKIP[s]], [(i + 1) / len(STATES), colors.SKIP[s]]]
    return out


def _current(step: int | None, lo: float, hi: float) -> go.Scatter:
    here = step is not None
    return go.Scatter(x=[step + 1, step + 1] if here else [None], y=[lo, hi] if here else [None], mode="lines",
                      line=dict(color=colors.CURRENT, width=2), name="current", hoverinfo="skip", showlegend=False)


def skip_mask_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    masks = [getattr(SkipMask.of(r), "skip", None) for r in trace.rounds]
    L = max((len(m) for m in masks if m), default=0)
    xs = list(range(1, len(masks) + 1))
    # z[layer][round]: the state's index (None: the round ran no mask, e.g. a gated plain round)
    z = [[STATES.index(m[i]) + 0.5 if m and i < len(m) else None for m in masks] for i in range(L)]
    hover = [[f"round {x}, layer {i}: {STATE_LABEL[m[i]] if m and i < len(m) else 'no mask'}"
              for x, m in zip(xs, masks)] for i in range(L)]
    accepted, drafted = [len(r.accepted) for r in trace.rounds], [r.drafted for r in trace.rounds]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.3, 0.7], vertical_spacing=0.06,
                        specs=[[{"secondary_y": True}], [{}]])
    fig.add_trace(go.Bar(x=xs, y=accepted, name="accepted", marker_color=colors.ORIGIN["accepted"],
                         customdata=drafted, hovertemplate="round %{x}: %{y} accepted of %{customdata} "
                                                           "drafted<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=xs, y=drafted, mode="markers", name="drafted", marker=dict(color=colors.CONTEXT,
                             symbol="line-ew-open", size=10), hoverinfo="skip"), row=1, col=1)
    sx, sy, sc, st = [], [], [], []
    for x, r in zip(xs, trace.rounds):
        for d in r.decisions:
            if d.policy == "swift-search":
                sx.append(x)
                sy.append(d.inputs.get("score"))
                sc.append(SEARCH_MARK.get(d.output, colors.CONTEXT))
                st.append(f"round {x}: {d.inputs.get('proposal')} candidate {d.inputs.get('skip')}<br>score "
                          f"{num(d.inputs.get('score'))}, best before {num(d.inputs.get('best'))}: {d.output}"
                          + (f"<br>{d.note}" if d.note else ""))
    fig.add_trace(go.Scatter(x=sx or [None], y=sy or [None], mode="markers", name="search score",
                             marker=dict(color=sc or None, size=8, line=dict(color="#333333", width=1)),
                             hovertext=st or None, hoverinfo="text"), row=1, col=1, secondary_y=True)
    top = max(drafted + [1]) + 0.5
    fig.add_trace(_current(step, 0, top), row=1, col=1)
    fig.add_trace(go.Heatmap(x=xs, y=list(range(L)), z=z, zmin=0, zmax=len(STATES), colorscale=_colorscale(),
                             showscale=False, hovertext=hover, hoverinfo="text", xgap=1, ygap=1, name="mask"),
                  row=2, col=1)
    for s in STATES:                    # the legend of the map's states
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=STATE_LABEL[s],
                                 marker=dict(symbol="square", size=11, color=colors.SKIP[s])), row=2, col=1)
    fig.add_trace(_current(step, -0.5, L - 0.5), row=2, col=1)
    ran = [m.count(".") + (m.count("a") + m.count("m")) / 2 for m in masks if m]
    mean_run = sum(ran) / len(ran) if ran else 0.0
    a = trace.totals.alpha
    fig.update_layout(
        title=f"skip mask per round: on average {mean_run:.1f} of {L} layers ran; acceptance "
              f"{'—' if a is None else f'{a:.2f}'}",
        height=min(800, 300 + 16 * L), margin=dict(l=50, r=50, t=60, b=90), plot_bgcolor="white",
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom", x=1, xanchor="right"), bargap=0.1)
    fig.update_xaxes(range=[0.4, len(xs) + 0.6], row=1, col=1)
    fig.update_xaxes(range=[0.4, len(xs) + 0.6], title="round", row=2, col=1)
    fig.update_yaxes(title="tokens", range=[0, top], row=1, col=1, secondary_y=False)
    fig.update_yaxes(title="score", range=[0, 1.05], dtick=0.5, row=1, col=1, secondary_y=True, showgrid=False)
    fig.update_yaxes(title="layer", range=[-0.5, L - 0.5], dtick=1 if L <= 32 else 4, row=2, col=1)
    return fig


SKIP_MASK = add_record_figure(FigureSpec("skip mask", skip_mask_figure, record=SkipMask, when=has_skip_masks))
