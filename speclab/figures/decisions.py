"""Policy decisions, drawn for any method without knowing it: what each policy read (its input
features), what it compared them with (its threshold) and what it chose (its output).

    decision_table(trace, step)     the decisions of one round or denoising step, a row each
    decision_summary(trace, step)   per policy, across the run: its input against its threshold,
                                    or its numeric output; `step` marked

A decision is a `trace.Decision`, held in `Round.decisions` and `DenoiseStep.decisions`. Which
value a policy's row plots: with a threshold, the first numeric input (the feature it compared),
the threshold as a dashed line and the marker filled where the output was truthy; without one, the
output where it is a number. A policy with neither is listed in the table only.
"""
from __future__ import annotations

import html
import json

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.figures.steps import step_label, step_title
from speclab.figures.summary import current
from speclab.trace import Decision, Trace

COLUMNS = ("policy", "at", "inputs", "threshold", "output", "note")
ROW_PX = 150            # one policy's panel in the summary


def step_records(trace: Trace) -> list:
    """The records a step's decisions hang from: the rounds, or the denoising steps (a DAG has none)."""
    return trace.rounds or trace.denoise


def has_decisions(trace: Trace) -> bool:
    return any(r.decisions for r in step_records(trace))


def value_text(v) -> str:
    """A feature or an output as a cell shows it: numbers to 4 digits, the rest as short JSON."""
    if isinstance(v, float):
        return num(v)
    return v if isinstance(v, str) else json.dumps(v)


def decision_table(trace: Trace, step: int = 0) -> go.Figure:
    """The decisions recorded for step `step` (0-based), a row each. One Table trace, its cells
    replaced as the step moves; the height is fixed by the step with the most decisions."""
    records = step_records(trace)
    step = check_step(trace, step, len(records))
    ds = records[step].decisions
    cells = [[html.escape(d.policy) for d in ds], ["" if d.at is None else d.at for d in ds],
             ["<br>".join(f"{html.escape(k)} = {html.escape(value_text(v))}" for k, v in d.inputs.items()) for d in ds],
             [num(d.threshold) for d in ds], [html.escape(value_text(d.output)) for d in ds],
             [html.escape(d.note) for d in ds]]
    most = max((len(r.decisions) + sum(max(len(d.inputs) - 1, 0) for d in r.decisions) for r in records), default=1)
    fig = go.Figure(go.Table(
        columnwidth=[2, 1, 4, 1.5, 2, 3], header=dict(values=[f"<b>{c}</b>" for c in COLUMNS], fill_color="#eeeeee",
                                                   align="left"),
        cells=dict(values=cells, align="left", height=24), name="decisions"))
    fig.update_layout(title=f"decisions at {step_title(trace, step)}: {len(ds) or 'none'}",
                      height=110 + 26 * max(most, 1), margin=dict(l=10, r=10, t=50, b=10),
                      meta=dict(step=step, steps=len(records), engine=trace.engine))
    return fig


def plotted(d: Decision) -> tuple[str, float] | None:
    """(what, value) a decision plots in the summary (the module docstring says which), or None."""
    if d.threshold is not None:
        for k, v in d.inputs.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return k, float(v)
    if isinstance(d.output, (int, float)):
        return "output", float(d.output)
    return None


def decision_summary(trace: Trace, step: int | None = None) -> go.Figure:
    """One panel per policy, steps from 1 on x: the plotted value of each of its decisions (several
    per step where it decided at several depths or positions), its threshold dashed. Traces per
    policy: value, threshold, current (the "current" lines move with the step)."""
    records = step_records(trace)
    step = check_step(trace, step, len(records)) if step is not None else None
    policies = list(dict.fromkeys(d.policy for r in records for d in r.decisions))
    fig = make_subplots(rows=max(len(policies), 1), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=policies or ["no decisions recorded"])
    for row, policy in enumerate(policies, start=1):
        pts = [(i + 1, plotted(d), d) for i, r in enumerate(records) for d in r.decisions if d.policy == policy]
        pts = [(x, p, d) for x, p, d in pts if p is not None]
        what = pts[0][1][0] if pts else "output"
        fig.add_trace(go.Scatter(
            x=[x for x, _, _ in pts] or [None], y=[p[1] for _, p, _ in pts] or [None], mode="lines+markers",
            name=f"{policy}: {what}", line=dict(color=colors.VERIFY_TIME, width=1),
            marker=dict(size=8, color=[colors.VERIFY_TIME if d.output else "white" for _, _, d in pts],
                        line=dict(color=colors.VERIFY_TIME, width=1.5)),
            hovertext=[f"{step_label(trace)} {x}{'' if d.at is None else f', at {d.at}'}: {what} {num(p[1])}"
                       f"{'' if d.threshold is None else f' vs threshold {num(d.threshold)}'}"
                       f" -> {html.escape(value_text(d.output))}" for x, p, d in pts],
            hovertemplate="%{hovertext}<extra></extra>"), row=row, col=1)
        thr = [(x, d.threshold) for x, _, d in pts if d.threshold is not None]
        fig.add_trace(go.Scatter(x=[x for x, _ in thr] or [None], y=[t for _, t in thr] or [None], mode="lines",
                                 name=f"{policy}: threshold", line=dict(color=colors.THRESHOLD, dash="dash", width=1.5),
                                 showlegend=bool(thr), hovertemplate="threshold %{y:.3g}<extra></extra>"),
                      row=row, col=1)
        ys = [p[1] for _, p, _ in pts] + [t for _, t in thr]
        lo, hi = min(ys, default=0.0), max(ys, default=1.0)
        fig.add_trace(current(step, hi).update(y=[lo, hi] if step is not None else [None]), row=row, col=1)
        fig.update_yaxes(title_text=what, gridcolor="#eeeeee", row=row, col=1)
    fig.update_xaxes(range=[0.4, len(records) + 0.6], showgrid=False)
    fig.update_xaxes(title_text=step_label(trace), row=max(len(policies), 1), col=1)
    fig.update_layout(title=f"{trace.method}: policy decisions over {len(records)} {step_label(trace)}s",
                      height=90 + ROW_PX * max(len(policies), 1), plot_bgcolor="white", showlegend=False,
                      margin=dict(l=55, r=10, t=60, b=40))
    return fig
