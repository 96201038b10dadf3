"""The draft tree of one round: what was proposed, what the target accepted, in what order.

Left to right by depth, from the committed token (the root) to the leaves. Nodes are coloured by
the decision (accepted / rejected / not reached), the accepted path is drawn thick and ends in the
token the target emitted (correction or bonus); siblings carry their try order. Hover: p, q, u,
the rule and, with record="full", the top-k of p and q. Where several rules judged the draft
(`DraftNode.verdicts`), the hover lists each rule's verdict and a ring marks the nodes a lossy rule
rescued (figures.verdicts). A chain is a tree of width one.
"""
from __future__ import annotations

import functools

import networkx as nx
import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import bare_axis, check_step, num, tok, topk_text
from speclab.figures.verdicts import RESCUED, disagrees, has_verdicts, rescued, verdict_text
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED, DraftNode, Round, Trace

ROOT, EMIT = -1, "emitted"


def round_nodes(r: Round) -> list[DraftNode]:
    """The round's draft nodes; traces recorded with record=None keep only the accepted path."""
    if r.nodes or not r.accepted:
        return r.nodes
    parents = [-1] + r.accepted[:-1]
    return [DraftNode(id=i, parent=p, token=t, depth=d + 1, decision=ACCEPTED)
            for d, (i, p, t) in enumerate(zip(r.accepted, parents, r.path_tokens))]


def graph(r: Round) -> nx.DiGraph:
    """Root (-1) -> draft nodes -> the emitted token, hung off the end of the accepted path."""
    g = nx.DiGraph()
    g.add_node(ROOT, depth=0)
    for n in round_nodes(r):
        g.add_node(n.id, depth=n.depth, node=n)
        g.add_edge(n.parent, n.id)
    last = r.accepted[-1] if r.accepted else ROOT
    if r.emitted >= 0:          # none: the round ended on an accepted draft token (PEARL's post-verify)
        g.add_node(EMIT, depth=g.nodes[last]["depth"] + 1)
        g.add_edge(last, EMIT)
    return g


def tidy_layout(g: nx.DiGraph) -> dict:
    """x = depth; y = leaf slot, parents centred over their children, siblings in try order."""
    def key(v):
        n = g.nodes[v].get("node")
        if n is None:             # the emitted token sits below its siblings
            return (1, 10**9, 0)
        return (0, n.try_order if n.try_order is not None else 10**6, n.id)

    pos, next_leaf = {}, 0
    # depth first, children in order, a node placed after its children: with a stack, not
    # recursion, so a chain deeper than Python's recursion limit (a hand-made trace) still draws
    todo = [(ROOT, False)]
    while todo:
        v, kids_placed = todo.pop()
        kids = sorted(g.successors(v), key=key)
        if not kids_placed and kids:
            todo.append((v, True))
            todo += [(c, False) for c in reversed(kids)]
            continue
        y = sum(pos[c][1] for c in kids) / len(kids) if kids else -next_leaf
        if not kids:
            next_leaf += 1
        pos[v] = (g.nodes[v]["depth"], y)
    return pos


def source_text(source: str) -> str:
    """A draft node's provenance in words: a feature head's (decoding/drafters/heads.py), a copy's
    (prompt lookup, also grafted onto an eagle tree); other sources as they are."""
    import re
    m = re.fullmatch(r"h(\d+)(?:\+(\d+))?(?:@L([\d,]+))?", source)
    if m:
        t, j = int(m[1]), int(m[2] or 0)
        return ((f"EAGLE head on the target's hidden state at position {t}" if not m[3] else    # eagle3: @L<aux layers>
                 f"EAGLE-3 draft on the target's hidden states at position {t} after layers {m[3].replace(',', ', ')}")
                + (f", then {j} step{'s' * (j > 1)} on its own predicted features" if j else ""))
    m = re.fullmatch(r"medusa(\d+)@h(\d+)", source)
    if m:
        return f"Medusa head {m[1]} on the target's hidden state at position {m[2]}"
    m = re.fullmatch(r"(\d+)-gram@(\d+)", source)
    if m:
        return f"copied: what followed the last {m[1]} token{'s' * (m[1] != '1')} where they occurred at position {m[2]}"
    return source


