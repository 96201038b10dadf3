"""Bench reports: a markdown table for BENCHMARKS.md and a self-contained HTML page of charts."""
from __future__ import annotations

from pathlib import Path

COLS = ["method", "prompt_set", "wall_s", "tokens_per_s", "speedup_vs_ar", "tau", "alpha", "identical_rate",
        "near_ties", "mismatches", "draft_s", "verify_s", "efficiency"]
# the quality columns (bench/quality.py), after the speed columns: greedy against ar token by token;
# sampling: TV of a round's first token against p, the target's NLL per token, distinct-n (ar's beside)
GREEDY_QUALITY = ["guarantee", "identical_tokens", "first_divergence"]
SAMPLING_QUALITY = ["guarantee", "tv_per_step", "nll", "distinct_1", "distinct_2", "distinct_1_ar", "distinct_2_ar"]


def columns(result: dict) -> list[str]:
    """The table's columns: the speed columns, then the quality columns of the run's decoding (the
    greedy identity columns near_ties and mismatches only where it is greedy)."""
    if result.get("temperature"):
        return [c for c in COLS if c not in ("identical_rate", "near_ties", "mismatches")] + SAMPLING_QUALITY
    return COLS + GREEDY_QUALITY


def markdown(result: dict) -> str:
    rows, cols = result["rows"], columns(result)
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = ""
    for r in rows:
        body += "| " + " | ".join("" if r.get(c) is None else (f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]))
                                  for c in cols) + " |\n"
    if result.get("temperature"):
        seeds = result.get("seeds") or []
        body += (f"\nsampled at temperature {result['temperature']:g}, seeds {', '.join(map(str, seeds))} "
                 "for every row; "
                 "tv_per_step: mean TV of a round's first token against the target's p (0: a lossless row; empty: "
                 "not computable for this row); nll: the target's negative log-likelihood per generated token\n")
    return head + body


def html(result: dict, path: str | Path) -> Path:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    rows = result["rows"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("speed-up over ar", "tau against k (what-if)",
                                                        "efficiency (measured / ideal)"))
    names = [r["method"] for r in rows]
    fig.add_trace(go.Bar(x=names, y=[r["speedup_vs_ar"] for r in rows],
                         marker_color=["#888" if n.startswith("hf-") else "#2a7" for n in names],
                         hovertext=[f"tau {r['tau']}, alpha {r.get('alpha')}" for r in rows], name="speed-up"), 1, 1)
    wi = result.get("whatif", [])
    ks = [w for w in wi if w["threshold"] is None]
    if ks:
        fig.add_trace(go.Scatter(x=[w["k"] for w in ks], y=[w["tau"] for w in ks], mode="lines+markers",
                                 name="tau(k)"), 1, 2)
    eff = [r for r in rows if r.get("efficiency") is not None]
    if eff:
        fig.add_trace(go.Bar(x=[r["method"] for r in eff], y=[r["efficiency"] for r in eff], name="efficiency"), 1, 3)
    fig.update_layout(title=f"speclab bench: {result['prompt_set']}, {result['prompts']} prompts, "
                            f"{result['max_new_tokens']} new tokens", showlegend=False, height=450)
    table = "<pre>" + markdown(result) + "</pre>"
    page = fig.to_html(include_plotlyjs=True, full_html=True)   # plotly.js inline: works offline
    page = page.replace("</body>", table + "</body>")
    Path(path).write_text(page, encoding="utf-8")
    return Path(path)
