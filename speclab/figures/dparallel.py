"""How certainty converges per masked slot (dParallel's entropy-threshold decoding, dllm-dparallel).

    certainty_figure(trace, step)  top: each slot's entropy (nats) at every step it was eligible, a
                                   heat map of slot against step with the threshold in the colour
                                   scale's middle; a circle where the slot committed under the
                                   threshold, a cross where it was forced (the step's lowest entropy
                                   though above it); the current step a line. Bottom: the steps each
                                   slot was eligible before it committed ("steps used": a model
                                   distilled to be certain sooner needs fewer)
    has_entropy_commits(trace)     some step recorded an EntropyCommit (speclab.records)
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import check_step, num
from speclab.records import EntropyCommit
from speclab.trace import Trace


def has_entropy_commits(trace: Trace) -> bool:
    return any("by_entropy" in s.info for s in trace.denoise)


def convergence(trace: Trace) -> dict:
    """From the EntropyCommit steps: cells [(step 1-based, slot, entropy)], commits [(step, slot,
    forced)], steps used per committed slot {slot: steps it was eligible}, and the threshold."""
    cells, commits, used, thr = [], [], {}, None
    for i, s in enumerate(trace.denoise):
        r = EntropyCommit.of(s)
        if r is None or r.by_entropy is None:
            continue
        thr = r.entropy_threshold if r.entropy_threshold is not None else thr
        done = set(s.committed)
        forced = set(s.info.get("forced") or [])
        for pos, h in zip(r.by_entropy, r.by_entropy_nats or []):
            cells.append((i + 1, pos, h))
            used[pos] = used.get(pos, 0) + 1
            if pos in done:
                commits.append((i + 1, pos, pos in forced))
    committed = {p for _, p, _ in commits}
    return dict(cells=cells, commits=commits, used={p: n for p, n in sorted(used.items()) if p in committed},
                threshold=thr)


def certainty_figure(trace: Trace, step: int | None = None) -> go.Figure:
    step = check_step(trace, step, len(trace.denoise))
    c = convergence(trace)
    thr = c["threshold"] or 0.5
    cells, commits, used = c["cells"], c["commits"], c["used"]
    top = max([thr * 2] + [h for *_, h in cells])
    fig = make_subplots(rows=2, cols=1, row_heights=[0.65, 0.35], vertical_spacing=0.12,
                        subplot_titles=("entropy of each eligible slot, step by step (nats)",
                                        "steps used: how many steps each slot waited until it committed"))
    fig.add_trace(go.Heatmap(x=[s for s, _, _ in cells] or [None], y=[p for _, p, _ in cells] or [None],
                             z=[h for *_, h in cells] or [None], zmin=0, zmax=top, name="entropy",
                             colorscale=[[0, "#1a7f37"], [min(thr / top, 1), "#d9f0d3"], [1, "#7b3294"]],
                             colorbar=dict(title="nats", len=0.6, y=0.72),
                             hovertemplate="step %{x}, slot %{y}: %{z:.3f} nats<extra></extra>"), row=1, col=1)
    for forced, name, symbol in ((False, "committed (under the threshold)", "circle-open"),
                                 (True, "forced (lowest entropy, above it)", "x-thin-open")):
        pts = [(s, p) for s, p, f in commits if f == forced]
        fig.add_trace(go.Scatter(x=[s for s, _ in pts] or [None], y=[p for _, p in pts] or [None], mode="markers",
                                 name=name, marker=dict(symbol=symbol, size=8, color=colors.CURRENT,
                                                        line=dict(width=2, color=colors.CURRENT)),
                                 hovertemplate="step %{x}: slot %{y} " + ("forced" if forced else "committed")
                                               + "<extra></extra>"), row=1, col=1)
    slots = [p for _, p, _ in cells] or [0]
    cur = None if step is None else step + 1
    fig.add_trace(go.Scatter(x=[cur, cur], y=[min(slots) - 0.5, max(slots) + 0.5], mode="lines", name="current",
                             line=dict(color=colors.THRESHOLD, width=2), showlegend=False, hoverinfo="skip"),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=list(used) or [None], y=list(used.values()) or [None], name="steps used",
                         marker_color=colors.PROPOSAL["block"],
                         hovertemplate="slot %{x}: eligible for %{y} steps<extra></extra>"), row=2, col=1)
    n_steps = len({s for s, _, _ in cells})
    mean_used = sum(used.values()) / len(used) if used else 0.0
    n_forced = sum(f for *_, f in commits)
    fig.update_layout(
        title=f"{trace.method}: {len(commits)} slots in {n_steps} steps ({num(len(commits) / max(n_steps, 1), 3)} a "
              f"step), threshold {num(thr, 3)} nats, {n_forced} forced; a slot waits {num(mean_used, 3)} steps",
        height=520, margin=dict(l=50, r=10, t=80, b=40), plot_bgcolor="white",
        legend=dict(orientation="h", y=-0.12, x=1, xanchor="right"))
    fig.update_xaxes(title="step", row=1, col=1)
    fig.update_yaxes(title="slot", autorange="reversed", row=1, col=1)
    fig.update_xaxes(title="slot", row=2, col=1)
    fig.update_yaxes(title="steps", row=2, col=1)
    return fig
