"""The token strip: the prompt tail and the output, each token coloured by where it came from.

Origins: prompt, accepted draft, correction (the target's token after a rejection), bonus (the
target's extra token after a fully accepted path), target (a round with nothing drafted). Hover
shows p, q, u and the rule that decided. At a step, the current round is outlined and the tokens of
later rounds are covered (not generated yet); the cells themselves never change with the step, so an
animation only has to move the outline and the cover.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from speclab.figures import colors
from speclab.figures._util import bare_axis, check_step, num, show_token, tok, topk_text
from speclab.figures.steps import step_title
from speclab.trace import DraftNode, Round, Trace

RULE_TEXT = {  # how the target supplied the token it emitted, per rule family
    ("correction", True): "greedy: the target's argmax after the first mismatch",
    ("correction", False): "resampled from norm(max(0, p - q)) after the rejection",
    ("bonus", True): "greedy: the target's argmax after the whole path matched",
    ("bonus", False): "drawn from p after the whole path was accepted",
    ("target", True): "plain target step (argmax)", ("target", False): "plain target step (drawn from p)",
}
NOT_YET = "#f3f3f3"     # the cover over tokens later rounds generate


@dataclass
class Cell:
    """One output token and why it is there."""
    token: int
    origin: str                     # a key of colors.ORIGIN
    round: int                      # -1 for prompt tokens
    node: DraftNode | None = None   # the accepted draft node, where recorded


def cells(trace: Trace) -> list[Cell]:
    """Every new token in order, with its origin, rebuilt from the rounds (not from output_ids)."""
    out = []
    for i, r in enumerate(trace.rounds):
        by_id = {n.id: n for n in r.nodes}
        origins = [("accepted", by_id.get(nid)) for nid in r.accepted] + [(r.emitted_kind, None)]
        for t, (origin, node) in zip(r.tokens, origins):
            out.append(Cell(t, origin, i, node))
    if not trace.rounds:  # other engines: the output with no per-token provenance
        out = [Cell(t, "target", 0) for t in trace.output_ids]
    return out


def hover(trace: Trace, c: Cell) -> str:
    head = f"<b>{tok(trace, c.token)}</b> (id {c.token})<br>{colors.ORIGIN_LABEL[c.origin]}"
    if c.origin == "prompt":
        return head
    head += f", round {c.round + 1}"
    if c.node is not None:
        n = c.node
        return (head + f"<br>p={num(n.p)}  q={num(n.q)}  u={num(n.u)}<br>rule: {n.rule}"
                + (f"<br>source: {n.source}" if n.source else ""))
    if c.origin == "accepted":
        return head + "<br>(recorded without per-node detail)"
    r: Round = trace.rounds[c.round]
    greedy = trace.sampling.temperature == 0
    text = head + f"<br>{RULE_TEXT.get((c.origin, greedy), c.origin)}"
    if r.residual_topk:
        text += f"<br>from: {topk_text(trace, r.residual_topk)}"
    return text


def layout_cells(widths: list[int], line: int) -> list[tuple[int, int]]:
    """(x, row) of each cell: left to right, wrapping at `line` characters."""
    pos, x, row = [], 0, 0
    for w in widths:
        if x and x + w > line:
            x, row = 0, row + 1
        pos.append((x, row))
        x += w
    return pos


def prompt_start(trace: Trace, tail: int) -> int:
    """Where the strip's prompt cells begin: the prompt's last `tail` tokens, but never before the
    last user turn of a chat prompt (a turn marker, such as <|im_start|> or <start_of_turn>, then
    `user`), so a short question does not pull the chat template's system prompt into the strip."""
    ids = trace.prompt_ids
    start = max(0, len(ids) - tail)
    for i in range(len(ids) - 2, start - 1, -1):
        marker, role = trace.text_of(ids[i]), trace.text_of(ids[i + 1])
        if role.strip() == "user" and marker.startswith("<") and marker.endswith(">"):
            return i
    return start


