"""What a RAG drafter reads of a long context, round by round (RAPID).

    slice_figure(trace, step)   per round (x), the target's whole context as a grey column and, over
                                it, the spans the draft reads: the retrieved chunks and the query with
                                the text written since; hover gives each span and both models'
                                context lengths (their KV caches); `step` marked
    has_slices(trace)           some round recorded a retrieved slice

It is the RetrievedSlice record's figure (speclab.records: info["rag_spans"], ["draft_ctx"],
["full_ctx"]), so it shows for every run whose drafter reads a slice, at every recording level.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.figures.summary import current
from speclab.trace import Trace

CHUNK, TAIL = "#9467bd", colors.ORIGIN["accepted"]


def has_slices(trace: Trace) -> bool:
    return trace.steps_row().verify and any("rag_spans" in r.info for r in trace.rounds)


def _segments(rows: list[tuple[int, list[int]]]) -> tuple[list, list, list]:
    """x, y and hover text of vertical segments (None between them): one per (round, [start, end))."""
    xs, ys, text = [], [], []
    for x, (s, e) in rows:
        xs += [x, x, None]
        ys += [s, e, None]
        text += [f"round {x}: positions {s}-{e - 1}"] * 2 + [None]
    return xs, ys, text


def slice_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    chunks, tails, xs, full, draft = [], [], [], [], []
    for x, r in enumerate(trace.rounds, 1):
        spans = r.info.get("rag_spans")
        if not spans:
            continue
        xs.append(x)
        full.append(r.info.get("full_ctx", spans[-1][1]))
        draft.append(r.info.get("draft_ctx", sum(e - s for s, e in spans)))
        chunks += [(x, s) for s in spans[:-1]]
        tails.append((x, spans[-1]))
    top = max(full + [1])
    width = max(2, min(14, 700 // max(len(trace.rounds), 1)))
    cx, cy, ct = _segments(chunks)
    tx, ty, tt = _segments(tails)
    fig = go.Figure([
        go.Bar(x=xs, y=full, name="the target's context", marker_color="#e3e3e3", width=0.9,
               customdata=list(zip(draft, full)),
               hovertemplate="round %{x}: the target attends over %{customdata[1]} positions, "
                             "the draft over %{customdata[0]}<extra></extra>"),
        go.Scatter(x=cx, y=cy, mode="lines", name="retrieved chunks (the draft reads)", text=ct,
                   line=dict(color=CHUNK, width=width), hovertemplate="%{text}<extra>chunk</extra>"),
        go.Scatter(x=tx, y=ty, mode="lines", name="query and text since (the draft reads)", text=tt,
                   line=dict(color=TAIL, width=width), hovertemplate="%{text}<extra>query + text</extra>"),
        current(step, top)])
    last = f"the draft reads {draft[-1]} of {full[-1]} positions ({draft[-1] / full[-1]:.0%})" if xs else \
        "no round recorded a slice"
    fig.update_layout(
        height=340, margin=dict(l=60, r=10, t=60, b=80), plot_bgcolor="white", barmode="overlay",
        title=f"retrieved slice against the full context: {last} at the last round",
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom"),
        xaxis=dict(title="round", range=[0.4, len(trace.rounds) + 0.6]),
        yaxis=dict(title="position in the target's context", range=[0, top * 1.02]))
    return fig
