"""The DAG of a Directed Acyclic Transformer run: one graph, every decoding strategy's path on it.

Vertices sit left to right on a line (size by how likely a random walk passes through them, hover
with their top emissions). Links are arcs above the line, wider and darker when more likely. Each
strategy's vertex path is an arc chain below the line in its own colour; `step` picks one strategy
(in `trace.dag.paths` order) to highlight, so a player can walk through the strategies.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import bare_axis, check_step, tok, topk_text
from speclab.trace import Trace, TraceError

WIDTHS = (0.6, 1.5, 3, 5, 8)        # link line widths by probability bucket (one trace per bucket)


def arc(a: int, b: int, h: float, n: int = 12) -> tuple[list, list]:
    """A parabola from (a, 0) to (b, 0) peaking at height h (negative: below the line)."""
    xs = [a + (b - a) * i / n for i in range(n + 1)]
    ys = [4 * h * (i / n) * (1 - i / n) for i in range(n + 1)]
    return xs + [None], ys + [None]


def strategies(trace: Trace) -> list[str]:
    if trace.dag is None:
        raise TraceError(f"this is a {trace.engine} trace; the DAG figure needs a dag trace")
    return list(trace.dag.paths)


def output_text(trace: Trace, name: str) -> str:
    return " ".join(trace.text_of(t) for t in trace.dag.outputs.get(name, []))


def vertex_axis(trace: Trace, Lg: int) -> dict:
    """Each vertex's top emission as a tick label under the graph, not as text beside its marker:
    there the words sat on the link arcs and on each other; plotly turns tick labels that would
    collide (tickangle unset: "auto", through autotickangles), so they never overlap."""
    rows = trace.dag.emissions_topk
    words = [tok(trace, rows[v][0][0]) if v < len(rows) and rows[v] else "" for v in range(Lg)]
    return dict(range=[-0.7, Lg - 0.3], showgrid=False, zeroline=False, tickmode="array",
                tickvals=list(range(Lg)), ticktext=words, autotickangles=[0, 45, 90], tickfont=dict(size=11))


def dag_figure(trace: Trace, step: int | None = None, min_link: float = 0.02) -> go.Figure:
    """Vertices, links (width by probability) and each strategy's path; `step` highlights one."""
    names = strategies(trace)
    step = check_step(trace, step, len(names)) if step is not None else None
    run, Lg = trace.dag, trace.dag.num_vertices
    fig = go.Figure()
    buckets = [([], []) for _ in WIDTHS]
    for v, row in enumerate(run.links_topk):
        for u, p in row:
            if p >= min_link and int(u) > v:
                xs, ys = arc(v, int(u), 0.12 + 0.05 * (int(u) - v))
                b = buckets[min(int(p * len(WIDTHS)), len(WIDTHS) - 1)]
                b[0].extend(xs)
                b[1].extend(ys)
    for i, (w, (xs, ys)) in enumerate(zip(WIDTHS, buckets)):
        lo, hi = i / len(WIDTHS), (i + 1) / len(WIDTHS)
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], mode="lines", hoverinfo="skip",
                                 line=dict(width=w, color=f"rgba(90,90,90,{0.25 + 0.6 * hi:.2f})"),
                                 name=f"link p {lo:.1f}-{hi:.1f}", legendgroup="links", showlegend=bool(xs)))
    for k, name in enumerate(names):
        path = run.paths[name]
        xs, ys = [], []
        for a, b in zip(path, path[1:]):
            ax, ay = arc(a, b, -(0.25 + 0.12 * k))
            xs += ax
            ys += ay
        hot = step is None or step == k
        fig.add_trace(go.Scatter(
            x=xs or [None], y=ys or [None], mode="lines", name=f"{name}: {output_text(trace, name)}",
            line=dict(color=colors.strategy_color(name, k), width=4 if step == k else 2),
            opacity=1.0 if hot else 0.35, hoverinfo="name"))
    pp = run.pass_prob or [1.0] * Lg
    fig.add_trace(go.Scatter(
        x=list(range(Lg)), y=[0] * Lg, mode="markers", name="vertices", showlegend=False,
        marker=dict(size=[6 + 14 * p for p in pp], color="#444"),
        customdata=list(range(Lg)),
        hovertext=[f"vertex {v}, pass prob {pp[v]:.3f}<br>emits: "
                   + (topk_text(trace, run.emissions_topk[v]) if v < len(run.emissions_topk) else "not recorded")
                   for v in range(Lg)],
        hovertemplate="%{hovertext}<extra></extra>"))
    focus = names[step] if step is not None else run.chosen
    fig.update_layout(
        title=f"{trace.method}: {Lg} vertices; {focus} -> {output_text(trace, focus)!r}",
        height=440, plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=30),
        legend=dict(orientation="h", y=-0.12), xaxis=vertex_axis(trace, Lg),
        yaxis=bare_axis(range=[-(0.45 + 0.12 * len(names)), 0.2 + 0.05 * Lg]))
    return fig
