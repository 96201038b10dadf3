"""Static export: one self-contained HTML file to step through a saved run, offline.

    speclab export run.json --html out.html
    speclab.export.to_html(trace, "out.html")

plotly.js is embedded inline (nothing is fetched from a CDN, so the file opens offline and years
later). What it holds is the trace's view spec (figures.views.view_of), the same the Jupyter
player and the dashboard read: each step figure (the main one first: token strip over draft tree,
the diffusion canvas, the DAG; then any other, such as a policy's decisions or a method's own) is
one figure with a frame per step and a slider (plus play / pause); frames carry only the traces
that change, so a long run stays a reasonable size. Under them: the run strip and the summary
figures, drawn for the whole run. No model is loaded: everything comes from the trace.

A spec drawn anew at each step (the step's detail table, p and q, the attention mask) is one panel
per step, the current step's shown; a folded one (the mask) sits in a <details> element, and is
left out, with a note, where its panels would make the file large. The arrow keys step every step
figure and panel together (Home / End: the first / last step), and the page opens on the first step
that drafted (a feature drafter's first round has no draft yet).

The run's lesson (its engine View's, figures.lessons) opens the page as a handout: a card with
back / next buttons (and Page Up / Page Down, a presenter's clicker) that says each step in a
sentence and moves every figure to the step it talks about, offline like the rest.
"""
from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

import plotly.io as pio

