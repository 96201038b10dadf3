"""The diffusion report's trade-off: dllm-threshold's sweep as a curve of content tokens per forward
row against positions equal to one-per-step, every other policy read against it (its lift), the
report's best point (the dashboard's diffusion demo), and the sweep plot. The rows are the report's
(speclab.bench.dllm_eval): dicts with policy, method, params, positions_equal, content_per_row and
nll_per_token.
"""
from __future__ import annotations


def _kw(kw: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items())


def on_sweep(r: dict) -> bool:
    """A row of dllm-threshold's sweep: the threshold policy with only its threshold set."""
    return r["method"] == "dllm-threshold" and set(r["params"]) == {"threshold"}


SWEEP_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
                 "#bcbd22", "#e6a100", "#393b79", "#637939", "#843c39", "#7b4173")
SWEEP_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "star")


def sweep_figure(rows_by_set: dict):
    """Content tokens per forward row against positions equal to one-per-step, a panel per set:
    dllm-threshold's sweep as a line, every other policy as a point. A method keeps its colour in
    every panel (its variants their own marker), one legend entry per policy toggles it in all
    panels, and only the points above the curve are labelled on the plot (hover gives the rest)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    names = list(rows_by_set)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, shared_yaxes=True, horizontal_spacing=0.06)
    methods, variants = {}, {}
    for rows in rows_by_set.values():
        for r in rows:
            if not on_sweep(r) and r["method"] != "ar":
                methods.setdefault(r["method"], SWEEP_COLOURS[len(methods) % len(SWEEP_COLOURS)])
                same = [p for p, m in variants.items() if m[0] == r["method"]]
                variants.setdefault(r["policy"], (r["method"], SWEEP_SYMBOLS[len(same) % len(SWEEP_SYMBOLS)]))
    for i, name in enumerate(names, 1):
        rows = [r for r in rows_by_set[name] if r["positions_equal"] is not None]
        th = sorted(filter(on_sweep, rows), key=lambda r: r["params"]["threshold"])
        fig.add_trace(go.Scatter(x=[r["positions_equal"] for r in th], y=[r["content_per_row"] for r in th],
                                 mode="lines+markers+text", text=[str(r["params"]["threshold"]) for r in th],
                                 textposition="top center", textfont=dict(size=10, color="#666"),
                                 name="dllm-threshold sweep", legendgroup="sweep", line=dict(color="#999", width=2),
                                 marker=dict(size=6), showlegend=i == 1), row=1, col=i)
        above = set(above_curve(rows))
        for r in rows:
            if r in th:
                continue
            method, symbol = variants[r["policy"]]
            fig.add_trace(go.Scatter(
                x=[r["positions_equal"]], y=[r["content_per_row"]],
                mode="markers+text" if r["policy"] in above else "markers",
                text=[r["policy"].split(",")[0] + " (above the curve)"], textposition="top center",
                textfont=dict(size=11, color=methods[method]),
                marker=dict(size=11 if r["policy"] in above else 9, symbol=symbol, color=methods[method],
                            line=dict(width=1.5, color="black") if r["policy"] in above else dict(width=0)),
                name=r["policy"], legendgroup=r["policy"], showlegend=i == 1,
                hovertemplate=(f"<b>{r['policy']}</b><br>{r['method']} {_kw(r['params'])}<br>content tokens per "
                               "forward row %{y:.3f}<br>positions equal %{x:.3f}<br>AR target NLL / token "
                               f"{r['nll_per_token']:.3f}<extra>{name}</extra>")), row=1, col=i)
        fig.update_xaxes(title_text="positions equal to one-per-step", range=[0, 1.05], row=1, col=i)
    fig.update_yaxes(title_text="content tokens per forward row", rangemode="tozero", row=1, col=1)
    fig.update_layout(height=560, width=560 * len(names) + 330, plot_bgcolor="white",
                      legend=dict(font=dict(size=10), tracegroupgap=2),
                      title="diffusion policies: parallelism against agreement (up and right is better; "
                            "outlined: above the threshold sweep)")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    return fig


def threshold_curve(rows: list[dict]) -> list[tuple[float, float]]:
    """dllm-threshold's rows of one set as (positions equal, content per row), by agreement."""
    return sorted((r["positions_equal"], r["content_per_row"]) for r in rows if on_sweep(r))


def curve_at(curve: list[tuple[float, float]], x: float) -> float | None:
    """dllm-threshold's content per row at positions equal x: straight between the curve's points;
    to the right of its last point, that point's (more agreement for no fewer tokens); None to the
    left of its first point (less agreement than every threshold run: nothing to compare with)."""
    if len(curve) < 2 or x < curve[0][0]:
        return None
    if x >= curve[-1][0]:
        return curve[-1][1]
    (x0, y0), (x1, y1) = next((a, b) for a, b in zip(curve, curve[1:]) if a[0] <= x <= b[0])
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def lift(rows: list[dict]) -> dict[str, float]:
    """Each policy of one set (dllm-threshold's own and ar aside) against dllm-threshold's curve:
    its content per row over the curve's at its positions equal (above 1: more tokens per forward
    row for the same agreement); policies left of the curve are left out."""
    curve = threshold_curve(rows)
    out = {}
    for r in rows:
        x = r["positions_equal"]
        if x is None or r["method"] in ("dllm-threshold", "ar"):
            continue
        y0 = curve_at(curve, x)
        if y0 is not None:
            out[r["policy"]] = r["content_per_row"] / y0
    return out


def above_curve(rows: list[dict]) -> list[str]:
    """The policies of one set that lie above dllm-threshold's curve (lift): more content tokens per
    forward row than the curve at the same positions equal; to the right of its last point, at least
    that point's tokens per row and not the point itself."""
    lifted, curve = lift(rows), threshold_curve(rows)
    return [r["policy"] for r in rows if r["policy"] in lifted
            and (lifted[r["policy"]] > 1 or (lifted[r["policy"]] == 1 and r["positions_equal"] > curve[-1][0]))]


def best_point(rows_by_set: dict) -> tuple[str, dict]:
    """The report's best point: of the policies above dllm-threshold's curve on every set, the one
    lifted most above it (mean lift over the sets), as (method, params). The dashboard's diffusion
    demo is this point."""
    lifts = [lift(rows) for rows in rows_by_set.values()]
    ok = set.intersection(*(set(above_curve(rows)) for rows in rows_by_set.values())) if rows_by_set else set()
    if not ok:
        raise ValueError("no policy lies above dllm-threshold's curve on every prompt set")
    best = max(sorted(ok), key=lambda p: sum(lf[p] for lf in lifts) / len(lifts))
    row = next(r for r in next(iter(rows_by_set.values())) if r["policy"] == best)
    return row["method"], row["params"]
