"""OSD's online draft over a run: acceptance round by round, the updates marked, the draft version.

    osd_updates(trace)          (round, the osd Decision) for every update the run recorded
    osd_figure(trace, step)     per round, the share of its draft the target accepted (bars) and
                                its running mean over the last 8 rounds (line); a dotted vertical
                                line at each update (hover: what is trained and the loss, buffer,
                                loss before / after, steps, lr, seconds); on the right axis, the draft version each round
                                drafted with (rounds' info["draft_version"]); `step` marked
    has_osd_versions(trace)     some round recorded a draft version

The versions come from the rounds' info (every recording level), the update marks from the `osd`
decisions (recorded levels only; a run with record=None still shows its versions step up). Shown
for traces of `osd` through the view spec (figures.views wires it: this module imports no view).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.figures.summary import current
from speclab.trace import Trace

POLICY = "osd"
WINDOW = 8


def has_osd_versions(trace: Trace) -> bool:
    return trace.steps_row().verify and any("draft_version" in r.info for r in trace.rounds)


def osd_updates(trace: Trace) -> list:
    return [(i, d) for i, r in enumerate(trace.rounds) for d in r.decisions if d.policy == POLICY]


def osd_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    rounds = trace.rounds
    xs = list(range(1, len(rounds) + 1))
    share = [len(r.accepted) / r.drafted if r.drafted else None for r in rounds]
    running = []
    for i in range(len(rounds)):
        win = [r for r in rounds[max(0, i - WINDOW + 1): i + 1] if r.drafted]
        running.append(sum(len(r.accepted) for r in win) / sum(r.drafted for r in win) if win else None)
    version = [r.info.get("draft_version") for r in rounds]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=xs, y=share, name="accepted / drafted", marker_color=colors.ORIGIN["accepted"],
                         customdata=[[len(r.accepted), r.drafted] for r in rounds],
                         hovertemplate="round %{x}: %{customdata[0]} of %{customdata[1]} accepted<extra></extra>"))
    fig.add_trace(go.Scatter(x=xs, y=running, mode="lines", name=f"last {WINDOW} rounds", line=dict(color="#333333"),
                             hovertemplate="round %{x}: %{y:.2f} over the last rounds<extra></extra>"))
    fig.add_trace(go.Scatter(x=xs, y=version, mode="lines", line_shape="hv", name="draft version",
                             line=dict(color="#9467bd", width=2),
                             hovertemplate="round %{x} drafted with version %{y}<extra></extra>"), secondary_y=True)
    ux, uy, ut = [], [], []
    for i, d in osd_updates(trace):
        x = i + 1.5                 # after round i + 1's verify: the next round drafts with it
        ux += [x, x, None]
        uy += [0, 1.05, None]
        what = f"{d.inputs.get('train', 'head')}, {d.inputs.get('loss', 'kl')}" + (
            f" (beta {num(d.inputs['beta'])})" if "beta" in d.inputs else "")
        text = (f"update after round {i + 1}: version {d.inputs.get('version')} ({what})<br>buffer {d.inputs.get('buffer')} "
                f"({d.inputs.get('new')} new), {d.inputs.get('steps')} steps of lr {num(d.inputs.get('lr'))}<br>"
                f"loss {num(d.inputs.get('loss_before'))} -> {num(d.inputs.get('loss_after'))}, "
                f"{num(d.inputs.get('seconds'))} s")
        ut += [text, text, None]
    fig.add_trace(go.Scatter(x=ux or [None], y=uy or [None], mode="lines", name="update",
                             line=dict(color="#d62728", dash="dot", width=1.5), hovertext=ut or None,
                             hoverinfo="text"))
    fig.add_trace(current(step, 1.05))
    n_up = len(osd_updates(trace))
    last = next((v for v in reversed(version) if v is not None), None)
    a = trace.totals.alpha
    fig.update_layout(
        title=f"online draft: {n_up} update{'s' if n_up != 1 else ''} in this run, version {last} at the end; "
              f"acceptance {'—' if a is None else f'{a:.2f}'}",
        margin=dict(l=50, r=60, t=60, b=80), plot_bgcolor="white", bargap=0.1,
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom", x=1, xanchor="right"))
    fig.update_xaxes(range=[0.4, len(xs) + 0.6], title="round")
    fig.update_yaxes(title="accepted share", range=[0, 1.05], secondary_y=False)
    top = max([v for v in version if v is not None] + [1])
    fig.update_yaxes(title="draft version", range=[0, top * 1.05 + 0.5], secondary_y=True, showgrid=False)
    return fig
