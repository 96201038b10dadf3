"""What each lossy acceptance rule buys and what it costs: tau against quality, one curve per rule.

A sampled bench (`speclab bench --temperature T`) with one row per rule setting gives every row's tau
(tokens per target forward), the analytic total-variation distance of each round's first token from
the target's law (`tv_per_step`; None for a rule without an induced law, such as judge) and the
target's NLL per generated token. This script reads that bench's JSON and draws, per prompt set,
tau against TV and tau against NLL, each rule's settings joined in the order of its parameter; the
exact rule (lossless) is the point at TV 0, and `ar`'s NLL is the dashed line.

    speclab bench --target smollm2-135m --draft smollm2-draft --prompts chat,code-edit --limit 8 \\
        --max-new-tokens 64 --dtype bf16 --temperature 0.7 --seed 0 --json sweep.json --methods \\
        "ar,draft-model[k=4],draft-model[k=4;rule=typical;rule.eps=0.01],..."
    python scripts/rule_sweep.py sweep.json --plot docs/screenshots/rule-sweep.png

It prints the table (markdown) of every row: rule, setting, tau, TV per step, NLL, distinct-2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speclab.bench.quality import rule_of  # noqa: E402
from speclab.bench.runner import parse_methods  # noqa: E402

COLOURS = {"exact": "#222", "typical": "#d62728", "lantern": "#1f77b4", "judge": "#2ca02c"}


def points(rows: list[dict]) -> list[dict]:
    """Each speculative row as (set, rule, its setting, tau, tv, nll, distinct-2); `ar` rows apart."""
    out = []
    for r in rows:
        if r["method"] == "ar":
            continue
        (spec,) = parse_methods(r["method"])
        rule, params = rule_of(spec)
        params = {k: v for k, v in params.items() if k != "judge"}       # the probe's directory
        out.append(dict(set=r["prompt_set"], rule=rule, setting=", ".join(f"{k}={v}" for k, v in params.items()),
                        key=tuple(float(v) for v in params.values()), tau=r["tau"], tv=r.get("tv_per_step"),
                        nll=r.get("nll"), distinct_2=r.get("distinct_2"), speedup=r.get("speedup_vs_ar")))
    return out


def table(rows: list[dict]) -> str:
    ar = {r["prompt_set"]: r for r in rows if r["method"] == "ar"}
    lines = ["| set | rule | setting | tau | TV per step | NLL per token (ar) | distinct-2 (ar) |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda x: "" if x is None else f"{x:.3f}"
    for p in sorted(points(rows), key=lambda p: (p["set"], p["rule"], p["key"])):
        a = ar.get(p["set"], {})
        lines.append(f"| {p['set']} | {p['rule']} | {p['setting'] or 'default'} | {p['tau']:.2f} | {fmt(p['tv'])} | "
                     f"{fmt(p['nll'])} ({fmt(a.get('nll'))}) | {fmt(p['distinct_2'])} ({fmt(a.get('distinct_2'))}) |")
    return "\n".join(lines)


def figure(rows: list[dict]):
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
                                         text=[p["setting"].split("=")[-1] if p["setting"] else "" for p in xs],
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
                            "(TV 0 and ar's NLL are the target's own)")
    fig.update_xaxes(showgrid=True, gridcolor="#eee", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="sampled bench JSON (speclab bench --json), one or more")
    ap.add_argument("--plot", help=".png (Chromium) or .html (offline)")
    a = ap.parse_args(argv)
    rows = [r for f in a.json for r in json.loads(Path(f).read_text())["rows"]]
    print(table(rows))
    if a.plot:
        from speclab.bench.plotfile import save_plot
        save_plot(figure(rows), a.plot)


if __name__ == "__main__":
    main()
