"""The two distributions behind one speculative decision: the target's p and the draft's q.

For a draft node (record="full" keeps the top-k of both), grouped bars over the tokens either
distribution ranks high, the drafted token marked, and the rule spelled out with its numbers:
accept with probability min(1, p(x) / q(x)); on a rejection the target's token is drawn from the
residual max(0, p - q), renormalised, drawn as a third bar. A temperature other than the one that
ran re-tempers both recorded distributions (p^(1/T), renormalised over the tokens recorded, so an
approximation: the tail beyond the top-k is not in the trace) to show how the rule would change.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures._util import num, tok
from speclab.trace import ACCEPTED, REJECTED, DraftNode, Round, Trace

P_COLOR, Q_COLOR, RESIDUAL_COLOR = "#3182bd", "#f4a259", "#d62728"


def pick_node(r: Round, node_id: int | None = None) -> DraftNode | None:
    """The node to explain: `node_id`, else the first rejected one, else the deepest accepted one
    (only nodes that carry both distributions)."""
    full = [n for n in r.nodes if n.p_topk and n.q_topk]
    if node_id is not None:
        return next((n for n in full if n.id == node_id), None)
    rejected = [n for n in full if n.decision == REJECTED]
    accepted = [n for n in full if n.decision == ACCEPTED]
    return rejected[0] if rejected else max(accepted, key=lambda n: n.depth) if accepted else (full[0] if full else None)


def retemper(topk: list[list[float]], ratio: float) -> dict[int, float]:
    """{token: prob} with probs raised to 1/ratio (ratio = new T / recorded T) and renormalised."""
    w = {int(t): p ** (1.0 / ratio) for t, p in topk if p > 0}
    z = sum(w.values()) or 1.0
    return {t: v / z for t, v in w.items()}


def distributions(trace: Trace, step: int, node_id: int | None = None, temperature: float | None = None) -> go.Figure | None:
    """The figure for round `step` (0-based), or None when the round has no node with recorded
    distributions (record="full" and a drafter that has a q)."""
    if trace.engine != "speculative" or not 0 <= step < len(trace.rounds):
        return None
    n = pick_node(trace.rounds[step], node_id)
    if n is None:
        return None
    ran = trace.sampling.temperature or 1.0      # greedy runs record p and q at T = 1
    T = temperature or ran
    exact = abs(T - ran) < 1e-9
    p = {int(t): v for t, v in n.p_topk} if exact else retemper(n.p_topk, T / ran)
    q = {int(t): v for t, v in n.q_topk} if exact else retemper(n.q_topk, T / ran)
    order = sorted(set(p) | set(q), key=lambda t: -max(p.get(t, 0), q.get(t, 0)))
    res = {t: max(0.0, p.get(t, 0) - q.get(t, 0)) for t in order}
    z = sum(res.values())
    labels = [tok(trace, t) + (" ◀ drafted" if t == n.token else "") for t in order]
    fig = go.Figure()
    fig.add_bar(x=labels, y=[p.get(t, 0) for t in order], name="p: target", marker_color=P_COLOR,
                hovertemplate="%{x}: p = %{y:.3f}<extra></extra>")
    fig.add_bar(x=labels, y=[q.get(t, 0) for t in order], name="q: draft", marker_color=Q_COLOR,
                hovertemplate="%{x}: q = %{y:.3f}<extra></extra>")
    if z > 0:
        fig.add_bar(x=labels, y=[res[t] / z for t in order], name="residual max(0, p - q), renormalised",
                    marker_color=RESIDUAL_COLOR, opacity=0.55,
                    hovertemplate="%{x}: residual %{y:.3f}<extra></extra>")
    px, qx = (n.p, n.q) if exact else (p.get(n.token), q.get(n.token))
    if exact and not trace.sampling.temperature:
        top1 = max(p, key=p.get)
        rule = (f"greedy: accept iff the drafted token is the target's top-1 (<b>{tok(trace, top1)}</b>); "
                "pick a temperature to see the sampling rule min(1, p/q)")
    elif px is not None and qx:
        rule = f"accept with min(1, p/q) = min(1, {num(px)} / {num(qx)}) = {num(min(1.0, px / qx))}"
    else:
        rule = "p or q of the drafted token is outside the recorded top-k at this temperature"
    what = {ACCEPTED: "accepted", REJECTED: "rejected"}.get(n.decision, "not reached")
    u = f", u = {num(n.u)}" if exact and n.u is not None else ""
    head = (f"round {step + 1}, draft node {n.id} (depth {n.depth}): drafted <b>{tok(trace, n.token)}</b>, "
            f"{what}{u}")
    sub = rule + ("" if exact else f"<br>re-tempered to T = {T:g} from the recorded top-{len(n.p_topk)} "
                  f"(ran at T = {ran:g}; an approximation: the tail is not recorded)")
    fig.update_layout(title=dict(text=f"{head}<br><span style='font-size:12px'>{sub}</span>"),
                      barmode="group", height=360, margin=dict(l=50, r=10, t=90, b=60),
                      yaxis=dict(title=dict(text="probability"), range=[0, 1.02], gridcolor="#eeeeee"),
                      plot_bgcolor="white", legend=dict(orientation="h", y=-0.2),
                      meta=dict(step=step, node=n.id))
    return fig
