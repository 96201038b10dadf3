"""Which tasks speculation helps: the category bench's rows as two heatmaps, category x method.

    category_figure(rows)   left: speed-up over ar on each category's own prompts (green above
                            1x, red below, white at 1x); right: acceptance, tau (new tokens per
                            target forward) as the colour, alpha (accepted / drafted) written
                            beside it. Hover gives the counts each cell is computed from.

A pure function of `speclab.bench.categories.category_rows` (the `categories` list of a bench
JSON run with `--categories`): no trace, no model. The baseline's row (1x, tau 1 by definition)
is left out; the `all` column, when present, comes last.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

# speed-up on a log scale, so 0.5x and 2x sit equally far from 1x
_SPEEDUP_SCALE = [(0.0, "#c0392b"), (0.5, "#ffffff"), (1.0, "#1e8449")]
_TAU_SCALE = "Blues"


def category_figure(rows: list[dict], baseline: str = "ar", title: str | None = None) -> go.Figure:
    import math
    rows = [r for r in rows if r["method"] != baseline]
    if not rows:
        raise ValueError("no category rows besides the baseline's: run the bench with --categories and a method")
    cats = list(dict.fromkeys(r["category"] for r in rows))
    if "all" in cats:                        # the sum of every category, last
        cats = [c for c in cats if c != "all"] + ["all"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["category"]): r for r in rows}
    grid = lambda f: [[f(cell[m, c]) if (m, c) in cell else None for c in cats] for m in methods]

    up = grid(lambda r: r["speedup"])
    log_up = [[math.log2(v) if v else None for v in row] for row in up]
    span = max([abs(v) for row in log_up for v in row if v is not None] + [math.log2(1.5)])
    up_text = grid(lambda r: f"{r['speedup']:.2f}x" if r["speedup"] else "")
    tau = grid(lambda r: r["tau"])
    acc_text = grid(lambda r: f"{r['tau']:.2f}" + ("" if r["alpha"] is None else f"<br>α {r['alpha']:.2f}"))
    hover = grid(lambda r: (f"{r['method']} on {r['category']}<br>speed-up {r['speedup']}x "
                            f"(ar {r['ar_wall_s']} s / {r['wall_s']} s)<br>tau {r['tau']} = {r['new_tokens']} "
                            f"tokens / {r['target_forwards']} forwards<br>alpha "
                            + ("-" if r["alpha"] is None else f"{r['alpha']} = {r['accepted']} / {r['drafted']}")
                            + f"<br>{r['prompts']} prompts"))

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=(f"speed-up over {baseline}", "acceptance: tau (α = alpha)"))
    fig.add_trace(go.Heatmap(z=log_up, x=cats, y=methods, text=up_text, texttemplate="%{text}",
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                             colorscale=_SPEEDUP_SCALE, zmin=-span, zmax=span, xgap=2, ygap=2,
                             colorbar=dict(x=0.43, len=0.9, title="x", tickvals=[-1, 0, 1],
                                           ticktext=["0.5x", "1x", "2x"])), row=1, col=1)
    fig.add_trace(go.Heatmap(z=tau, x=cats, y=methods, text=acc_text, texttemplate="%{text}",
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                             colorscale=_TAU_SCALE, zmin=1.0, xgap=2, ygap=2,
                             colorbar=dict(x=1.0, len=0.9, title="tau")), row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_layout(title=title or "which tasks speculation helps: category x method",
                      height=140 + 42 * len(methods), plot_bgcolor="white",
                      margin=dict(l=130, r=20, t=70, b=60))
    return fig
