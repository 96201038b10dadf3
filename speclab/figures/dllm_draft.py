"""A drafted block being filled, one round at a time, above what the verify made of it: dllm-draft's
(a block-diffusion LM, one or several forwards) and flexdraft's (the target's own mask rows, one
forward; its slot 1 is the target's own token) and causal-tree's main chain (the same mask rows made
tree-causal; its side branches are counted in the title and, when one of their tokens was the one
accepted at a slot, shown there as "branch").

    block_fill_figure(trace, step)  round `step`: one column a slot of the block, one row a
                                    denoising forward (the first at the top). A slot's cell in the
                                    row of the forward that set it is coloured by its confidence
                                    (its distribution's top probability then) and names the token;
                                    later rows show it committed (grey), earlier rows still masked.
                                    Above, the verify's verdict per slot: accepted, rejected, not
                                    reached (with tree=True, a slot's candidate the verify took).
                                    The title gives the run's round cost c and the tau at which it
                                    breaks even (block_cost), beside its tau.
    has_block_fill(trace)           the trace recorded dllm-draft's or flexdraft's per-slot decisions
    block_cost(trace, ar_step_s)    c = a round's draft + verify seconds in ar steps, the tau at which
                                    it breaks even (tau = c) and the per-token alpha (metrics.break_even)

Drawn from the rounds' `dllm-draft` / `flexdraft` Decisions (slot, confidence, step; output the token) and draft
nodes, so it needs record="light" or "full". Wired for the method in figures.views.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab import metrics
from speclab.figures import colors
from speclab.figures._util import check_step, num, tok
from speclab.trace import ACCEPTED, NOT_REACHED, Trace

POLICIES = ("dllm-draft", "flexdraft", "causal-tree")
WHO = {"dllm-draft": "the dLLM", "flexdraft": "the target (mask rows)",
       "causal-tree": "the target (tree-causal mask rows)"}
EARLIER = "#d9d9d9"


def has_block_fill(trace: Trace) -> bool:
    return trace.steps_row().verify and any(d.policy in POLICIES for r in trace.rounds for d in r.decisions)


def slots_of(rnd) -> list:
    """The round's per-slot decisions, by slot."""
    return sorted((d for d in rnd.decisions if d.policy in POLICIES), key=lambda d: d.at)


def verdicts(rnd, k: int) -> list[tuple[str, object]]:
    """Per slot: the verify's decision on the chain's token there, or "accepted" with the node when
    a tree candidate at that slot was the one accepted (then the chain's was refused)."""
    by_depth: dict[int, list] = {}
    for n in rnd.nodes:
        by_depth.setdefault(n.depth, []).append(n)
    out = []
    for i in range(k):
        nodes = by_depth.get(i + 1, [])
        taken = next((n for n in nodes if n.decision == ACCEPTED), None)
        chain = next((n for n in nodes if n.id == i), None)
        node = taken or chain
        out.append((node.decision if node is not None else NOT_REACHED, node))
    return out


