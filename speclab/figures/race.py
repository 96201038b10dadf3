"""The race: two or more runs typing their answers side by side at the pace they really ran.

Each lane replays its trace's rounds on a shared clock: a round's tokens appear when the round
ended (cumulative draft + verify time, scaled so the last round ends at the run's wall time), so
`ar` types one token per forward while a speculative method types bursts. Under the lanes: tokens
so far, tokens / s, and the speed-up of each lane over the first. The page is one self-contained
HTML document (no network, no plotly): the dashboard and Jupyter show it in an iframe, the export
writes it as a file. `race_lanes` is the data alone, for tests and other front ends.
"""
from __future__ import annotations

import html
import json

from speclab.trace import Trace


def race_lanes(traces: list[Trace], labels: list[str] | None = None) -> list[dict]:
    """[{label, wall_s, tokens, events: [[t_s, text, n_tokens], ...]}], t_s = the end of each round
    that kept tokens."""
    lanes = []
    for i, t in enumerate(traces):
        if t.engine != "speculative" or not t.rounds:
            raise ValueError(f"the race replays speculative runs with rounds; {t.method} is a {t.engine} run "
                             "(record it with record='light' or 'full')")
        spent = [r.draft_s + r.verify_s for r in t.rounds]
        total = sum(spent) or 1.0
        wall = t.totals.wall_s or total
        clock, events = 0.0, []
        for r, s in zip(t.rounds, spent):
            clock += s * wall / total                   # loop overhead spread in proportion
            if r.kept:
                events.append([round(clock, 5), "".join(t.text_of(x) for x in r.tokens), len(r.tokens)])
        lanes.append({"label": (labels[i] if labels else t.method), "wall_s": round(wall, 5),
                      "tokens": len(t.output_ids), "events": events})
    return lanes


def race_html(traces: list[Trace], labels: list[str] | None = None, slow: float = 1.0) -> str:
    """The race page. slow > 1 plays it slower than real time (the counters stay in real time)."""
    lanes = race_lanes(traces, labels)
    data = json.dumps({"lanes": lanes, "slow": slow})
    return _PAGE.replace("__DATA__", data.replace("</", "<\\/"))


def race_iframe(traces: list[Trace], labels: list[str] | None = None, slow: float = 1.0, height: int | None = None) -> str:
    """The page inside an iframe (srcdoc), for Panel's HTML pane and Jupyter outputs."""
    h = height or 110 + 150 * len(traces)
    return (f'<iframe class="speclab-race" style="width:100%;height:{h}px;border:0" '
            f'srcdoc="{html.escape(race_html(traces, labels, slow), quote=True)}"></iframe>')


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body{font-family:system-ui,sans-serif;margin:8px;color:#222}
.lane{margin:0 0 10px 0}.head{display:flex;gap:14px;align-items:baseline;font-size:15px}
.name{font-weight:600;min-width:150px}.stat{font-variant-numeric:tabular-nums;color:#444}
.text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:16px;line-height:1.35;
height:100px;overflow:auto;border:1px solid #ddd;border-radius:4px;padding:6px;background:#fafafa}
.burst{background:#8fd19e}.bar{height:6px;background:#eee;border-radius:3px;margin-top:3px}
.fill{height:6px;background:#3182bd;border-radius:3px;width:0}
button{font-size:15px;padding:4px 14px;margin-right:8px}
</style></head><body>
<div><button id="go">&#9654; Race</button><span class="stat" id="clock">t = 0.00 s</span></div>
<div id="lanes"></div>
<script>
const D = __DATA__;
const root = document.getElementById("lanes");
const els = D.lanes.map((l) => {
  const div = document.createElement("div"); div.className = "lane";
  div.innerHTML = `<div class="head"><span class="name"></span><span class="stat tok"></span>
    <span class="stat rate"></span><span class="stat up"></span></div><div class="text"></div>
    <div class="bar"><div class="fill"></div></div>`;
  div.querySelector(".name").textContent = l.label;
  root.appendChild(div);
  return div;
});
const last = Math.max(...D.lanes.map((l) => l.wall_s));
let raf = null;
function draw(t) {
  document.getElementById("clock").textContent =
    `t = ${t.toFixed(2)} s` + (D.slow != 1 ? ` (played ${D.slow}x slower than it ran)` : "");
  const rate = (l) => l.tokens / l.wall_s;
  D.lanes.forEach((l, i) => {
    const el = els[i], box = el.querySelector(".text");
    let text = "", burst = "", n = 0;
    for (const [te, s, k] of l.events) { if (te <= t) { text += burst; burst = s; n += k; } }
    box.textContent = text;
    if (burst) { const b = document.createElement("span"); b.className = "burst"; b.textContent = burst; box.appendChild(b); }
    box.scrollTop = box.scrollHeight;
    const done = t >= l.wall_s, first = D.lanes[0];
    el.querySelector(".tok").textContent = `${n} tokens`;
    el.querySelector(".rate").textContent = done ? `${rate(l).toFixed(1)} tokens/s` : "typing...";
    el.querySelector(".up").textContent = i > 0 && done && t >= first.wall_s
      ? `${(rate(l) / rate(first)).toFixed(2)}x ${first.label}` : "";
    el.querySelector(".fill").style.width = `${100 * Math.min(t, l.wall_s) / last}%`;
  });
}
function play() {
  if (raf) cancelAnimationFrame(raf);
  const start = performance.now();
  const step = (now) => {
    const t = (now - start) / 1000 / D.slow;
    draw(Math.min(t, last));
    if (t < last) raf = requestAnimationFrame(step);
  };
  raf = requestAnimationFrame(step);
}
document.getElementById("go").onclick = play;
draw(last);
</script></body></html>"""
