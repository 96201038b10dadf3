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

A speculative run recorded "full" also shows, under the step figures, the target's p and the
draft's q of the step's first draft node (figures.distributions, one panel per step, the one of the
current step shown) and the alpha / k / c explorer (figures.costmodel). The arrow keys step every
step figure together (Home / End: the first / last step), and the page opens on the first step
that drafted (a feature drafter's first round has no draft yet).
"""
from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

import plotly.io as pio

from speclab.figures import n_steps, step_label, step_names, view_of
from speclab.figures.costmodel import costmodel_explorer_figure, trace_model
from speclab.figures.distributions import distributions
from speclab.figures.views import FigureSpec
from speclab.trace import Trace, TraceError

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}} td{{padding:0 1em 0 0}}
code{{background:#f3f3f3;padding:0 .3em}}</style></head>
<body data-start="{start}"><h2>{title}</h2>{stats}
<p style="color:#555;font-size:90%">&larr; / &rarr; step through the run (Home / End: first / last step).</p>
{figures}{keys}</body></html>
"""
# the arrow keys move every step figure (and the p / q panel) to the same step
KEYS = """<script>(function(){
let cur = null;
const graphs = () => Array.from(document.querySelectorAll('.speclab-figure[data-steps] .plotly-graph-div'));
const show = k => document.querySelectorAll('.speclab-pq').forEach(d => { d.style.display = (+d.dataset.step === k) ? '' : 'none'; });
function go(k) {
  const gs = graphs(); if (!gs.length) return;
  const n = +gs[0].closest('.speclab-figure').dataset.steps;
  cur = Math.max(0, Math.min(n - 1, k));
  gs.forEach(g => { Plotly.animate(g, [String(cur)], {mode: 'immediate', frame: {duration: 0, redraw: true},
                                                     transition: {duration: 0}});
                    Plotly.relayout(g, {'sliders[0].active': cur}); });
  show(cur);
}
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
    figs = [(f.name, animated(trace, f, start), n) for f in view.step]
    pq = pq_panels(trace)
    figs += [(f.name, fig, None) for f in view.whole_run if (fig := f.draw(trace, None)) is not None]
    if (m := trace_model(trace)) is not None:
        figs.append(("cost model explorer", costmodel_explorer_figure(m if m["c"] is not None else None), None))
    plot = lambda f, first: pio.to_html(f, include_plotlyjs=first, full_html=False, auto_play=False,
                                        config=dict(displaylogo=False))
    divs = [f'<div class="speclab-figure" data-figure="{html.escape(name)}"'
            + (f' data-steps="{steps}"' if steps else "") + ">" + plot(f, i == 0) + "</div>"
            for i, (name, f, steps) in enumerate(figs)]
    if pq:      # after the step figures: p and q of the current step's first draft node
        divs.insert(len(view.step), "".join(
            f'<div class="speclab-pq" data-step="{k}" style="display:{"" if k == start else "none"}">'
            + (plot(f, False) if f is not None else "<p><i>this step drafted nothing: no p / q to show</i></p>")
            + "</div>" for k, f in enumerate(pq)))
    title = html.escape(f"speclab: {trace.engine} / {trace.method}")
    page = PAGE.format(title=title, stats=stats_table(trace), figures="\n".join(divs), start=start, keys=KEYS)
    tmp = path.with_name(path.name + ".tmp")    # a failed write leaves no half page where the page goes
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def pq_panels(trace: Trace) -> list | None:
    """Per step, the p / q figure of its first draft node (None where it drafted nothing), for a
    speculative run recorded "full"; None where no step has one."""
    if not trace.steps_row().verify or trace.record != "full":
        return None
    figs = [distributions(trace, k) for k in range(len(trace.rounds))]
    return figs if any(f is not None for f in figs) else None


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
