"""The attention mask a step's forward used: who may look at whom.

    mask_figure(trace, step)    a grid, a row per query token and a column per key token: the
                                tree mask of a speculative round's verify, or the mask of a
                                masked-diffusion step (block-causal for a block-diffusion LM such as
                                smollm2-dllm, fully bidirectional otherwise)
    tree_mask(parents)          (n+1) x (n+1) visibility of a draft tree's verify, pure Python
    block_mask(G, B, causal)    G x G visibility of a canvas of G slots in blocks of B

Speculative round: the verify runs the last committed token (x0) and every draft node in one
forward. Every row sees the cached context (one column, "context"), x0, and its own ancestors: a
node never sees its siblings, so one forward scores every branch as if it were alone (the rule of
models.geometry.tree_attention, recomputed here from the trace so a view needs no model).

Diffusion step: a slot of block b sees the prompt (one column), every slot of blocks before b
(committed text, cached) and every slot of its own block, masked or not (bidirectional inside the
block); later blocks are hidden (models.geometry.block_visible). A whole-canvas dLLM has one block.
The rows this step ran (the active block) are drawn in full colour, the others pale.

Like every speclab figure: traces only, a fixed number of them (the grid, then legend swatches) and
a height fixed over the run, so a player can move it in place.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures._util import check_step, tok
from speclab.figures.diffusion import gen_length
from speclab.figures.steps import step_title
from speclab.metrics import n_steps
from speclab.trace import ACCEPTED, Trace

# what a cell shows: its code in the grid, its colour, its legend entry
CELLS = (("hidden", "#ffffff", "hidden"),
         ("idle", "#eeeeee", "visible (a row this step did not run)"),
         ("clean", "#7fb3ff", "visible: context / committed text"),
         ("masked", "#f4a259", "visible: a masked slot"),
         ("accepted", "#8fd19e", "visible: a draft token, accepted"),
         ("draft", "#c9c9c9", "visible: a draft token, not accepted"))
CODE = {name: i for i, (name, _, _) in enumerate(CELLS)}
CELL_PX = 18


def tree_mask(parents: list[int]) -> list[list[bool]]:
    """Visibility among x0 (row / column 0) and the draft nodes 1..n (node i has parent parents[i],
    -1 = x0): a row sees x0, its ancestors and itself."""
    n = len(parents)
    vis = [[False] * (n + 1) for _ in range(n + 1)]
    for q in range(n + 1):
        vis[q][0] = True
        k = q - 1
        while k >= 0:
            vis[q][k + 1] = True
            k = parents[k]
    return vis


def block_mask(G: int, B: int, causal: bool = True) -> list[list[bool]]:
    """Visibility among the G slots of a canvas: block-causal in blocks of B (a slot sees earlier
    blocks and its own), or everything when causal is False."""
    return [[(not causal) or k // B <= q // B for k in range(G)] for q in range(G)]


def _square(codes: list[list[int]], rows: list[str], cols: list[str], hover: list[list[str]], title: str,
            size: int) -> dict:
    colorscale = []
    for i, (_, color, _) in enumerate(CELLS):      # one flat band per code
        lo, hi = i / len(CELLS), (i + 1) / len(CELLS)
        colorscale += [[lo, color], [hi, color]]
    grid = dict(type="heatmap", z=codes, x=list(range(len(codes[0]))), y=list(range(len(codes))), zmin=-0.5,
                zmax=len(CELLS) - 0.5, colorscale=colorscale, showscale=False, xgap=1, ygap=1, name="mask",
                text=hover, hovertemplate="%{text}<extra></extra>")
    legend = [dict(type="scatter", x=[None], y=[None], mode="markers", name=label,
                   marker=dict(symbol="square", size=12, color=color, line=dict(color="#999999", width=1)))
              for _, color, label in CELLS]
    axis = lambda labels, **kw: dict(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels,
                                     showgrid=False, zeroline=False, tickfont=dict(family="monospace", size=11), **kw)
    # cells at least CELL_PX high (a small tree's grid would be a sliver), the whole grid at most 720 px
    area = min(max(CELL_PX * size, 180), 720)
    layout = dict(title=dict(text=title, y=1, yanchor="top", pad=dict(t=14)), plot_bgcolor="white", height=area + 260,
                  margin=dict(l=130, r=10, t=150, b=110),
                  legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0, itemsizing="constant"),
                  xaxis=axis(cols, range=[-0.5, size - 0.5], tickangle=-45),
                  yaxis=axis(rows, range=[size - 0.5, -0.5]))
    return dict(data=[grid] + legend, layout=layout)


def _round_mask(trace: Trace, step: int, size: int) -> dict:
    r = trace.rounds[step]
    before = list(trace.prompt_ids) + [t for q in trace.rounds[:step] for t in q.tokens]
    x0 = before[-1] if before else None
    nodes = sorted(r.nodes, key=lambda n: n.id)
    index = {n.id: i for i, n in enumerate(nodes)}
    parents = [index.get(n.parent, -1) for n in nodes]
    vis = tree_mask(parents)
    on_path = set(r.accepted)
    x0_text = tok(trace, x0) if x0 is not None else "∅"
    names = [f"x0 {x0_text}"] + [f"{n.id}: {tok(trace, n.token)}" for n in nodes]
    key_code = [CODE["clean"]] + [CODE["accepted"] if n.id in on_path or n.decision == ACCEPTED else CODE["draft"]
                                  for n in nodes]
    codes, hover = [], []
    for q in range(len(names)):
        row = [CODE["clean"]] + [key_code[k] if vis[q][k] else CODE["hidden"] for k in range(len(names))]
        words = [f"{names[q]} sees the {len(before) - 1} cached tokens before x0"] + [
            f"{names[q]} {'sees' if vis[q][k] else 'does not see'} {names[k]}" for k in range(len(names))]
        codes.append(row + [CODE["hidden"]] * (size - len(row)))
        hover.append(words + [""] * (size - len(words)))
    cols = [f"context ({max(len(before) - 1, 0)})"] + names
    title = (f"{step_title(trace, step)}: the verify's tree mask, {len(nodes)} draft token(s) + x0 in one forward"
             "<br><span style='font-size:12px'>each row sees the context, x0 and its own ancestors, "
             "never a sibling branch; row = the token that looks, column = the token it sees</span>")
    return _square(codes, names, cols, hover, title, size)


def _denoise_mask(trace: Trace, step: int) -> dict:
    s = trace.denoise[step]
    G = gen_length(trace)
    causal = bool(trace.params.get("block_causal"))
    B = int(trace.params.get("block_length") or G) if causal else G
    vis = block_mask(G, B, causal)
    lo, hi = s.block
    masked = set(s.masked)
    ran = range(lo, hi) if causal else range(G)          # the rows this step's forward computed
    names = [f"{p}" for p in range(G)]
    codes, hover = [], []
    for q in range(G):
        row, words = [CODE["clean"] if q in ran else CODE["idle"]], [f"slot {q} sees the prompt"]
        for k in range(G):
            if not vis[q][k]:
                row.append(CODE["hidden"])
                words.append(f"slot {q} does not see slot {k} (a later block)")
                continue
            row.append(CODE["idle"] if q not in ran else CODE["masked"] if k in masked else CODE["clean"])
            what = "masked" if k in masked else f"<b>{tok(trace, s.tokens[k])}</b>" if k < len(s.tokens) else ""
            words.append(f"slot {q} sees slot {k} ({what})")
        codes.append(row)
        hover.append(words)
    kind, why = ((f"block-causal, blocks of {B}", "a slot sees the prompt, earlier blocks and its whole block")
                 if causal else ("bidirectional", "every slot sees every slot"))
    title = (f"{step_title(trace, step)}: the attention mask ({kind})"
             f"<br><span style='font-size:12px'>{why}; rows in colour ran this step (slots {lo}..{hi - 1}); "
             "row = the slot that looks, column = the slot it sees</span>")
    return _square(codes, names, [f"prompt ({len(trace.prompt_ids)})"] + names, hover, title, G + 1)


def mask_size(trace: Trace) -> int:
    """The grid's side over the whole run (fixed, so stepping never resizes the figure)."""
    if trace.steps_row().canvas:
        return gen_length(trace) + 1
    return 2 + max((len(r.nodes) for r in trace.rounds), default=0)


def mask_dict(trace: Trace, step: int = 0) -> dict:
    """mask_figure as a plain {"data", "layout"} dict (what players and frames update from)."""
    if not (trace.steps_row().verify or trace.steps_row().canvas):
        raise ValueError(f"a {trace.engine} run has no attention mask to show (a DAG decodes in one forward "
                         "over its own graph): mask views are for speculative and diffusion runs")
    step = check_step(trace, step, n_steps(trace))
    d = _round_mask(trace, step, mask_size(trace)) if trace.steps_row().verify else _denoise_mask(trace, step)
    d["layout"]["meta"] = dict(step=step, steps=n_steps(trace), engine=trace.engine)
    return d


def mask_figure(trace: Trace, step: int = 0) -> go.Figure:
    """The attention mask of step `step` (0-based): see the module docstring."""
    return go.Figure(mask_dict(trace, step))
