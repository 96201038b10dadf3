"""How far ahead a transferred hidden state sees (Hidden Transfer).

    transfer_figure(trace, step)   left: per future offset j, the share of rounds whose pseudo state's
                                   top-1 prediction is the token the target then wrote at that
                                   position (hits / rounds in the hover); right: offsets x rounds,
                                   each cell a hit, a miss, or blank where the run ended first (hover:
                                   the prediction, its probability, the token written); `step` marked;
                                   the title names the transfer layer l
    transfer_agreement(trace)      (layer, per offset [hits, rounds]) from the records
    has_transfer(trace)            some round recorded its transfer predictions

It is the TransferPrediction record's figure (speclab.records: info["transfer_layer"],
["transfer_at"], ["transfer_pred"]), so it shows for every trace that holds those predictions
(recording "light" or "full"; a run without recording keeps none).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step
from speclab.trace import Trace

HIT, MISS = colors.ORIGIN["accepted"], "#d62728"


def has_transfer(trace: Trace) -> bool:
    return trace.steps_row().verify and any("transfer_pred" in r.info for r in trace.rounds)


def _cells(trace: Trace):
    """Per round with predictions: (round number, [(token, prob, written or None)] per offset)."""
    out = trace.output_ids
    rows = []
    for x, r in enumerate(trace.rounds, 1):
        pred, at = r.info.get("transfer_pred"), r.info.get("transfer_at")
        if pred is None or at is None:
            continue
        rows.append((x, [(int(t), float(p), out[at + j] if at + j < len(out) else None)
                         for j, (t, p) in enumerate(pred)]))
    return rows


def transfer_agreement(trace: Trace) -> tuple[int | None, list[list[int]]]:
    layer = next((r.info["transfer_layer"] for r in trace.rounds if "transfer_layer" in r.info), None)
    K = max((len(c) for _, c in _cells(trace)), default=0)
    tally = [[0, 0] for _ in range(K)]
    for _, cells in _cells(trace):
        for j, (tok, _, written) in enumerate(cells):
            if written is not None:
                tally[j][0] += tok == written
                tally[j][1] += 1
    return layer, tally


def transfer_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.rounds))
    layer, tally = transfer_agreement(trace)
    K = len(tally)
    word = lambda t: repr(trace.text_of(t))                                         # noqa: E731
    offsets = [f"+{j + 1}" for j in range(K)]
    share = [h / n if n else None for h, n in tally]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.3, 0.7], horizontal_spacing=0.1, subplot_titles=(
        "top-1 agreement per offset", "per round: hit, miss"))
    fig.add_trace(go.Bar(x=offsets, y=share, marker_color=HIT, name="agreement", showlegend=False,
                         customdata=tally, hovertemplate="offset %{x}: %{customdata[0]} of %{customdata[1]} rounds "
                                                         "(%{y:.0%})<extra></extra>"), 1, 1)
    xs, z, hover = [], [[] for _ in range(K)], [[] for _ in range(K)]
    for x, cells in _cells(trace):
        xs.append(x)
        for j in range(K):
            tok, p, written = cells[j] if j < len(cells) else (None, 0.0, None)
            z[j].append(None if written is None or tok is None else float(tok == written))
            hover[j].append(f"round {x}, offset +{j + 1}: predicted {word(tok)} ({p:.2f})" +
                            (f", the target wrote {word(written)}" if written is not None else ", past the end"))
    fig.add_trace(go.Heatmap(x=xs, y=offsets, z=z, text=hover, hoverinfo="text", zmin=0, zmax=1, showscale=False,
                             colorscale=[[0, MISS], [1, HIT]], xgap=1, ygap=1), 1, 2)
    if step is not None:
        fig.add_vline(x=step + 1, line=dict(color=colors.CURRENT, width=2), row=1, col=2)
    first = f"{share[0]:.0%} at +1" if share and share[0] is not None else "no predictions"
    fig.update_layout(
        height=340, margin=dict(l=60, r=10, t=70, b=50), plot_bgcolor="white",
        title=f"hidden transfer from layer {layer}: the pseudo states' guesses against what the target wrote ({first})")
    fig.update_yaxes(title_text="share of rounds", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="future offset", row=1, col=1)
    fig.update_xaxes(title_text="round", row=1, col=2)
    fig.update_yaxes(title_text="offset", row=1, col=2)
    return fig
