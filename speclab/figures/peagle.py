"""A block drafted in one forward (P-EAGLE, decoding/drafters/peagle.py): what each slot guessed,
how sure it was, and how often each slot holds up, the mask slots beside the real one.

    block_figure(trace, step)      top: round `step`'s block, one bar a slot, its height the draft's
                                   q for the slot's token (the token written on it), coloured by
                                   the verdict (accepted, rejected, not reached), slot 1 (the last
                                   real entry) apart from the mask slots; bottom: over the run, each
                                   slot's conditional acceptance (accepted / reached) and its mean q,
                                   the run's one-forward block in bars
    slot_comparison(traces)        the conditional acceptance per slot (depth) of several runs in one
                                   figure: P-EAGLE's one-forward block beside eagle-chain's sequential
                                   steps or falcon's k-token forwards (any speculative traces)
    has_blocks(trace)              some round holds a ParallelBlock record

The block is the round's ParallelBlock record (speclab.records: pblock_tokens, pblock_q,
pblock_mask), so the figure needs record "light" or "full"; the verdicts are the round's nodes.
It is the ParallelBlock record's figure (wired in figures.views): every trace holding blocks
shows it in the player, the dashboard and the export.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab import metrics
from speclab.figures import colors
from speclab.figures._util import check_step, num, tok
from speclab.records import ParallelBlock
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED, Trace

VERDICT_COLOR = {ACCEPTED: colors.ORIGIN["accepted"], REJECTED: "#d62728", NOT_REACHED: "#cccccc"}
VERDICT_WORD = {ACCEPTED: "accepted", REJECTED: "rejected", NOT_REACHED: "not reached"}
REAL, MASK = "#1f77b4", "#9467bd"


def has_blocks(trace: Trace) -> bool:
    return trace.steps_row().verify and any(r.info.get("pblock_tokens") for r in trace.rounds)


def slot_stats(trace: Trace) -> tuple[list[int], list[float], list[float]]:
    """(slots 1..K, conditional acceptance per slot, mean q per slot) over the rounds with a block."""
    rounds = [r for r in trace.rounds if r.info.get("pblock_tokens")]
    slots, cond, _ = metrics.per_position(rounds)
    qs = [[q for q in (r.info.get("pblock_q") or [])] for r in rounds]
    mean_q = [sum(q[d] for q in qs if d < len(q)) / max(1, sum(d < len(q) for q in qs)) for d in range(len(slots))]
    return slots, cond, mean_q


def block_figure(trace: Trace, step: int | None = 0) -> go.Figure:
    step = check_step(trace, 0 if step is None else step, len(trace.rounds))
    r = trace.rounds[step]
    b = ParallelBlock.of(r)
    toks, qs, masks = (b.pblock_tokens or [], b.pblock_q or [], b.pblock_mask or []) if b else ([], [], [])
    verdict = [r.nodes[i].decision if i < len(r.nodes) else NOT_REACHED for i in range(len(toks))]
    fig = make_subplots(rows=2, cols=1, row_heights=[0.5, 0.5], vertical_spacing=0.18,
                        subplot_titles=("this round's block: one forward", "over the run: each slot"))
    xs = list(range(1, len(toks) + 1))
    for v in (ACCEPTED, REJECTED, NOT_REACHED):     # one trace a verdict: a fixed count for a player
        idx = [i for i in range(len(toks)) if verdict[i] == v]
        fig.add_trace(go.Bar(
            x=[xs[i] for i in idx] or [None], y=[qs[i] for i in idx] or [None], name=VERDICT_WORD[v],
            marker=dict(color=VERDICT_COLOR[v], line=dict(color=[MASK if masks[i] else REAL for i in idx] or None,
                                                          width=3)),
            text=[tok(trace, toks[i]) for i in idx] or None, textposition="outside",
            hovertext=[f"slot {xs[i]} ({'the mask state' if masks[i] else 'the last real entry'}): "
                       f"{tok(trace, toks[i])}, q = {num(qs[i])}, {VERDICT_WORD[v]}" for i in idx] or None,
            hoverinfo="text"), row=1, col=1)
    slots, cond, mean_q = slot_stats(trace)
    fig.add_trace(go.Bar(x=slots, y=cond, name="accepted / reached", marker_color=[REAL] + [MASK] * (len(slots) - 1),
                         hovertemplate="slot %{x}: %{y:.2f} of the rounds that reached it accepted it<extra></extra>"),
                  row=2, col=1)
    fig.add_trace(go.Scatter(x=slots, y=mean_q, mode="markers+lines", name="mean q", line=dict(color="#333333"),
                             hovertemplate="slot %{x}: mean draft q %{y:.2f}<extra></extra>"), row=2, col=1)
    K = max(len(slots), len(toks), 1)
    for row in (1, 2):
        fig.update_xaxes(range=[0.4, K + 0.6], dtick=1, title="slot (1: real entry; 2+: mask state)" if row == 2
                         else None, row=row, col=1)
        fig.update_yaxes(range=[0, 1.15], row=row, col=1)
    fig.update_yaxes(title="q", row=1, col=1)
    fig.update_layout(title=f"round {step + 1}/{len(trace.rounds)}: {len(toks)} slots drafted in "
                            f"{b.pblock_forwards if b and b.pblock_forwards else 0} forward, {len(r.accepted)} accepted",
                      height=520, barmode="overlay", plot_bgcolor="white", margin=dict(l=50, r=20, t=70, b=50))
    return fig


def slot_comparison(traces: dict) -> go.Figure:
    """{label: trace} -> the conditional acceptance per slot (depth) of each run, grouped bars."""
    fig = go.Figure()
    for label, trace in traces.items():
        depths, cond, _ = metrics.per_position(trace.rounds)
        fig.add_trace(go.Bar(x=depths, y=cond, name=f"{label} (tau {trace.totals.tau:.2f})",
                             hovertemplate=label + ", slot %{x}: %{y:.2f} accepted of those reached<extra></extra>"))
    fig.update_layout(title="acceptance per slot: one forward against sequential steps", barmode="group",
                      xaxis=dict(title="slot / depth", dtick=1), yaxis=dict(title="accepted / reached", range=[0, 1]),
                      height=360, plot_bgcolor="white")
    return fig

