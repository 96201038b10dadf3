"""Superposed Decoding's figures: the k drafts side by side, step by step (a beam view).

    beam_frame(trace, step)        the beam after step `step`: one bar a draft, its cumulative score
                                   (the LM's log-probability interpolated with the n-gram's), its text's
                                   tail with the token it appended [in brackets], alive drafts coloured
                                   by their weight in the next superposed input, finished ones grey
    candidates_html(trace, step)   the step's k x topk candidate table: each alive draft's candidates
                                   with their LM and n-gram log-probabilities, step and total scores;
                                   the candidates kept in bold (the engine's "step detail")
    weights_figure(trace, step)    per step, the superposition weights of the alive drafts, stacked
                                   by their rank in the beam; `step` marked

They read the SuperposedStep record (speclab/beam.py); scores, weights and candidates are recorded
at record "light" and "full" (at None the beam view shows the drafts only).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from speclab.beam import drafts_at
from speclab.figures._util import check_step, num, show_token
from speclab.figures.steps import step_title
from speclab.figures.summary import current
from speclab.trace import Trace

TAIL = 48                    # characters of a draft's text a bar shows
FINISHED = "#bdbdbd"
SLOTS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def has_weights(trace: Trace) -> bool:
    return any("sp_weight" in r.info for r in trace.rounds)


def _text(trace: Trace, ids: list[int]) -> str:
    return "".join(trace.text_of(t) for t in ids)


def _label(trace: Trace, ids: list[int], new: bool) -> str:
    """A draft's tail, the token appended this step in brackets."""
    head, last = (ids[:-1], ids[-1:]) if new and ids else (ids, [])
    tail = show_token(_text(trace, head))[-TAIL:]
    return html.escape(tail + (f" [{show_token(_text(trace, last))}]" if last else ""), quote=False)


def beam_frame(trace: Trace, step: int = 0, static: bool = True) -> dict:
    step = check_step(trace, step, len(trace.rounds)) or 0
    info = trace.rounds[step].info
    ids = drafts_at(trace, step)
    n = len(ids)
    scores = info.get("sp_score") or [None] * n
    alive = info.get("sp_alive") or [True] * n
    weights = info.get("sp_weight") or [None] * n
    new = [t >= 0 for t in info["sp_token"]]
    names = [f"draft {i + 1}" + ("" if alive[i] else " (finished)") for i in range(n)]
    xs = [0.0 if s is None else -s for s in scores]              # the cost: minus the score, 0 = certain
    bar_colors = [SLOTS[i % len(SLOTS)] if alive[i] else FINISHED for i in range(n)]
    opacity = [1.0 if w is None or not alive[i] else 0.35 + 0.65 * w for i, w in enumerate(weights)]
    hover = [f"{names[i]}: score {num(scores[i])}, weight {num(weights[i])}<br>"
             f"{html.escape(show_token(_text(trace, ids[i]))[-160:], quote=False)}" for i in range(n)]
    top = max(xs + [1.0])
    title = (f"{step_title(trace, step)}: {sum(alive)} alive of {n} drafts from one forward"
             + ("" if scores[0] is not None else " (scores not recorded)"))
    data = [dict(type="bar", orientation="h", y=names[::-1], x=xs[::-1], name="drafts",
                 marker=dict(color=bar_colors[::-1], opacity=opacity[::-1]),
                 text=[_label(trace, ids[i], new[i]) for i in range(n)][::-1], textposition="inside",
                 insidetextanchor="start", textfont=dict(family="monospace", size=12, color="black"),
                 hovertext=hover[::-1], hoverinfo="text", cliponaxis=False)]
    layout = dict(title=dict(text=title, font=dict(size=14)), height=120 + 46 * max(n, 1), bargap=0.25,
                  margin=dict(l=130, r=20, t=50, b=40), plot_bgcolor="white", showlegend=False,
                  xaxis=dict(title="cost = minus the cumulative score (lower is better)", range=[0, top * 1.05],
                             gridcolor="#eeeeee"),
                  yaxis=dict(automargin=True))
    return dict(data=data, layout=layout)