def node_hover(trace: Trace, n: DraftNode) -> str:
    s = (f"<b>{tok(trace, n.token)}</b> (id {n.token}) node {n.id}, depth {n.depth}<br>"
         f"{colors.DECISION_LABEL.get(n.decision, n.decision)}"
         + (f", try #{n.try_order + 1}" if n.try_order is not None else "")
         + f"<br>p={num(n.p)}  q={num(n.q)}  u={num(n.u)}"
         + (f"<br>rule: {n.rule}" if n.rule else "") + (f"<br>source: {source_text(n.source)}" if n.source else ""))
    if disagrees(n):
        s += f"<br>verdicts: {verdict_text(n)}" + (" (<b>rescued</b>)" if rescued(n) else "")
    if n.p_topk:
        s += f"<br>p top-k: {topk_text(trace, n.p_topk)}"
    if n.q_topk:
        s += f"<br>q top-k: {topk_text(trace, n.q_topk)}"
    if n.p is None and n.decision == ACCEPTED:
        s += "<br>(recorded without per-node detail)"
    return s


def context_token(trace: Trace, step: int) -> int | None:
    """The last committed token before round `step`: the root the draft hangs from."""
    for r in reversed(trace.rounds[:step]):
        if r.tokens:
            return r.tokens[-1]
    return trace.prompt_ids[-1] if trace.prompt_ids else None


def edge_xy(pos: dict, edges) -> tuple[list, list]:
    """Line segments through the laid-out nodes (pos: node -> (x, y)), None between them, for one trace."""
    xs, ys = [], []
    for a, b in edges:
        xs += [pos[a][0], pos[b][0], None]
        ys += [pos[a][1], pos[b][1], None]
    return xs or [None], ys or [None]


