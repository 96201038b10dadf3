"""Masked-diffusion runs: the canvas at one step, the order the text was written in, and the
confidence over the whole run.

Positions are generation coordinates 0..G-1 (G = params["gen_length"]). Each DenoiseStep lists
the positions masked BEFORE the step with the model's proposal for each (top-1 token, its
probability = "confidence", the top-1/top-2 margin) and the positions the policy committed.

    canvas_figure(trace, step)     the canvas after `step`: a cell per position coloured by state
                                   (committed earlier / this step / still masked; a masked slot
                                   shows its proposal and confidence in place, its grey deepening
                                   to blue as the confidence grows; a committed token rewritten or
                                   taken back this step has a colour of its own and a mark), over
                                   the confidence of every position masked before the step; the
                                   active block shaded, the policy's threshold as a line
    decoding_order(trace, step)    position x step heatmap of confidence with a marker where each
                                   position was committed (and, for a policy that edits, a cross
                                   where it was rewritten or taken back); `step` draws a line
                                   across that row
    confidence_bands(trace, step)  min / median / max confidence over masked positions per step,
                                   and tokens committed per step; `step` marked

Like every speclab figure: traces only, and the same traces at every step (a player updates them
in place, an export animates them). `step` arguments are 0-based indices into `trace.denoise`;
what the figures show (titles, hovers, step axes) counts steps from 1, like the export's slider.
"""
from __future__ import annotations

import html
import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from speclab.figures import colors
from speclab.figures._util import bare_axis, check_step, num, per_position, show_token, tok
from speclab.trace import MASK, DenoiseStep, Trace, TraceError

# -- reading a diffusion trace ---------------------------------------------------------------------
def denoise_steps(trace: Trace) -> list[DenoiseStep]:
    if not trace.steps_row().canvas:
        raise TraceError(f"this is a {trace.engine} trace; diffusion figures need a trace that denoises a canvas")
    return trace.denoise


def gen_length(trace: Trace) -> int:
    G = trace.params.get("gen_length")
    return int(G) if G else (len(trace.denoise[0].tokens) if trace.denoise else 0)


def prob_threshold(trace: Trace, s: DenoiseStep) -> float | None:
    """The step's threshold when it is on the confidence scale (the step says so), else None:
    Prophet and SchED threshold a logit gap, and Fast-dLLM's factor rule a bound that depends on
    the rank."""
    if s.threshold is None or s.threshold_scale != "probability":
        return None
    return s.threshold if 0 < s.threshold <= 1 else None


def commit_steps(trace: Trace) -> list[int | None]:
    """Per position, the step that committed it (None: never, e.g. after the end of text)."""
    at: list[int | None] = [None] * gen_length(trace)
    for i, s in enumerate(trace.denoise):
        for p in s.committed:
            at[p] = i
    return at


def label(trace: Trace, token: int | None) -> str:
    """A cell's text: whitespace visible, end of text short enough to fit a cell; "?" where the
    step did not record the token."""
    if token is None:
        return "?"
    return "EOS" if token == trace.params.get("eos_id") else show_token(trace.text_of(token))


def canvas_token(s: DenoiseStep, p: int) -> int | None:
    """The token at position p after step s (None: the step did not record its canvas)."""
    return s.tokens[p] if p < len(s.tokens) else None


NO_PROPOSAL = (None, None, None)        # (top-1, confidence, margin) of a slot the step did not record


CANVAS_PX, CHAR_PX = 1000, 7.5    # a canvas about 1000 px wide; a monospace character at 12 px


ROW = 1.3          # a canvas row's pitch in data units (cells are 1 high)