def candidates_html(trace: Trace, step: int | None = 0) -> str:
    step = check_step(trace, step, len(trace.rounds)) or 0
    info = trace.rounds[step].info
    head = f"<b>{html.escape(step_title(trace, step))}</b>"
    rows = info.get("sp_cand")
    if not rows:
        return head + ": the candidates were not recorded (record=None)"
    before = trace.rounds[step - 1].info if step else {}
    parent_score = before.get("sp_score") or []
    parent_ids = drafts_at(trace, step - 1) if step else [[]]
    kept = {(p, t) for p, t in zip(info["sp_parent"], info["sp_token"]) if t >= 0}
    pens = info.get("sp_penalised") or []
    w = before.get("sp_weight") or [1.0]
    head += (": one forward over the superposition of " + ", ".join(
        f"draft {i + 1} (w {num(x, 3)})" for i, x in enumerate(w) if x) + f"; {len(rows)} candidates, "
        f"{len(kept)} kept (bold). Score = (1 - alpha) LM + alpha n-gram; a draft the n-gram supports nowhere "
        "scores (1 - alpha) LM - penalty")
    cols = ("draft", "draft ends", "candidate", "LM log p", "n-gram log p", "step score", "total")
    cell = "<td style='padding:0 .6em'>{}</td>"
    out = ["<tr>" + "".join(f"<th style='padding:0 .6em'>{c}</th>" for c in cols) + "</tr>"]
    for p, t, lm, ng, s in rows:
        d = max(p, 0)
        base = parent_score[d] if d < len(parent_score) else 0.0
        total = None if s is None else base + s
        tail = html.escape(show_token(_text(trace, parent_ids[d] if d < len(parent_ids) else []))[-24:] or "(prompt)")
        name = "prompt" if p < 0 else f"{p + 1}" + (" (penalised)" if d < len(pens) and pens[d] else "")
        vals = (name, f"<code>{tail}</code>", f"<code>{html.escape(show_token(trace.text_of(t)))}</code>", num(lm),
                num(ng), num(s) if s is not None else "-inf", num(total) if total is not None else "-inf")
        bold = " style='font-weight:bold'" if (p, t) in kept else ""
        out.append(f"<tr{bold}>" + "".join(cell.format(v) for v in vals) + "</tr>")
    return head + "<table style='font-size:90%;margin-top:.4em'>" + "".join(out) + "</table>"


def weights_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    n = len(trace.rounds)
    xs = list(range(1, n + 1))
    width = max([len(r.info.get("sp_weight") or []) for r in trace.rounds] + [1])
    fig = go.Figure()
    for slot in range(width):
        ys = []
        for r in trace.rounds:
            w, alive = r.info.get("sp_weight") or [], r.info.get("sp_alive") or []
            ys.append(w[slot] if slot < len(w) and (slot >= len(alive) or alive[slot]) else 0.0)
        fig.add_trace(go.Bar(x=xs, y=ys, name=f"draft {slot + 1}", marker_color=SLOTS[slot % len(SLOTS)],
                             hovertemplate=f"step %{{x}}: draft {slot + 1} weight %{{y:.3f}}<extra></extra>"))
    fig.add_trace(current(step, 1.05))
    top1 = sum(1 for r in trace.rounds if (r.info.get("sp_weight") or [0])[0] > 0.99)
    fig.update_layout(barmode="stack", height=280, bargap=0.1, plot_bgcolor="white",
                      margin=dict(l=50, r=10, t=50, b=40), legend=dict(orientation="h", y=-0.25, x=1, xanchor="right"),
                      title=f"superposition weights of the next input: draft 1 above 0.99 in {top1} of {n} steps")
    fig.update_xaxes(title="step", range=[0.4, n + 0.6])
    fig.update_yaxes(title="weight", range=[0, 1.05])
    return fig


__all__ = ["beam_frame", "candidates_html", "weights_figure", "has_weights"]
