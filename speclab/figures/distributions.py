"""The two distributions behind one speculative decision: the target's p and the draft's q.

For a draft node (record="full" keeps the top-k of both), grouped bars over the tokens either
distribution ranks high, the drafted token marked, and the rule spelled out with its numbers:
accept with probability min(1, p(x) / q(x)); on a rejection the target's token is drawn from the
residual max(0, p - q), renormalised, drawn as a third bar. A temperature other than the one that
ran re-tempers both recorded distributions (p^(1/T), renormalised over the tokens recorded, so an
approximation: the tail beyond the top-k is not in the trace) to show how the rule would change.

Below, why the rule is lossless, as a picture: for every token x, p(x) is drawn as min(p, q)
(the mass a draft of x brings and the rule keeps: q(x) times min(1, p(x) / q(x))) stacked with
max(0, p - q) (the mass the residual draw adds after a rejection, which is the rejection
probability times the renormalised residual), so the two pieces add up to p exactly; beside it,
the accept probability min(1, p(x) / q(x)) of each token were it drafted.

Traces: 0 p, 1 q, 2 residual renormalised (above); 3 min(p, q), 4 max(0, p - q) (lower left);
5 accept probability (lower right).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures._util import num, tok
from speclab.trace import ACCEPTED, REJECTED, DraftNode, Round, Trace

P_COLOR, Q_COLOR, RESIDUAL_COLOR = "#3182bd", "#f4a259", "#d62728"
KEPT_COLOR, ACCEPT_COLOR = "#8fd19e", "#2ca02c"


def lossless_parts(p: dict[int, float], q: dict[int, float], order: list[int]) -> dict[str, list[float]]:
    """Per token of `order`: kept = min(p, q), added = max(0, p - q) (kept + added = p), and the
    accept probability min(1, p / q) (1 where q = 0: a token the draft never offers needs no rule)."""
    kept = [min(p.get(t, 0.0), q.get(t, 0.0)) for t in order]
    added = [max(0.0, p.get(t, 0.0) - q.get(t, 0.0)) for t in order]
    accept = [min(1.0, p.get(t, 0.0) / q[t]) if q.get(t, 0.0) > 0 else 1.0 for t in order]
    return {"kept": kept, "added": added, "accept": accept}


def pick_node(r: Round, node_id: int | None = None) -> DraftNode | None:
    """The node to explain: `node_id`, else the first rejected one, else the deepest accepted one
    (only nodes that carry both distributions)."""
    full = [n for n in r.nodes if n.p_topk and n.q_topk]
    if node_id is not None:
        return next((n for n in full if n.id == node_id), None)
    rejected = [n for n in full if n.decision == REJECTED]
    accepted = [n for n in full if n.decision == ACCEPTED]
    return rejected[0] if rejected else max(accepted, key=lambda n: n.depth) if accepted else (full[0] if full else None)


def ran_text(trace: Trace) -> str:
    """How the run sampled, in words: a greedy run is "greedy" (its p and q are recorded at T = 1)."""
    T = trace.sampling.temperature
    return f"ran at T = {T:g}" if T else "ran greedy; p and q recorded at T = 1"


def retemper(topk: list[list[float]], ratio: float) -> dict[int, float]:
    """{token: prob} with probs raised to 1/ratio (ratio = new T / recorded T) and renormalised."""
    w = {int(t): p ** (1.0 / ratio) for t, p in topk if p > 0}
    z = sum(w.values()) or 1.0
    return {t: v / z for t, v in w.items()}


def distributions(trace: Trace, step: int, node_id: int | None = None, temperature: float | None = None) -> go.Figure | None:
    """The figure for round `step` (0-based), or None when the round has no node with recorded
    distributions (record="full" and a drafter that has a q)."""
    if not trace.steps_row().verify or not 0 <= step < len(trace.rounds):
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
    fig = make_subplots(rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]], vertical_spacing=0.26,
                        horizontal_spacing=0.08, row_heights=[0.5, 0.5],
                        subplot_titles=("", "why the output follows p: p = min(p, q) + max(0, p − q)",
                                        "accept probability min(1, p/q) if drafted"))
    fig.add_bar(x=labels, y=[p.get(t, 0) for t in order], name="p: target", marker_color=P_COLOR,
                hovertemplate="%{x}: p = %{y:.3f}<extra></extra>", row=1, col=1)
    fig.add_bar(x=labels, y=[q.get(t, 0) for t in order], name="q: draft", marker_color=Q_COLOR,
                hovertemplate="%{x}: q = %{y:.3f}<extra></extra>", row=1, col=1)
    fig.add_bar(x=labels, y=[res[t] / z for t in order] if z > 0 else [0.0] * len(order),
                name="residual max(0, p - q), renormalised", marker_color=RESIDUAL_COLOR, opacity=0.55,
                showlegend=z > 0, hovertemplate="%{x}: residual %{y:.3f}<extra></extra>", row=1, col=1)
    parts = lossless_parts(p, q, order)
    # one offset group with an explicit base: the two pieces stack while the panel above groups
    fig.add_bar(x=labels, y=parts["kept"], name="min(p, q): drafted and kept", marker_color=KEPT_COLOR,
                offsetgroup="p", hovertemplate="%{x}: min(p, q) = %{y:.3f}<extra></extra>", row=2, col=1)
    fig.add_bar(x=labels, y=parts["added"], base=parts["kept"], name="max(0, p − q): added by the residual draw",
                marker_color=RESIDUAL_COLOR, opacity=0.55, offsetgroup="p",
                hovertemplate="%{x}: max(0, p − q) = %{y:.3f}<extra></extra>", row=2, col=1)
    fig.add_bar(x=labels, y=parts["accept"], name="min(1, p/q)", marker_color=ACCEPT_COLOR, showlegend=False,
                hovertemplate="%{x}: accepted with probability %{y:.3f}<extra></extra>", row=2, col=2)
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
                  f"({ran_text(trace)}; an approximation: the tail is not recorded)")
    fig.update_layout(title=dict(text=f"{head}<br><span style='font-size:12px'>{sub}</span>"),
                      barmode="group", height=640, margin=dict(l=50, r=10, t=90, b=60),
                      plot_bgcolor="white", legend=dict(orientation="h", y=-0.22),
                      meta=dict(step=step, node=n.id))
    fig.update_yaxes(range=[0, 1.02], gridcolor="#eeeeee")
    fig.update_yaxes(title_text="probability", row=1, col=1)
    fig.update_annotations(font_size=12)
    return fig
