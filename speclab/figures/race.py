"""The race: two or more runs typing their answers side by side at the pace they really ran.

Each lane replays its trace's rounds on a shared clock: a round's tokens appear when the round
ended (cumulative draft + verify time, scaled so the last round ends at the run's wall time), so
`ar` types one token per forward while a speculative method types bursts. Under the lanes: tokens
so far, target forwards so far, tokens / s, and the speed-up of each lane over the first.

A speed control slows the replay down (a class can watch 43 tokens that took 0.27 s), and its last
choice swaps the clock for one counted in target forwards: every lane advances one round per tick,
so the picture is tau itself (tokens per target forward), whatever the machine. The page is one
self-contained HTML document (no network, no plotly): the dashboard and Jupyter show it in an
iframe, the export writes it as a file. `race_lanes` is the data alone, for tests and other front
ends.
"""
from __future__ import annotations

import html
import json

from speclab.trace import Trace

SPEEDS = (1, 10, 100)      # "x slower than it ran" choices; "forwards" is the forward clock


def race_lanes(traces: list[Trace], labels: list[str] | None = None) -> list[dict]:
    """[{label, wall_s, tokens, forwards, events: [[t_s, text, n_tokens, forward], ...]}], t_s = the
    end of each round that kept tokens, forward = how many target forwards had run by then (one per
    round)."""
    lanes = []
    for i, t in enumerate(traces):
        if not t.steps_row().verify or not t.rounds:
            raise ValueError(f"the race replays speculative runs with rounds; {t.method} is a {t.engine} run "
                             "(record it with record='light' or 'full')")
        spent = [r.draft_s + r.verify_s for r in t.rounds]
        total = sum(spent) or 1.0
        wall = t.totals.wall_s or total
        clock, events = 0.0, []
        for k, (r, s) in enumerate(zip(t.rounds, spent)):
            clock += s * wall / total                   # loop overhead spread in proportion
            if r.kept:
                events.append([round(clock, 5), "".join(t.text_of(x) for x in r.tokens), len(r.tokens), k + 1])
        lanes.append({"label": (labels[i] if labels else t.method), "wall_s": round(wall, 5),
                      "tokens": len(t.output_ids), "forwards": len(t.rounds), "events": events})
    return lanes


def race_html(traces: list[Trace], labels: list[str] | None = None, slow: float | str = 1.0) -> str:
    """The race page. slow > 1 plays it slower than real time (the counters stay in real time);
    slow="forwards" opens on the forward clock. The page's speed control changes either."""
    if slow != "forwards" and not (isinstance(slow, (int, float)) and slow > 0):
        raise ValueError(f"slow={slow!r}: give a factor > 0 (10 plays ten times slower) or 'forwards'")
    lanes = race_lanes(traces, labels)
    data = json.dumps({"lanes": lanes, "slow": slow, "speeds": sorted({*SPEEDS, *([slow] if slow != "forwards" else [])})})
    return _PAGE.replace("__DATA__", data.replace("</", "<\\/"))


def race_iframe(traces: list[Trace], labels: list[str] | None = None, slow: float | str = 1.0,
                height: int | None = None) -> str:
    """The page inside an iframe (srcdoc), for Panel's HTML pane and Jupyter outputs."""
    h = height or 130 + 150 * len(traces)
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
<div><button id="go">&#9654; Race</button><label class="stat">speed
<select id="speed"></select></label> <span class="stat" id="clock">t = 0.00 s</span></div>
<div id="lanes"></div>
<script>
const D = __DATA__;
const root = document.getElementById("lanes");
const els = D.lanes.map((l) => {
  const div = document.createElement("div"); div.className = "lane";
  div.innerHTML = `<div class="head"><span class="name"></span><span class="stat tok"></span>
    <span class="stat fwd"></span><span class="stat rate"></span><span class="stat up"></span></div><div class="text"></div>
    <div class="bar"><div class="fill"></div></div>`;
  div.querySelector(".name").textContent = l.label;
  root.appendChild(div);
  return div;
});
const speed = document.getElementById("speed");
for (const v of D.speeds) {
  const o = document.createElement("option"); o.value = String(v);
  o.textContent = v == 1 ? "as it ran" : `${v}x slower`; speed.appendChild(o);
}
const fo = document.createElement("option"); fo.value = "forwards";
fo.textContent = "one target forward per second"; speed.appendChild(fo);
speed.value = String(D.slow);
const byForward = () => speed.value === "forwards";
// the clock's end: the slowest lane, in seconds or in target forwards
const last = () => Math.max(...D.lanes.map((l) => byForward() ? l.forwards : l.wall_s));
let raf = null;
function draw(x) {
  const fwd = byForward(), slow = Number(speed.value);
  document.getElementById("clock").textContent = fwd
    ? `target forward ${Math.floor(x)} of ${last()} (every lane runs one target forward per tick)`
    : `t = ${x.toFixed(2)} s` + (slow != 1 ? ` (played ${slow}x slower than it ran)` : "");
  const rate = (l) => fwd ? l.tokens / l.forwards : l.tokens / l.wall_s;
  D.lanes.forEach((l, i) => {
    const el = els[i], box = el.querySelector(".text");
    let text = "", burst = "", n = 0, f = 0;
    for (const [te, s, k, fw] of l.events) {
      if ((fwd ? fw : te) <= x) { text += burst; burst = s; n += k; f = fw; }
    }
    if (fwd) f = Math.min(Math.floor(x), l.forwards);
    box.textContent = text;
    if (burst) { const b = document.createElement("span"); b.className = "burst"; b.textContent = burst; box.appendChild(b); }
    box.scrollTop = box.scrollHeight;
    const end = fwd ? l.forwards : l.wall_s, done = x >= end, first = D.lanes[0];
    el.querySelector(".tok").textContent = `${n} tokens`;
    el.querySelector(".fwd").textContent = `${f} target forward${f == 1 ? "" : "s"}`;
    el.querySelector(".rate").textContent = done
      ? (fwd ? `${rate(l).toFixed(2)} tokens/forward` : `${rate(l).toFixed(1)} tokens/s`) : "typing...";
    el.querySelector(".up").textContent = i > 0 && done && x >= (fwd ? first.forwards : first.wall_s)
      ? `${(rate(l) / rate(first)).toFixed(2)}x ${first.label}` + (fwd ? " (tokens per forward)" : "") : "";
    el.querySelector(".fill").style.width = `${100 * Math.min(x, end) / last()}%`;
  });
}
function play() {
  if (raf) cancelAnimationFrame(raf);
  const start = performance.now(), fwd = byForward(), slow = Number(speed.value), end = last();
  const step = (now) => {
    const s = (now - start) / 1000, x = fwd ? s : s / slow;
    draw(Math.min(x, end));
    if (x < end) raf = requestAnimationFrame(step);
  };
  raf = requestAnimationFrame(step);
}
document.getElementById("go").onclick = play;
speed.onchange = () => { if (raf) cancelAnimationFrame(raf); raf = null; draw(last()); };
draw(last());
</script></body></html>"""
