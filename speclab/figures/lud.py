"""LUD's lexical units: where a unit ended, and how long units ran.

    lud_figure(trace, step)   left: the round's placeholders (token j+1 past its next token), one bar
                              each at its top-1 probability, green where it joined the unit, grey
                              past the end, the threshold dashed; the title says why the unit ended.
                              Right: the run's units by length (tokens one forward emitted: the next
                              token and the joined placeholders), this round's marked; the title gives
                              tokens per forward and how many joined guesses the model's own
                              next-token row would have rejected (exact's verdict, recorded beside
                              the `unverified` rule's)
    has_units(trace)          some round recorded a LexicalUnit record

It is the LexicalUnit record's figure (speclab.records: info["lud_slots"], ["lud_threshold"],
["lud_span"], ["lud_end"]), written each round by the `lud` drafter (decoding/drafters/lud.py).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.trace import REJECTED, Trace

JOINED, PAST = colors.ORIGIN["accepted"], "#c7c7c7"
ENDS = {"threshold": "a placeholder under the threshold", "repeat": "a placeholder repeating the token before it",
        "eos": "end of text", "k": "every placeholder joined", "rejected": "the verify rejected this round's draft"}


def has_units(trace: Trace) -> bool:
    return trace.steps_row().verify and any("lud_slots" in r.info for r in trace.rounds)


def apart(trace: Trace) -> tuple[int, int]:
    """(joined guesses the rounds kept, those exact would have rejected) over the run's draft nodes."""
    kept = sum(len(r.accepted) for r in trace.rounds)
    wrong = sum(1 for r in trace.rounds for n in r.nodes if (n.verdicts or {}).get("exact") == REJECTED)
    return kept, wrong


def lud_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    r = trace.rounds[step or 0]
    slots, thr = r.info.get("lud_slots") or [], r.info.get("lud_threshold")
    span, end = r.info.get("lud_span") or 0, r.info.get("lud_end", "")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=(f"this round's placeholders (after {trace.text_of(r.emitted)!r})",
                                        "units by length"))
    xs = [f"{j + 1}: {trace.text_of(int(t))!r}" for j, (t, _) in enumerate(slots)]
    fig.add_trace(go.Bar(x=xs or [None], y=[c for _, c in slots] or [None], showlegend=False,
                         marker_color=[JOINED if j < span else PAST for j in range(len(slots))] or None,
                         customdata=[["joined" if j < span else "past the unit"] for j in range(len(slots))] or None,
                         hovertemplate="placeholder %{x}: %{y:.3f}, %{customdata[0]}<extra></extra>"), row=1, col=1)
    if thr is not None and slots:
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[thr, thr], mode="lines", name="threshold",
                                 line=dict(color="#ff7f0e", dash="dash"), hovertemplate=f"threshold {thr}<extra></extra>"),
                      row=1, col=1)
    lengths = [1 + (x.info.get("lud_span") or 0) for x in trace.rounds if "lud_slots" in x.info]
    top = max(lengths, default=1)
    counts = [lengths.count(n) for n in range(1, top + 1)]
    here = 1 + span
    fig.add_trace(go.Bar(x=list(range(1, top + 1)), y=counts, showlegend=False,
                         marker_color=[colors.CURRENT if n == here else JOINED for n in range(1, top + 1)],
                         hovertemplate="%{y} forwards emitted units of %{x}<extra></extra>"), row=1, col=2)
    kept, wrong = apart(trace)
    forwards = trace.totals.target_forwards or len(trace.rounds)
    fig.update_layout(
        height=360, margin=dict(l=50, r=10, t=90, b=60), plot_bgcolor="white",
        title=dict(text=f"LUD: this unit {here} token{'s' if here != 1 else ''}, ended by {ENDS.get(end, end)}"
                        f"<br><sub>{len(trace.output_ids) / max(forwards, 1):.2f} tokens a forward; {wrong} of "
                        f"{kept} kept guesses differ from the model's own next token</sub>"),
        legend=dict(orientation="h", y=0, yref="container", yanchor="bottom"))
    fig.update_yaxes(range=[0, 1.05], title_text="probability", row=1, col=1)
    fig.update_xaxes(title_text="tokens in the unit", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="forwards", row=1, col=2)
    return fig