def canvas_rows(trace: Trace) -> tuple[int, bool]:
    """(slots per canvas row, vertical text), fixed for the whole run. One row when the tokens fit
    their cells lying down (the median token; plotly shrinks longer ones): a 24-slot canvas of digits;
    else rows of 16 slots, where ~7 characters fit upright (a chat answer's words on a projector);
    the text turns only when even that is too narrow."""
    G = gen_length(trace)
    final = trace.denoise[-1].tokens if trace.denoise else []
    sizes = sorted(len(label(trace, t)) for t in final) or [0]
    longest = sizes[len(sizes) // 2]            # the typical token; a longer one shrinks to fit its cell
    fits = lambda width: longest * CHAR_PX <= 0.9 * CANVAS_PX / max(width, 1)
    if fits(G):
        return G, False
    W = 16 if G > 16 and G % 16 == 0 else G
    return W, not fits(W)


def rotated(trace: Trace) -> bool:
    """Vertical cell text: only where the longest token cannot lie in its cell (see canvas_rows)."""
    return canvas_rows(trace)[1]


def row_shade(lo: int, hi: int, W: int) -> tuple[list, list]:
    """The outline of slots [lo, hi) on a canvas of W slots a row: one rectangle per row it
    touches, separated by None (plotly fills each closed piece)."""
    xs, ys = [], []
    for r in range(lo // W, (hi - 1) // W + 1):
        a, b = max(lo, r * W) - r * W - 0.5, min(hi, (r + 1) * W) - r * W - 0.5
        y0, y1 = -r * ROW - 0.12, -r * ROW + 1.12
        xs += ([None] if xs else []) + [a, b, b, a, a]
        ys += ([None] if ys else []) + [y0, y0, y1, y1, y0]
    return xs, ys


def step_note(trace: Trace, s: DenoiseStep) -> str:
    """What the policy decided, in a few words: threshold, forced or early-exit commits, gaps."""
    parts = []
    if s.threshold is not None:
        parts.append(f"threshold {s.threshold:.3g}")
    if s.info.get("forced"):
        parts.append("forced (nothing passed)")
    if s.info.get("finish"):
        parts.append("early exit: every mask committed")
    for key, name in (("gap", "gap"), ("g", "mean margin"), ("entropy_bound", "entropy bound"),
                      ("temperature", "temperature"), ("mean_entropy", "mean entropy")):
        if key in s.info:
            parts.append(f"{name} {num(s.info[key], 3)}")
    if s.info.get("stable"):
        parts.append("argmax stable")
    if s.edits:
        back = sum(e.after == MASK for e in s.edits)
        parts.append(f"{len(s.edits)} edited" + (f" ({back} taken back)" if back else ""))
    if "post_edit_step" in s.info:
        parts.append(f"post-edit step {s.info['post_edit_step']}")
    if s.info.get("block_done"):
        parts.append(f"block done: {s.info['block_done']}")
    return ", ".join(parts)


def is_noise(trace: Trace) -> bool:
    """A DiffusionGemma trace: the canvas holds random tokens where a mask-based one holds masks."""
    return trace.params.get("canvas") == "noise"


def canvas_state(trace: Trace, s: DenoiseStep, p: int, now: set, before: set, edited: dict | None = None) -> str:
    if edited and p in edited:                      # a committed token revised this step
        return "remasked" if edited[p].after == MASK else "rewritten"
    if p in now:
        return "now"
    if p not in before:
        return "earlier"
    if is_noise(trace) and s.block[0] <= p < s.block[1]:
        return "noise" if p in s.remasked else "sampled"
    return "masked"


# -- (a) the canvas at one step --------------------------------------------------------------------
def cell_hover(trace: Trace, s: DenoiseStep, p: int, state: str, at: int | None, prop: dict,
               edited: dict | None = None) -> str:
    head = f"position {p}"
    if state in ("rewritten", "remasked"):
        e = edited[p]
        why = f"<br>{html.escape(e.reason)}" if e.reason else ""
        if state == "remasked":
            return f"{head}: taken back this step (masked again); it held <b>{tok(trace, e.before)}</b>{why}"
        return (f"{head}: <b>{tok(trace, e.after)}</b> (id {e.after}), rewritten this step; "
                f"it held <b>{tok(trace, e.before)}</b>{why}")
    if state in ("noise", "sampled"):
        t, c, m = prop.get(p, NO_PROPOSAL)
        what = ("a random token, re-noised this step" if state == "noise"
                else "the sampled token, kept: its entropy fit under the bound")
        return (f"{head}: <b>{tok(trace, canvas_token(s, p))}</b>, {what}<br>argmax proposal <b>{tok(trace, t)}</b> "
                f"p={num(c)} margin={num(m)}")
    if state == "masked":
        t, c, m = prop.get(p, NO_PROPOSAL)
        where = "" if s.block[0] <= p < s.block[1] else " (outside the active block)"
        return f"{head}: still masked{where}<br>proposal <b>{tok(trace, t)}</b> p={num(c)} margin={num(m)}"
    text = f"{head}: <b>{tok(trace, canvas_token(s, p))}</b> (id {canvas_token(s, p)})"
    if state == "now":
        _, c, m = prop.get(p, NO_PROPOSAL)
        return text + f"<br>committed this step, p={num(c)} margin={num(m)}"
    return text + (f"<br>committed at step {at + 1}" if at is not None else "")


def shows_proposal(trace: Trace, s: DenoiseStep, p: int) -> bool:
    """A masked slot has a proposal to show where this step's forward computed it: every masked
    slot of a whole-canvas dLLM, the active block's of a block-diffusion one (later blocks are not
    run, so their rows hold nothing)."""
    return p in s.masked and (not trace.params.get("block_causal") or s.block[0] <= p < s.block[1])


def masked_text(trace: Trace, s: DenoiseStep, p: int, prop: dict) -> str:
    """A masked slot's cell: the proposal in grey italics over its confidence, in place, as it
    unmasks (empty where the step proposed nothing for it)."""
    t, c, _ = prop.get(p, NO_PROPOSAL)
    if not shows_proposal(trace, s, p) or t is None or c is None:
        return ""
    return f"<span style='color:#555555'><i>{label(trace, t)}</i><br>{c:.2f}</span>"


def masked_color(prop: dict, p: int) -> str:
    """A masked slot's colour: the masked grey deepening towards the confidence bars' blue as the
    model grows sure of its proposal (confidence 0 -> grey, 1 -> the bars' blue)."""
    c = max(0.0, min(1.0, float(prop.get(p, NO_PROPOSAL)[1] or 0.0)))
    grey, blue = (0xe3, 0xe3, 0xe3), (0x7f, 0xb3, 0xff)
    return "#" + "".join(f"{round(g + (b - g) * c):02x}" for g, b in zip(grey, blue))


def has_edits(trace: Trace) -> bool:
    return any(s.edits for s in trace.denoise)


def edit_text(trace: Trace, token: int) -> str:
    return "mask" if token == MASK else f"<b>{tok(trace, token)}</b>"


def edits_trace(trace: Trace, s: DenoiseStep, W: int) -> dict:
    """The step's edits as marks in the corner of their cells: a committed token taken back
    (re-masked) or rewritten, with the reason in the hover."""
    es = s.edits
    return dict(
        type="scatter", x=[e.pos % W + 0.32 for e in es] or [None], y=[-(e.pos // W) * ROW + 0.82 for e in es] or [None],
        mode="markers", name="edited this step: rewritten (purple cell) or taken back (pink)",
        marker=dict(symbol="x", size=9, color=colors.THRESHOLD, line=dict(width=1, color="white")),
        hovertext=[f"position {e.pos}: {edit_text(trace, e.before)} &rarr; {edit_text(trace, e.after)}"
                   + (f"<br>{html.escape(e.reason)}" if e.reason else "") for e in es],
        hovertemplate="%{hovertext}<extra></extra>")


def canvas_dict(trace: Trace, step: int = 0, static: bool = True) -> dict:
    """The canvas view as a plain {"data", "layout"} dict. Traces: 0 block shade (cells), 1 the
    cells, 2 block shade (bars), 3 confidence bars, 4 threshold, 5.. legend entries (None when
    static=False: they never change), then, for a run whose policy edits, the step's edits."""
    steps = denoise_steps(trace)
    step = check_step(trace, step, len(steps))
    s, G, n = steps[step], gen_length(trace), len(steps)
    (lo, hi), at = s.block, commit_steps(trace)
    prop = {p: (t, c, m) for p, t, c, m in zip(s.masked, s.top1, s.conf, s.margin)}
    now, before, edited = set(s.committed), set(s.masked), {e.pos: e for e in s.edits}
    state = [canvas_state(trace, s, p, now, before, edited) for p in range(G)]
    palette = {**colors.CANVAS, **colors.NOISE, **colors.EDIT}
    W, vertical = canvas_rows(trace)
    rows = -(-G // W)
    shade = lambda xy, axes: dict(
        type="scatter", x=xy[0], y=xy[1],
        mode="lines", fill="toself", fillcolor=colors.BLOCK_FILL, line=dict(color=colors.BLOCK_LINE, width=1),
        name="active block", showlegend=axes == "", hoverinfo="skip",
        xaxis="x" + axes, yaxis="y" + axes)
    bar_block = ([lo - 0.5, hi - 0.5, hi - 0.5, lo - 0.5, lo - 0.5], [0, 0, 1.05, 1.05, 0])
    cells = dict(
        type="bar", x=[p % W for p in range(G)], y=[1] * G, base=[-(p // W) * ROW for p in range(G)],
        width=0.92, name="canvas", showlegend=False,
        text=[masked_text(trace, s, p, prop) if st == "masked" else f"<i>{label(trace, canvas_token(s, p))}</i>"
              if st == "noise" else f"<i>{label(trace, edited[p].before)}</i>" if st == "remasked"
              else label(trace, canvas_token(s, p)) for p, st in enumerate(state)],
        textposition="inside", insidetextanchor="middle", textangle=-90 if vertical else 0,
        textfont=dict(family="monospace", size=12),
        marker=dict(color=[masked_color(prop, p) if st == "masked" and shows_proposal(trace, s, p) else palette[st]
                           for p, st in enumerate(state)], line=dict(width=0)),
        hovertext=[cell_hover(trace, s, p, st, at[p], prop, edited) for p, st in enumerate(state)],
        hovertemplate="%{hovertext}<extra></extra>", customdata=state)
    entropy = per_position(s.info, "entropy", len(s.masked))
    bars = dict(
        type="bar", x=list(s.masked), y=list(s.conf), width=0.8, name="confidence of masked positions",
        showlegend=False,       # its own legend entries below: a bar's swatch took the first bar's colour
        text=[label(trace, t) for t in s.top1], textposition="auto", textangle=-90 if vertical else 0,
        textfont=dict(family="monospace", size=11),
        marker=dict(color=[colors.PROPOSAL["now" if p in now else "block" if lo <= p < hi else "outside"]
                           for p in s.masked], line=dict(width=0)),
        hovertext=[f"position {p}: proposal <b>{tok(trace, t)}</b><br>p={num(c)} margin={num(m)}"
                   + (f" entropy={num(entropy[i])}" if entropy else "") + ("<br>committed" if p in now else "")
                   for i, (p, t, c, m) in enumerate(zip(s.masked, s.top1, s.conf, s.margin))],
        hovertemplate="%{hovertext}<extra></extra>", xaxis="x2", yaxis="y2")
    thr = prob_threshold(trace, s)
    line = dict(type="scatter", x=[-0.5, G - 0.5] if thr is not None else [None],
                y=[thr, thr] if thr is not None else [None], mode="lines", name="threshold",
                line=dict(color=colors.THRESHOLD, width=2, dash="dash"), showlegend=thr is not None,
                hovertemplate="threshold %{y:.3g}<extra></extra>", xaxis="x2", yaxis="y2")
    names = {**colors.CANVAS_LABEL, **(colors.NOISE_LABEL if is_noise(trace) else {})}
    swatches = [(names[k], palette[k]) for k in names] + [
        (label, colors.PROPOSAL[k]) for k, label in colors.PROPOSAL_LABEL.items()]
    legend = [None if not static else dict(
        type="scatter", x=[None], y=[None], mode="markers", name=name,
        marker=dict(symbol="square", size=12, color=color)) for name, color in swatches]
    h1, h2, gap = (110 if vertical else 50) * rows, 220, 45
    area = h1 + gap + h2
    note = step_note(trace, s)
    if is_noise(trace):
        kept = s.info.get("accepted")           # free-form: a list of positions where DiffusionGemma wrote it
        title = (f"{trace.method}: step {step + 1}/{n}, block [{lo}, {hi}): "
                 + (f"block committed (its argmax), {len(now)} tokens" if now else
                    f"{len(kept) if isinstance(kept, list) else 0} samples kept, {len(s.remasked)} slots re-noised"))
    else:
        title = (f"{trace.method}: step {step + 1}/{n}, block [{lo}, {hi}): committed {len(now)}, "
                 f"{len(before) - len(now) + len(s.remasked)} still masked"
                 + (f", edited {len(s.edits)}" if s.edits else ""))
    title += f"<br><span style='font-size:12px'>{note}</span>" if note else ""
    xr = [-0.6, G - 0.4]
    layout = dict(
        title=dict(text=title), height=area + 180, plot_bgcolor="white", barmode="overlay",
        margin=dict(l=55, r=10, t=80, b=100),       # each text shrinks to fit its own cell
        legend=dict(orientation="h", y=-70 / area, yanchor="top", x=0, itemsizing="constant"),
        xaxis=bare_axis(range=[-0.6, W - 0.4], domain=[0, 1], anchor="y"),
        yaxis=bare_axis(range=[-(rows - 1) * ROW - 0.15, 1.15], domain=[(h2 + gap) / area, 1], anchor="x"),
        xaxis2=dict(range=xr, domain=[0, 1], anchor="y2", showgrid=False, zeroline=False,
                    title=dict(text="position"), dtick=max(1, G // 16)),
        yaxis2=dict(range=[0, 1.05], domain=[0, h2 / area], anchor="x2", gridcolor="#eeeeee",
                    title=dict(text="confidence p(top-1)")),
        meta=dict(step=step, steps=n, engine=trace.engine))
    data = [shade(row_shade(lo, hi, W), ""), cells, shade(bar_block, "2"), bars, line] + legend
    data += [edits_trace(trace, s, W)] if has_edits(trace) else []
    return dict(data=data, layout=layout)


def canvas_figure(trace: Trace, step: int = 0) -> go.Figure:
    """The canvas after `step` over the confidence of the positions masked before it."""
    return go.Figure(canvas_dict(trace, step))


# -- (b) the decoding order ------------------------------------------------------------------------
def decoding_order(trace: Trace, step: int | None = None) -> go.Figure:
    """Confidence per (position, step) while the position is masked, blank once committed; a
    marker where each position was committed, so the map reads as the order of writing.
    x = position (as in the canvas view), y = step, downwards. Traces: 0 heatmap, 1 commits,
    2 block bounds, 3 current step, then, for a policy that edits, 4 its edits."""
    steps = denoise_steps(trace)
    step = check_step(trace, step, len(steps)) if step is not None else None
    G, S = gen_length(trace), len(steps)
    z: list[list[float | None]] = [[None] * G for _ in range(S)]     # (S, G)
    for i, s in enumerate(steps):
        for p, c in zip(s.masked, s.conf):
            z[i][p] = c
    marks = [(p, i + 1, canvas_token(s, p), dict(zip(s.masked, s.conf)).get(p))          # steps from 1
             for i, s in enumerate(steps) for p in s.committed]
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        x=list(range(G)), y=list(range(1, S + 1)), z=z, zmin=0, zmax=1, colorscale="Blues", name="confidence",
        hoverongaps=False,
        colorbar=dict(title=dict(text="p(top-1)"), thickness=12, len=0.8),
        hovertemplate="position %{x}, step %{y}: masked, confidence %{z:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[m[0] for m in marks], y=[m[1] for m in marks], mode="markers+text" if G <= 32 else "markers",
        name="committed", text=[label(trace, m[2]) for m in marks], textposition="middle right",
        textfont=dict(family="monospace", size=10),
        marker=dict(symbol="circle", size=9 if G <= 64 else 5, color=colors.CANVAS["now"],
                    line=dict(color="#333333", width=1)),
        hovertext=[f"position {p} committed at step {i}: <b>{tok(trace, t)}</b> p={num(c)}" for p, i, t, c in marks],
        hovertemplate="%{hovertext}<extra></extra>"))
    B = int(trace.params.get("block_length") or G)
    bx, by = [], []
    for b in range(B, G, B):                                         # inner block boundaries
        bx += [b - 0.5, b - 0.5, None]
        by += [0.5, S + 0.5, None]
    fig.add_trace(go.Scatter(x=bx or [None], y=by or [None], mode="lines", name="block boundary",
                             line=dict(color=colors.BLOCK_LINE, width=1, dash="dot"), hoverinfo="skip",
                             showlegend=bool(bx)))
    fig.add_trace(go.Scatter(x=[-0.5, G - 0.5] if step is not None else [None],
                             y=[step + 1, step + 1] if step is not None else [None], mode="lines", name="current",
                             line=dict(color=colors.CURRENT, width=2), hoverinfo="skip", showlegend=False))
    if has_edits(trace):
        es = [(e, i + 1) for i, s in enumerate(steps) for e in s.edits]
        fig.add_trace(go.Scatter(
            x=[e.pos for e, _ in es], y=[i for _, i in es], mode="markers", name="rewritten or taken back",
            marker=dict(symbol="x", size=9 if G <= 64 else 6, color=colors.THRESHOLD,
                        line=dict(width=1, color="white")),
            hovertext=[f"position {e.pos} at step {i}: {edit_text(trace, e.before)} &rarr; {edit_text(trace, e.after)}"
                       + (f"<br>{html.escape(e.reason)}" if e.reason else "") for e, i in es],
            hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(
        title=f"decoding order: {len(marks)} positions committed in {S} steps", plot_bgcolor="white",
        height=min(700, max(260, 120 + 16 * S)), margin=dict(l=50, r=10, t=50, b=40),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        xaxis=dict(title="position", range=[-0.5, G - 0.5], showgrid=False, zeroline=False),
        yaxis=dict(title="step", range=[S + 0.5, 0.5], showgrid=False, zeroline=False))
    return fig


# -- (c) confidence over the run -------------------------------------------------------------------
def confidence_bands(trace: Trace, step: int | None = None) -> go.Figure:
    """Per step: min / median / max confidence over the positions masked before it (the band),
    the threshold where it is a probability, and below, tokens committed. Traces: 0 max, 1 min
    (filled to max), 2 median, 3 threshold, 4 current step, 5 commits per step."""
    steps = denoise_steps(trace)
    step = check_step(trace, step, len(steps)) if step is not None else None
    xs = list(range(1, len(steps) + 1))                          # steps from 1
    lo = [min(s.conf) if s.conf else None for s in steps]
    hi = [max(s.conf) if s.conf else None for s in steps]
    mid = [statistics.median(s.conf) if s.conf else None for s in steps]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.06)
    band = dict(color=colors.PROPOSAL["block"], width=0.5)
    fig.add_trace(go.Scatter(x=xs, y=hi, mode="lines", line=band, name="max", showlegend=False,
                             hovertemplate="step %{x}: max %{y:.3f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=xs, y=lo, mode="lines", line=band, fill="tonexty",
                             fillcolor="rgba(127,179,255,0.35)", name="min-max over masked",
                             hovertemplate="step %{x}: min %{y:.3f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=xs, y=mid, mode="lines+markers", name="median",
                             line=dict(color=colors.VERIFY_TIME, width=2), marker=dict(size=4),
                             hovertemplate="step %{x}: median %{y:.3f}<extra></extra>"), row=1, col=1)
    thr = [prob_threshold(trace, s) for s in steps]
    fig.add_trace(go.Scatter(x=xs, y=thr, mode="lines", name="threshold",
                             showlegend=any(t is not None for t in thr),
                             line=dict(color=colors.THRESHOLD, dash="dash", width=1.5),
                             hovertemplate="step %{x}: threshold %{y:.3g}<extra></extra>"), row=1, col=1)
    here = step is not None
    fig.add_trace(go.Scatter(x=[step + 1, step + 1] if here else [None], y=[0, 1.05] if here else [None], mode="lines",
                             line=dict(color=colors.CURRENT, width=2), name="current", hoverinfo="skip",
                             showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=xs, y=[len(s.committed) for s in steps], name="committed",
                         marker_color=[colors.THRESHOLD if s.info.get("finish") else colors.CANVAS["now"]
                                       for s in steps],       # red: an early exit committed every mask
                         customdata=[", ".join(label(trace, canvas_token(s, p)) for p in s.committed) for s in steps],
                         hovertemplate="step %{x}: %{y} committed: %{customdata}<extra></extra>"), row=2, col=1)
    t = trace.totals
    fig.update_yaxes(range=[0, 1.05], title_text="confidence", gridcolor="#eeeeee", row=1, col=1)
    fig.update_yaxes(title_text="committed", gridcolor="#eeeeee", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(range=[0.4, len(xs) + 0.6], showgrid=False)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(title=f"{trace.method}: {len(steps)} steps, {t.new_tokens} tokens "
                            f"({t.tau:.2f} per forward)", height=360, plot_bgcolor="white", bargap=0.1,
                      margin=dict(l=55, r=10, t=50, b=40),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    return fig
