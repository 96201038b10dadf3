"""What each lossy acceptance rule buys and what it costs: tau against quality, one curve per rule.

The rows are a sampled bench's (`speclab bench --temperature T`, or `speclab.bench.runner.bench`):
each gives tau (tokens per target forward), the analytic total-variation distance of each round's
first token from the target's law (`tv_per_step`; None for a rule without an induced law, such as
judge), the target's NLL per generated token and distinct-2. `points` reads each speculative row as
a rule and its setting, `table` prints them, `figure` draws per prompt set tau against TV and tau
against NLL, each rule's settings joined in the order of the parameter it sweeps; the exact rule
(lossless) is the point at TV 0, and `ar`'s NLL the dashed line. scripts/rule_sweep.py is its command
line; notebook 05 draws a live sweep on the toy pair with it.
"""
from __future__ import annotations

import math

from speclab.bench.quality import rule_of
from speclab.bench.runner import parse_methods

COLOURS = {"exact": "#222", "typical": "#d62728", "lantern": "#1f77b4", "judge": "#2ca02c"}
SKIP = ("judge",)           # a parameter that names a part (the probe's directory), not a setting


def _number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.inf     # a default that is not a number (judge's threshold: the probe's own) sorts last


def points(rows: list[dict]) -> list[dict]:
    """Each speculative row as (set, rule, its setting, the sort key, tau, tv, nll, distinct-2,
    speed-up); `ar` rows apart. A row that leaves a swept parameter at its default shows the default's
    value (marked so), so a rule's curve runs in the order of the parameter's value."""
    from speclab.decoding.rules import rule_params
    parsed = []
    for r in rows:
        if r["method"] == "ar":
            continue
        (spec,) = parse_methods(r["method"])
        rule, params = rule_of(spec)
        parsed.append((r, rule, {k: v for k, v in params.items() if k not in SKIP}))
    swept = {}
    for _, rule, params in parsed:
        swept.setdefault(rule, {}).update(dict.fromkeys(params))      # in first-seen order
    out = []
    for r, rule, params in parsed:
        full = rule_params(rule, None)
        names = list(swept[rule])
        setting = ", ".join(f"{k}={params[k]}" if k in params else f"{k}={full.get(k)} (default)" for k in names)
        out.append(dict(set=r["prompt_set"], rule=rule, setting=setting,
                        key=tuple(_number(params.get(k, full.get(k))) for k in names), tau=r["tau"],
                        tv=r.get("tv_per_step"), nll=r.get("nll"), distinct_2=r.get("distinct_2"),
                        speedup=r.get("speedup_vs_ar")))
    return out


def table(rows: list[dict]) -> str:
    """A markdown table of every rule setting beside `ar`'s NLL and distinct-2."""
    ar = {r["prompt_set"]: r for r in rows if r["method"] == "ar"}
    lines = ["| set | rule | setting | tau | TV per step | NLL per token (ar) | distinct-2 (ar) |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda x: "" if x is None else f"{x:.3f}"
    for p in sorted(points(rows), key=lambda p: (p["set"], p["rule"], p["key"])):
        a = ar.get(p["set"], {})
        lines.append(f"| {p['set']} | {p['rule']} | {p['setting'] or 'default'} | {p['tau']:.2f} | {fmt(p['tv'])} | "
                     f"{fmt(p['nll'])} ({fmt(a.get('nll'))}) | {fmt(p['distinct_2'])} ({fmt(a.get('distinct_2'))}) |")
    return "\n".join(lines)


def _label(p: dict) -> str:
    return p["setting"].replace(" (default)", "*")


def figure(rows: list[dict]):
    """Per prompt set, tau against TV per step (left) and against NLL per token (right), a line per
    rule through its settings (labelled by them; * marks a default)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    pts = points(rows)
    sets = list(dict.fromkeys(p["set"] for p in pts))
    ar = {r["prompt_set"]: r for r in rows if r["method"] == "ar"}
    titles = [f"{s}: {what}" for s in sets for what in ("tau against TV per step", "tau against NLL per token")]
    fig = make_subplots(rows=len(sets), cols=2, subplot_titles=titles, horizontal_spacing=0.08, vertical_spacing=0.14)
    for i, s in enumerate(sets, 1):
        for rule in dict.fromkeys(p["rule"] for p in pts):
            line = sorted((p for p in pts if p["set"] == s and p["rule"] == rule), key=lambda p: p["key"])
            for col, x in ((1, "tv"), (2, "nll")):
                xs = [p for p in line if p[x] is not None]
                if not xs:
                    continue
                fig.add_trace(go.Scatter(x=[p[x] for p in xs], y=[p["tau"] for p in xs], mode="lines+markers+text",
                                         text=[_label(p) for p in xs], hovertext=[p["setting"] for p in xs],
                                         textposition="top center", textfont=dict(size=9),
                                         line=dict(color=COLOURS.get(rule, "#888")), name=rule,
                                         legendgroup=rule, showlegend=i == 1 and col == 2), row=i, col=col)
        if s in ar and ar[s].get("nll") is not None:
            fig.add_vline(x=ar[s]["nll"], line=dict(dash="dash", color="#888"), row=i, col=2)
        fig.update_xaxes(title_text="TV from the target's law, per step", row=i, col=1)
        fig.update_xaxes(title_text="target NLL per token (dashed: ar)", row=i, col=2)
        fig.update_yaxes(title_text="tau (tokens per target forward)", row=i, col=1)
    fig.update_layout(height=380 * len(sets) + 80, width=1100, plot_bgcolor="white",
                      title="lossy acceptance rules: tau bought with distance from the target's law "
                            "(TV 0 and ar's NLL are the target's own; * a default)")
    fig.update_xaxes(showgrid=True, gridcolor="#eee", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    return fig