def tree_parts(trace: Trace, step: int = 0) -> dict:
    """The tree as plain dicts (data, xaxis, yaxis, title, height): cheap to build per frame."""
    step = check_step(trace, step, len(trace.rounds))
    r = trace.rounds[step]
    g = graph(r)
    pos = tidy_layout(g)
    on_path = set(r.accepted)
    path_edges = set(zip([ROOT] + r.accepted, r.accepted + [EMIT]))
    lines = functools.partial(edge_xy, pos)
    data = []
    ex, ey = lines([e for e in g.edges if e not in path_edges])
    data.append(dict(type="scatter", x=ex, y=ey, mode="lines", line=dict(color=colors.EDGE, width=1.5),
                     hoverinfo="skip", name="draft edges", showlegend=False))
    px, py = lines([e for e in g.edges if e in path_edges])
    data.append(dict(type="scatter", x=px, y=py, mode="lines", line=dict(color=colors.PATH, width=5),
                     hoverinfo="skip", name="accepted path"))
    ctx = context_token(trace, step)
    data.append(dict(
        type="scatter", x=[pos[ROOT][0]], y=[pos[ROOT][1]], mode="markers+text", name="context",
        text=[tok(trace, ctx) if ctx is not None else ""], textposition="top center",
        marker=dict(size=16, color=colors.CONTEXT, symbol="square"),
        hovertext=["last committed token: " + (tok(trace, ctx) if ctx is not None else "—")],
        hovertemplate="%{hovertext}<extra></extra>"))
    nodes = [g.nodes[v]["node"] for v in g.nodes if v not in (ROOT, EMIT)]
    for decision in (ACCEPTED, REJECTED, NOT_REACHED):
        ns = [n for n in nodes if n.decision == decision]
        data.append(dict(
            type="scatter", x=[pos[n.id][0] for n in ns] or [None], y=[pos[n.id][1] for n in ns] or [None],
            mode="markers+text", name=colors.DECISION_LABEL[decision],
            text=[tok(trace, n.token) for n in ns], textposition="top center",
            marker=dict(size=[18 if n.id in on_path else 13 for n in ns], color=colors.DECISION[decision],
                        line=dict(width=[2 if n.id in on_path else 0 for n in ns], color="black")),
            customdata=[[n.id, n.p, n.q, n.u] for n in ns],
            hovertext=[node_hover(trace, n) for n in ns], hovertemplate="%{hovertext}<extra></extra>"))
    kind = r.emitted_kind
    ex, ey = pos.get(EMIT, (None, None))
    data.append(dict(
        type="scatter", x=[ex], y=[ey], mode="markers+text", name=f"emitted ({kind})",
        text=[tok(trace, r.emitted) if r.emitted >= 0 else ""], textposition="top center",
        marker=dict(size=18, color=colors.ORIGIN.get(kind, "white"), symbol="diamond",
                    line=dict(width=2, color="black")),
        hovertext=[f"<b>{tok(trace, r.emitted)}</b> (id {r.emitted}): the target's {kind} token"
                   + (f"<br>from: {topk_text(trace, r.residual_topk)}" if r.residual_topk else "")
                   + ("" if r.tokens[-1:] == [r.emitted] or not r.kept else "<br>(not kept: the run ended)")
                   if r.emitted >= 0 else ""],
        hovertemplate="%{hovertext}<extra></extra>"))
    tried = [n for n in nodes if n.try_order is not None and len(list(g.successors(n.parent))) > 1]
    data.append(dict(
        type="scatter", x=[pos[n.id][0] for n in tried] or [None], y=[pos[n.id][1] - 0.3 for n in tried] or [None],
        mode="text", text=[f"try {n.try_order + 1}" for n in tried], textfont=dict(size=10, color="#666"),
        hoverinfo="skip", name="try order", showlegend=False))
    if has_verdicts(trace):         # last, and only for runs judged by several rules: indices above stay
        ring = [n for n in nodes if rescued(n)]
        data.append(dict(
            type="scatter", x=[pos[n.id][0] for n in ring] or [None], y=[pos[n.id][1] for n in ring] or [None],
            mode="markers", name="rescued (a lossy rule accepted what the exact rule did not)",
            marker=dict(size=28, symbol="circle-open", color=RESCUED, line=dict(width=3)),
            hovertext=[node_hover(trace, n) for n in ring], hovertemplate="%{hovertext}<extra></extra>"))
    ys = [y for _, y in pos.values()]
    depth = max(x for x, _ in pos.values())
    return dict(data=data, title=tree_title(trace, step), height=max(200, 45 * (max(ys) - min(ys) + 1)),
                xaxis=bare_axis(range=[-0.5, depth + 0.7]), yaxis=bare_axis(range=[min(ys) - 0.6, max(ys) + 0.6]))


def draft_tree(trace: Trace, step: int = 0) -> go.Figure:
    """The draft tree of round `step` (negative counts from the end). Traces: 0 edges, 1 accepted
    path, 2 context, 3 accepted, 4 rejected, 5 not reached nodes, 6 emitted token, 7 try order,
    8 rescued rings (only where the run kept several rules' verdicts)."""
    p = tree_parts(trace, step)
    return go.Figure(p["data"], dict(title=p["title"], height=p["height"] + 60, plot_bgcolor="white",
                                     margin=dict(l=10, r=10, t=50, b=10), xaxis=p["xaxis"], yaxis=p["yaxis"],
                                     legend=dict(itemsizing="constant")))


def tree_title(trace: Trace, step: int) -> str:
    r = trace.rounds[step]
    info = ", ".join(f"{k}={v}" for k, v in r.info.items())
    s = (f"round {step + 1}/{len(trace.rounds)}: drafted {r.drafted}, accepted {len(r.accepted)}, "
         + (f"then {r.emitted_kind} {tok(trace, r.emitted)}" if r.emitted >= 0 else "no target token"))
    if r.drafted and not r.nodes:
        s += " (recorded without per-node detail)"
    return s + (f"  [{info}]" if info else "")