def block_fill_figure(trace: Trace, step: int = 0) -> go.Figure | None:
    step = check_step(trace, step, len(trace.rounds))
    rnd = trace.rounds[step]
    slots = slots_of(rnd)
    k = max((len(slots_of(r)) for r in trace.rounds), default=0)
    S = max((int(r.info.get("steps", 1)) for r in trace.rounds), default=1)
    set_at = {d.at: int(d.inputs["step"]) - 1 for d in slots}
    conf = [[None] * k for _ in range(S)]
    earlier = [[None] * k for _ in range(S)]
    tx, ty, tt, th = [], [], [], []
    for d in slots:
        s0 = set_at[d.at]
        conf[s0][d.at] = d.inputs["confidence"]
        for s in range(S):
            if s > s0:
                earlier[s][d.at] = 1
            tx.append(d.at)
            ty.append(s)
            tt.append(tok(trace, d.output) if s >= s0 else "▢")
            th.append(f"slot {d.at + 1}, forward {s + 1}: " + (
                f"set to {tok(trace, d.output)}, confidence {num(d.inputs['confidence'])}" if s == s0 else
                f"{tok(trace, d.output)} (set in forward {s0 + 1})" if s > s0 else "still masked"))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.25, 0.75], vertical_spacing=0.08)
    v = verdicts(rnd, k)
    fig.add_trace(go.Scatter(
        x=list(range(k)), y=[0] * k, mode="markers+text", name="verify", showlegend=False,
        marker=dict(symbol="square", size=30, color=[colors.DECISION[dec] for dec, _ in v]),
        text=[tok(trace, n.token) if n is not None else "" for _, n in v], textfont=dict(size=11),
        hovertext=[f"slot {i + 1}: {colors.DECISION_LABEL[dec]}" + (
            f" {tok(trace, n.token)} (p {num(n.p)}, q {num(n.q)})" + (f", {n.source}" if n.source in ("candidate", "branch") else "")
            if n is not None else "") for i, (dec, n) in enumerate(v)], hoverinfo="text"), row=1, col=1)
    fig.add_trace(go.Heatmap(x=list(range(k)), y=list(range(S)), z=earlier, zmin=0, zmax=1,
                             colorscale=[[0, EARLIER], [1, EARLIER]], showscale=False, hoverinfo="skip",
                             xgap=2, ygap=2, name="committed earlier"), row=2, col=1)
    fig.add_trace(go.Heatmap(x=list(range(k)), y=list(range(S)), z=conf, zmin=0, zmax=1, colorscale="Viridis",
                             colorbar=dict(title="confidence", len=0.7, y=0.35), hoverinfo="skip", xgap=2, ygap=2,
                             name="set in this forward"), row=2, col=1)
    fig.add_trace(go.Scatter(x=tx or [None], y=ty or [None], mode="text", text=tt or None, hovertext=th or None,
                             hoverinfo="text", textfont=dict(size=11, color="#222222"), showlegend=False,
                             name="tokens"), row=2, col=1)
    for dec in (ACCEPTED, "rejected", NOT_REACHED):       # the verdicts' legend
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=colors.DECISION_LABEL[dec],
                                 marker=dict(symbol="square", size=11, color=colors.DECISION[dec])), row=1, col=1)
    m = block_cost(trace)
    who = WHO.get(slots[0].policy if slots else "", "the drafter")
    head = f"round {step + 1}: {len(slots)} slots filled in {S} forward{'s' if S > 1 else ''} of {who}, " \
           f"{len(rnd.accepted)} accepted"
    side = [d for d in rnd.decisions if d.policy == "causal-tree-branch"]
    if side:                                    # causal-tree: its side branches, each with the token after it
        head += f" ({len(side)} side branches, {sum(n.source == 'branch' and n.decision == ACCEPTED for n in rnd.nodes)}" \
                " of their tokens accepted)"
    if m is not None:
        head += (f"<br><sub>round cost c ≥ {m['c']:.2f} ar steps (draft {m['c_draft']:.2f}; unit: the verify "
                 f"forward) → breaks even at tau {m['break_even_tau']:.2f}; this run's tau {m['tau']:.2f}</sub>")
    fig.update_layout(title=head, height=200 + 46 * S, margin=dict(l=60, r=30, t=70, b=60), plot_bgcolor="white",
                      legend=dict(orientation="h", y=0, yref="container", yanchor="bottom", x=1, xanchor="right"))
    fig.update_xaxes(tickvals=list(range(k)), ticktext=[f"slot {i + 1}" for i in range(k)], range=[-0.5, k - 0.5],
                     row=2, col=1)
    fig.update_xaxes(range=[-0.5, k - 0.5], row=1, col=1)
    fig.update_yaxes(tickvals=[0], ticktext=["verify"], range=[-0.6, 0.6], row=1, col=1)
    fig.update_yaxes(tickvals=list(range(S)), ticktext=[f"forward {s + 1}" for s in range(S)],
                     range=[S - 0.5, -0.5], row=2, col=1)
    return fig


def block_cost(trace, ar_step_s: float | None = None) -> dict | None:
    """The round cost of a dllm-draft run and the tau at which it breaks even: a round costs
    c = (draft + verify seconds) / one ar step, so it pays when tau > c (metrics.expected_speedup).
    ar_step_s: seconds of one ar step measured on the same prompts (the bench's ar run); without it,
    the run's own verify forward stands in (an ar step costs at most that, so c is then a lower
    bound). Also: c_draft (the block's forwards alone, in the same unit), the run's tau and the
    break-even per-token alpha of a chain of k (metrics.break_even)."""
    rounds = metrics._decode_rounds(trace)
    if not rounds or not trace.totals.drafted:
        return None
    draft_s = sum(r.draft_s for r in rounds) / len(rounds)
    verify_s = sum(r.verify_s for r in rounds) / len(rounds)
    unit = ar_step_s or verify_s
    if not unit:
        return None
    c = (draft_s + verify_s) / unit
    k = int(rounds[0].info.get("k") or trace.params.get("k") or rounds[0].drafted)
    return {"c": c, "c_draft": draft_s / unit, "break_even_tau": c, "break_even_alpha": metrics.break_even(k, c),
            "tau": trace.totals.tau, "unit": "ar step" if ar_step_s else "verify forward", "k": k}