def strip_parts(trace: Trace, step: int | None = None, line: int = 64, prompt_tail: int = 24,
                static: bool = True) -> dict:
    """The strip as plain dicts (data, xaxis, yaxis, title, height): cheap to build per frame.
    static=False leaves None in place of the traces that never change with the step (the cells and
    legend entries), which is what a player or an animation needs on every step after the first.
    Traces: 0 the cells, 1 the outline, 2.. legend entries, last the cover over later rounds."""
    step = check_step(trace, step, len(trace.rounds)) if trace.rounds else None
    prompt = [Cell(t, "prompt", -1) for t in trace.prompt_ids[prompt_start(trace, prompt_tail):]]
    cs = prompt + cells(trace)
    labels = [show_token(trace.text_of(c.token)) for c in cs]
    widths = [max(len(s), 1) + 1 for s in labels]          # +1: a gap between cells
    pos = layout_cells(widths, line)
    data = [None if not static else dict(
        type="bar", orientation="h", base=[x for x, _ in pos], x=[w - 0.15 for w in widths],
        y=[r for _, r in pos], width=0.8, text=labels, textposition="inside", insidetextanchor="middle",
        textangle=0, textfont=dict(family="monospace", size=12), constraintext="none",
        marker=dict(color=[colors.ORIGIN[c.origin] for c in cs], line=dict(width=0)),
        hovertext=[hover(trace, c) for c in cs], hovertemplate="%{hovertext}<extra></extra>",
        name="tokens", showlegend=False, customdata=[[c.round, c.origin] for c in cs])]
    ox, oy = outline([(p, w) for p, w, c in zip(pos, widths, cs) if step is not None and c.round == step])
    data.append(dict(type="scatter", x=ox, y=oy, mode="lines", line=dict(color=colors.CURRENT, width=2),
                     name="current round", hoverinfo="skip", showlegend=False))
    for origin in colors.ORIGIN:                        # legend entries only: fixed trace count per figure
        data.append(None if not static else dict(
            type="scatter", x=[None], y=[None], mode="markers", name=colors.ORIGIN_LABEL[origin],
            marker=dict(symbol="square", size=12, color=colors.ORIGIN[origin])))
    later = [(p, w) for p, w, c in zip(pos, widths, cs) if step is not None and c.round > step]
    data.append(dict(                                   # drawn over the cells: tokens not generated yet
        type="bar", orientation="h", base=[x for (x, _), _ in later] or [None],
        x=[w - 0.15 for _, w in later] or [None], y=[r for (_, r), _ in later] or [None], width=0.8,
        marker=dict(color=NOT_YET, line=dict(width=0)), name="not generated yet", showlegend=False,
        hovertemplate=f"not generated yet at {step_title(trace, step) if step is not None else ''}<extra></extra>"))
    rows = (pos[-1][1] + 1) if pos else 1
    return dict(data=data, title=strip_title(trace, step), height=50 + 26 * rows,
                xaxis=bare_axis(range=[-0.5, line + 0.5]), yaxis=bare_axis(autorange="reversed"))


def token_strip(trace: Trace, step: int | None = None, line: int = 64, prompt_tail: int = 24) -> go.Figure:
    """The output as coloured cells, wrapped at `line` characters. With `step` (a round index) that
    round's tokens are outlined and later rounds' covered: what had been generated by then.
    Traces: 0 the cells, 1 the outline, 2.. legend entries, last the cover."""
    p = strip_parts(trace, step, line, prompt_tail)
    return go.Figure(p["data"], dict(
        barmode="overlay", height=p["height"] + 80, margin=dict(l=10, r=10, t=40, b=50), title=p["title"],
        plot_bgcolor="white", xaxis=p["xaxis"], yaxis=p["yaxis"],
        # under the strip: beside the title, a long title ran into it
        legend=dict(orientation="h", y=0, yanchor="top", x=0, itemsizing="constant")))


def outline(cells_: list[tuple[tuple[int, int], int]]) -> tuple[list, list]:
    """Rectangle outlines around cells, as one None-separated polyline."""
    xs, ys = [], []
    for (x, row), w in cells_:
        x0, x1, y0, y1 = x - 0.1, x + w - 0.05, row - 0.45, row + 0.45
        xs += [x0, x1, x1, x0, x0, None]
        ys += [y0, y0, y1, y1, y0, None]
    return xs or [None], ys or [None]


def strip_title(trace: Trace, step: int | None) -> str:
    t = trace.totals
    head = f"{trace.method}: {t.new_tokens} new tokens, {t.target_forwards} target forwards, tau {t.tau:.2f}"
    if step is None:
        return head
    r = trace.rounds[step]
    return head + f"  |  {step_title(trace, step)}: {len(r.accepted)} accepted + {r.emitted_kind}"
