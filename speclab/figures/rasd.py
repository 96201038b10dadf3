"""A fused retrieval + draft tree, one round at a time: where each node came from, and what pruning
took out (RASD, decoding/drafters/rasd.py).

    fusion_figure(trace, step)   round `step`'s verified tree laid out as the draft tree figure lays
                                 it out (figures.tree), each node coloured by its origin: the draft's
                                 own ("draft"), retrieved and hung below ("retrieval"), drafted AND
                                 retrieved ("both", where longest prefix matching merged a retrieved
                                 path into the draft's); the accepted path drawn thick and its nodes
                                 ringed; below the tree, the retrieved branches pruned before fusion
                                 (crosses: the branch's first token, the draft's q for it, the
                                 threshold it fell under, the nodes that went with it)
    has_fusion(trace)            some round holds a RetrievalFusion record

The counts are the round's RetrievalFusion record; the nodes need record "light" or "full", the
pruned branches the round's "rasd-prune" Decisions. A node's origin is its source's prefix
("draft:h41+1", "retrieval:self", "both:h41"). Traces: 0 edges, 1 accepted path, 2 context,
3 draft, 4 retrieval, 5 both, 6 emitted token, 7 pruned branches (a fixed count for a player).
"""
from __future__ import annotations

import functools

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import bare_axis, check_step, num, tok
from speclab.figures.tree import EMIT, ROOT, context_token, edge_xy, graph, node_hover, tidy_layout
from speclab.trace import ACCEPTED, Trace

ORIGINS = ("draft", "retrieval", "both")
ORIGIN_COLOR = {"draft": "#1f77b4", "retrieval": "#9467bd", "both": "#17becf"}
ORIGIN_LABEL = {"draft": "draft (the head's tree)", "retrieval": "retrieval (hung below)",
                "both": "both (drafted and retrieved)"}
PRUNED = "#d62728"


def has_fusion(trace: Trace) -> bool:
    return trace.steps_row().verify and any("rasd_found" in r.info for r in trace.rounds)


def origin(source: str) -> str:
    head = source.split(":", 1)[0]
    return head if head in ORIGINS else "draft"


def pruned_of(rnd) -> list:
    """The round's retrieved branches pruned before fusion (their Decisions), in the order found."""
    return [d for d in rnd.decisions if d.policy == "rasd-prune" and d.output == "pruned"]


def fusion_figure(trace: Trace, step: int = 0) -> go.Figure:
    step = check_step(trace, 0 if step is None else step, len(trace.rounds))
    r = trace.rounds[step]
    g = graph(r)
    pos = tidy_layout(g)
    path_edges = set(zip([ROOT] + r.accepted, r.accepted + [EMIT]))
    on_path = set(r.accepted)
    lines = functools.partial(edge_xy, pos)
    data = []
    ex, ey = lines([e for e in g.edges if e not in path_edges])
    data.append(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color=colors.EDGE, width=1.5), hoverinfo="skip",
                           name="tree edges", showlegend=False))
    px, py = lines([e for e in g.edges if e in path_edges])
    data.append(go.Scatter(x=px, y=py, mode="lines", line=dict(color=colors.PATH, width=5), hoverinfo="skip",
                           name="accepted path"))
    ctx = context_token(trace, step)
    data.append(go.Scatter(x=[pos[ROOT][0]], y=[pos[ROOT][1]], mode="markers+text", name="context",
                           text=[tok(trace, ctx) if ctx is not None else ""], textposition="top center",
                           marker=dict(size=16, color=colors.CONTEXT, symbol="square"), hoverinfo="skip"))
    nodes = [g.nodes[v]["node"] for v in g.nodes if v not in (ROOT, EMIT)]
    for o in ORIGINS:
        ns = [n for n in nodes if origin(n.source) == o]
        data.append(go.Scatter(
            x=[pos[n.id][0] for n in ns] or [None], y=[pos[n.id][1] for n in ns] or [None], mode="markers+text",
            name=ORIGIN_LABEL[o], text=[tok(trace, n.token) for n in ns], textposition="top center",
            marker=dict(size=[18 if n.id in on_path else 13 for n in ns], color=ORIGIN_COLOR[o],
                        line=dict(width=[3 if n.decision == ACCEPTED else 0 for n in ns], color=colors.PATH)),
            hovertext=[f"<b>{o}</b><br>" + node_hover(trace, n) for n in ns],
            hovertemplate="%{hovertext}<extra></extra>"))
    mx, my = pos.get(EMIT, (None, None))
    data.append(go.Scatter(
        x=[mx], y=[my], mode="markers+text", name=f"emitted ({r.emitted_kind})",
        text=[tok(trace, r.emitted) if r.emitted >= 0 else ""], textposition="top center",
        marker=dict(size=18, color=colors.ORIGIN.get(r.emitted_kind, "white"), symbol="diamond",
                    line=dict(width=2, color="black")), hoverinfo="skip"))
    ys = [y for _, y in pos.values()]
    gone = pruned_of(r)
    low = min(ys) - 1
    data.append(go.Scatter(
        x=[1] * len(gone) or [None], y=[low - i for i in range(len(gone))] or [None], mode="markers+text",
        name="retrieved branch pruned (the draft's q under the threshold)",
        text=[f"{tok(trace, d.inputs.get('token'))}  q={num(d.inputs.get('q'), 3)}" for d in gone],
        textposition="middle right", marker=dict(symbol="x", size=11, color=PRUNED),
        hovertext=[f"pruned before fusion: first token {tok(trace, d.inputs.get('token'))}, the draft's q = "
                   f"{num(d.inputs.get('q'))} < {num(d.threshold)}; {d.inputs.get('nodes')} node(s) went with it"
                   for d in gone], hovertemplate="%{hovertext}<extra></extra>"))
    bottom = low - len(gone) + 1 if gone else min(ys)
    depth = max(x for x, _ in pos.values())
    counts = {o: sum(origin(n.source) == o for n in nodes) for o in ORIGINS}
    info = r.info
    title = (f"round {step + 1}/{len(trace.rounds)}: {counts['draft']} draft, {counts['retrieval']} retrieval, "
             f"{counts['both']} both; accepted {len(r.accepted)}"
             + (f" (retrieval found {info['rasd_found']} after a {info.get('rasd_match', 0)}-token match, "
                f"pruned {info.get('rasd_pruned', 0)})" if info.get("rasd_found") else " (nothing retrieved)"))
    height = max(220, 45 * (max(ys) - bottom + 1)) + 80
    fig = go.Figure(data)
    fig.update_layout(title=title, height=height, plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=bare_axis(range=[-0.5, max(depth, 2) + 0.9]),
                      yaxis=bare_axis(range=[bottom - 0.6, max(ys) + 0.6]),
                      legend=dict(itemsizing="constant"))
    return fig