from speclab.figures import n_steps, step_label, step_names, view_of
from speclab.figures.views import FigureSpec, lesson_of
from speclab.trace import Trace, TraceError

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}} td{{padding:0 1em 0 0}}
code{{background:#f3f3f3;padding:0 .3em}}</style></head>
<body data-start="{start}"><h2>{title}</h2>{stats}
<p style="color:#555;font-size:90%">&larr; / &rarr; step through the run (Home / End: first / last step).</p>
{lesson}{figures}{keys}</body></html>
"""
# the lesson card: its steps as JSON, stepped by its buttons and by Page Up / Down; each step moves the
# figures (the KEYS script's go(), exposed as window.speclabGo) to the step it talks about
LESSON = """<div class="speclab-lesson" style="border:1px solid #ccc;border-radius:6px;padding:.6em 1em;margin:1em 0">
<b>Lesson</b> <small>(back / next, or Page Up / Page Down)</small><br>
<button class="speclab-lesson-back">&lt; back</button> <button class="speclab-lesson-next">next &gt;</button>
<div class="speclab-lesson-text" style="margin-top:.5em"></div></div>
<script type="application/json" id="speclab-lesson-steps">{steps}</script>
<script>(function(){{
const steps = JSON.parse(document.getElementById('speclab-lesson-steps').textContent);
let at = 0;
const esc = s => s.replace(/[&<>]/g, c => ({{'&': '&amp;', '<': '&lt;', '>': '&gt;'}})[c]);
function say(k, move = true) {{
  at = Math.max(0, Math.min(steps.length - 1, k));
  const s = steps[at];
  document.querySelector('.speclab-lesson-text').innerHTML = '<b>' + esc(s.title) + '</b> <small>(' + (at + 1) +
    ' of ' + steps.length + ')</small><br>' + esc(s.text);
  document.querySelector('.speclab-lesson-back').disabled = at === 0;
  document.querySelector('.speclab-lesson-next').disabled = at === steps.length - 1;
  if (move && window.speclabGo) window.speclabGo(s.round);
  document.body.dataset.lessonAt = at;
}}
document.querySelector('.speclab-lesson-back').onclick = () => say(at - 1);
document.querySelector('.speclab-lesson-next').onclick = () => say(at + 1);
document.addEventListener('keydown', e => {{
  if (e.key === 'PageDown') {{ e.preventDefault(); say(at + 1); }}
  if (e.key === 'PageUp') {{ e.preventDefault(); say(at - 1); }}
}});
window.addEventListener('load', () => say(0, false));   // the page keeps its opening step
}})();</script>"""
# the arrow keys move every step figure (and the p / q panel) to the same step
KEYS = """<script>(function(){
let cur = null;
const graphs = () => Array.from(document.querySelectorAll('.speclab-figure[data-steps] .plotly-graph-div'));
const show = k => document.querySelectorAll('.speclab-per-step').forEach(d => { d.style.display = (+d.dataset.step === k) ? '' : 'none'; });
function go(k) {
  const gs = graphs(); if (!gs.length) return;
  const n = +gs[0].closest('.speclab-figure').dataset.steps;
  cur = Math.max(0, Math.min(n - 1, k));
  gs.forEach(g => { Plotly.animate(g, [String(cur)], {mode: 'immediate', frame: {duration: 0, redraw: true},
                                                     transition: {duration: 0}});
                    Plotly.relayout(g, {'sliders[0].active': cur}); });
  show(cur);
}
window.speclabGo = go;
document.addEventListener('keydown', e => {
  if (e.target.matches && e.target.matches('input, textarea, select')) return;
  if (cur === null) cur = +document.body.dataset.start || 0;
  const to = {ArrowRight: cur + 1, ArrowLeft: cur - 1, Home: 0, End: Infinity}[e.key];
  if (to === undefined) return;
  e.preventDefault(); go(to);
});
window.addEventListener('load', () => {
  graphs().forEach(g => g.on && g.on('plotly_sliderchange', ev => { if (ev.step._index !== cur) go(ev.step._index); }));
  show(+document.body.dataset.start || 0);
});
})();</script>"""


def first_step(trace: Trace) -> int:
    """The step the page opens on: a verifying run's first round that drafted, else the first."""
    if trace.steps_row().verify:
        return next((k for k, r in enumerate(trace.rounds) if r.drafted), 0)
    return 0


def animated(trace: Trace, spec: FigureSpec | None = None, start: int = 0) -> dict:
    """A step figure (default: the main one) with one frame per step, a slider and play / pause
    buttons (a plain dict), opening on step `start`."""
    n = n_steps(trace)
    if not n:
        raise TraceError("this trace has no steps to show (a run recorded with no rounds or steps)")
    spec = spec or view_of(trace).main
    start = min(max(start, 0), n - 1)
    base = spec.at(trace, start)
    steps = [spec.at(trace, k, static=False) for k in range(n)]
    # traces identical in every step stay out of the frames (the token strip's cells, legend entries)
    moving = [i for i, t in enumerate(steps[0]["data"]) if t is not None]
    keys = [k for k in spec.moving_keys(base) if k in base["layout"]]
    frames = [dict(name=str(k), traces=moving, data=[s["data"][i] for i in moving],
                   layout={key: s["layout"][key] for key in keys if key in s["layout"]})
              for k, s in enumerate(steps)]
    go_to = lambda names, dur: [names, dict(mode="immediate", frame=dict(duration=dur, redraw=True),
                                            transition=dict(duration=0))]
    label, names = step_label(trace), step_names(trace)
    layout = dict(base["layout"])
    pad = max(60, legend_below(base) + 15)          # the slider goes under a legend drawn below the plot
    layout["height"] = layout.get("height", 400) + 30 + pad
    layout["margin"] = dict(layout.get("margin", {}), b=80 + pad)
    layout["sliders"] = [dict(active=start, y=0, yanchor="top", pad=dict(t=pad), currentvalue=dict(prefix=f"{label} "),
                              steps=[dict(method="animate", label=nm, args=go_to([str(k)], 0))
                                     for k, nm in enumerate(names)])]
    layout["updatemenus"] = [dict(type="buttons", direction="left", x=0, y=0, yanchor="top", xanchor="right",
                                  pad=dict(t=pad, r=10), showactive=False, buttons=[
                                      dict(label="play", method="animate", args=go_to(None, 700)),
                                      dict(label="pause", method="animate", args=go_to([None], 0))])]
    return dict(data=base["data"], layout=layout, frames=frames)


def legend_below(fig: dict) -> int:
    """Pixels below the plot area that a horizontal legend placed under it reaches (0: none there).
    Estimated: its offset, then a row of 24 px for every 3 entries (the export's full page width)."""
    lay = fig["layout"]
    leg = lay.get("legend") or {}
    y = leg.get("y")
    if lay.get("showlegend") is False or leg.get("orientation") != "h" or not isinstance(y, (int, float)) or y >= 0:
        return 0
    m = lay.get("margin") or {}
    plot_px = lay.get("height", 400) - m.get("t", 80) - m.get("b", 80)
    entries = sum(1 for t in fig["data"] if t is not None and t.get("name") and t.get("showlegend", True) is not False)
    return int(-y * plot_px) + 24 * -(-entries // 3)


def stats_table(trace: Trace) -> str:
    t = trace.totals
    prompt = "".join(trace.text_of(i) for i in trace.prompt_ids)
    output = "".join(trace.text_of(i) for i in trace.output_ids)
    rows = [("prompt", f"<code>{html.escape(prompt)}</code>"), ("output", f"<code>{html.escape(output)}</code>"),
            ("models", ", ".join(f"{role}: {html.escape(m.name)} ({m.params:,} params; {html.escape(m.runs_on())})"
                                 for role, m in trace.models.items())),
            ("params", html.escape(json.dumps(trace.params))),
            ("totals", f"{t.new_tokens} new tokens, {t.target_forwards} target forwards, "
                       + trace.steps_row().rate + f" {t.tau:.2f}, "
                       f"wall {t.wall_s:.2f} s")]
    return "<table>" + "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows) + "</table>"


def to_html(trace: Trace, path: str | Path) -> Path:
    """Write the run as ONE self-contained HTML file (plotly.js inline) and return its path."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: the folder {path.parent} does not exist")
    view, start, n = view_of(trace), first_step(trace), n_steps(trace)
    plot = lambda f, first: pio.to_html(f, include_plotlyjs=first, full_html=False, auto_play=False,
                                        config=dict(displaylogo=False))
    divs = []
    for i, spec in enumerate(view.step):            # the main step figure first: it carries plotly.js
        name = html.escape(spec.name)
        if spec.kind == "html" or spec.fresh:
            body = per_step(trace, spec, start, plot)
            div = f'<div class="speclab-figure speclab-{spec.slug}" data-figure="{name}">{body}</div>'
        else:
            div = (f'<div class="speclab-figure" data-figure="{name}" data-steps="{n}">'
                   + plot(animated(trace, spec, start), i == 0) + "</div>")
        divs.append(f"<details><summary>{name} of this {step_label(trace)}</summary>{div}</details>"
                    if spec.folded else div)
    divs += [f'<div class="speclab-figure" data-figure="{html.escape(f.name)}">' + plot(fig, False) + "</div>"
             for f in view.whole_run if (fig := f.draw(trace, None)) is not None]
    title = html.escape(f"speclab: {trace.engine} / {trace.method}")
    steps = lesson_of(trace)
    card = LESSON.format(steps=json.dumps([st.as_dict() for st in steps]).replace("</", "<\\/")) if steps else ""
    page = PAGE.format(title=title, stats=stats_table(trace), figures="\n".join(divs), start=start, keys=KEYS,
                       lesson=card)
    tmp = path.with_name(path.name + ".tmp")    # a failed write leaves no half page where the page goes
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# a folded spec's panels (the attention mask: a grid of slots x slots a step) stay out of the file
# past this size over the run: the dashboard and the player draw them on request
MAX_FOLDED_BYTES = 5 * 2**20


def per_step(trace: Trace, spec: FigureSpec, start: int, plot) -> str:
    """One panel per step of a spec drawn anew at each step (its HTML or its figure), the one of
    step `start` shown; the arrow keys and the sliders show the others."""
    n = n_steps(trace)
    out = []
    for k in range(n):
        got = spec.draw(trace, k)
        body = (got if spec.kind == "html" else plot(got, False)) if got is not None else \
            f"<p><i>this {trace.steps_row().noun} has no {html.escape(spec.name)} to show</i></p>"
        out.append(f'<div class="speclab-per-step speclab-{spec.slug}-step" data-step="{k}" '
                   f'style="display:{"" if k == start else "none"}">{body}</div>')
        if spec.folded and sum(map(len, out)) > MAX_FOLDED_BYTES:
            return (f"<p><i>{html.escape(spec.name)}: left out of this file (over {MAX_FOLDED_BYTES >> 20} MB for "
                    f"{n} steps); the dashboard and the Jupyter player draw it</i></p>")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    """`speclab export run.json --html out.html` (argv without the `export` word)."""
    ap = argparse.ArgumentParser(prog="speclab export", description="Write a saved trace as one offline HTML file.")
    ap.add_argument("trace", help="a trace saved with Trace.save / speclab run --trace")
    ap.add_argument("--html", help="output file (default: the trace's name with .html)")
    a = ap.parse_args(argv)
    src = Path(a.trace)
    if src.is_dir():
        raise TraceError(f"{src} is a folder, not a trace file: give the .json a run saved")
    trace = Trace.load(src)
    out = to_html(trace, a.html or src.with_suffix(".html"))
    print(f"wrote {out} ({n_steps(trace)} steps, {out.stat().st_size / 1e6:.1f} MB); open it in any browser, offline")
    return 0
