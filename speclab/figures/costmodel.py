"""The cost model drawn: the expected speed-up against the per-token acceptance rate alpha, for a
run's draft length k and cost ratio c, with the break-even line and the run's measured point.

    costmodel_figure(m)              m: speclab.metrics.cost_model(trace, reference), or several as
                                     {label: m} (one curve per method, e.g. the dashboard's Compare)
    costmodel_curve(k, c)            the curve's data: alpha in [0, 1] -> expected_tau(alpha, k) / c

Reading it: a method pays where its curve is above 1.0 (the horizontal break-even line); the dotted
vertical line is the alpha where its curve crosses 1.0 (metrics.break_even). The hollow marker is
the model at the run's own alpha (per-token, the papers' alpha: accepted / judged); the filled one is
the speed-up the run measured. The gap between them is what the model leaves out (the loop's
bookkeeping outside draft + verify, a gate or lookup round that drafted nothing, timing noise).
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab import metrics
from speclab.figures import colors

PALETTE = ("#2a7fb8", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e")


def costmodel_curve(k: int, c: float, points: int = 101) -> tuple[list[float], list[float]]:
    """(alpha, expected speed-up) on an even grid of alpha in [0, 1]."""
    xs = [i / (points - 1) for i in range(points)]
    return xs, [metrics.expected_speedup(metrics.expected_tau(a, k), c) for a in xs]


def costmodel_figure(models, label: str | None = None, height: int = 360) -> go.Figure:
    many = isinstance(models, dict) and "k" not in models
    items = list(models.items()) if many else [(label or "run", models)]
    fig = go.Figure()
    top = 1.2
    for i, (name, m) in enumerate(items):
        if m is None or not m.get("k"):
            continue
        col = PALETTE[i % len(PALETTE)]
        xs, ys = costmodel_curve(m["k"], m["c"])
        top = max(top, max(ys), m.get("measured_speedup") or 0)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=col), name=f"expected, {name}: k {m['k']}, "
                                 f"c {m['c']:.2f}", hovertemplate="alpha %{x:.2f}: %{y:.2f}x<extra></extra>"))
        a = m.get("token_alpha")
        if a is not None:
            fig.add_trace(go.Scatter(x=[a], y=[m["expected_speedup"]], mode="markers", name=f"model at its alpha, {name}",
                                     marker=dict(color="white", size=11, line=dict(color=col, width=2)),
                                     hovertemplate=(f"{name}: alpha %{{x:.2f}}, expected tau {m['expected_tau']:.2f}"
                                                    f" / c {m['c']:.2f} = %{{y:.2f}}x<extra></extra>")))
            if m.get("measured_speedup") is not None:
                fig.add_trace(go.Scatter(x=[a], y=[m["measured_speedup"]], mode="markers",
                                         name=f"measured, {name}", marker=dict(color=col, size=11, symbol="circle"),
                                         hovertemplate=f"{name}: measured %{{y:.2f}}x<extra></extra>"))
        if m.get("break_even") is not None:
            fig.add_shape(type="line", x0=m["break_even"], x1=m["break_even"], y0=0, y1=1.0,
                          line=dict(color=col, dash="dot", width=1))
    fig.add_shape(type="line", x0=0, x1=1, y0=1.0, y1=1.0, line=dict(color=colors.REFERENCE, width=1.5))
    fig.add_annotation(x=0.02, y=1.0, text="break-even: as fast as ar", showarrow=False, yshift=9, xanchor="left",
                       font=dict(size=11, color="#555"))
    fig.update_layout(title="cost model: expected speed-up = tau(alpha, k) / c", height=height, plot_bgcolor="white",
                      margin=dict(l=50, r=10, t=50, b=40), legend=dict(font=dict(size=10)),
                      xaxis=dict(title="per-token acceptance rate alpha (accepted / judged)", range=[0, 1],
                                 gridcolor="#eeeeee"),
                      yaxis=dict(title="speed-up over ar", range=[0, top * 1.1], gridcolor="#eeeeee"))
    return fig


def trace_model(trace) -> dict | None:
    """The cost model from one run alone: its plain rounds (a gate's, or a lookup that found
    nothing) give the ar step; without any, c is unknown (None) and so is the expected speed-up."""
    from types import SimpleNamespace
    if not trace.steps_row().verify or len(trace.rounds) < 2 or not trace.totals.drafted:
        return None
    plain = [r for r in trace.rounds[1:] if not r.drafted]
    ref = SimpleNamespace(rounds=[trace.rounds[0]] + (plain or trace.rounds[1:]), totals=SimpleNamespace(wall_s=0.0))
    m = metrics.cost_model(trace, ref)
    if m is None or not m["k"]:
        return None
    if not plain:
        m.update(c=None, ar_step_s=None, expected_speedup=None, break_even=None)
    return m


def costmodel_summary(trace, step: int = 0) -> go.Figure | None:
    """The Summary tab's cost model of one run (the viewer's figure maker signature): the run's k
    and c where the run measured an ar step; otherwise curves for c = 1, 1.5 and 2 around the run's
    alpha (the Compare tab measures c against a real ar run)."""
    m = trace_model(trace)
    if m is None:
        return None
    if m["c"] is not None:
        fig = costmodel_figure(m, label=trace.method)
    else:
        fig = costmodel_figure({f"c = {c}": dict(m, c=c, expected_speedup=metrics.expected_speedup(m["expected_tau"], c),
                                                 break_even=metrics.break_even(m["k"], c), measured_speedup=None)
                                for c in (1.0, 1.5, 2.0)})
        fig.update_layout(title=f"cost model at k {m['k']}: this run's alpha against three round costs "
                                "(Compare measures c against ar)")
    return fig


SLIDER_KS = (1, 2, 4, 8)
SLIDER_CS = tuple(round(0.5 + 0.25 * i, 2) for i in range(23))      # 0.5 .. 6.0


def costmodel_explorer_figure(m: dict | None = None, height: int = 420) -> go.Figure:
    """The alpha / k / c explorer as one self-contained plotly figure (no kernel, no widget): the
    expected speed-up against alpha (x) for k = 1, 2, 4, 8 (one curve each) at a round cost c
    chosen on the slider, the break-even line, and the measured run's points (m, when given, as in
    costmodel_figure) where its own c starts the slider. What notebook 08's sliders do, for the
    dashboard, the export and nbconvert's HTML."""
    fig = costmodel_figure(m, label="measured run", height=height) if m and m.get("k") else costmodel_figure({}, height=height)
    own = len(fig.data)
    c0 = m["c"] if m and m.get("c") else 1.3
    start = min(range(len(SLIDER_CS)), key=lambda i: abs(SLIDER_CS[i] - c0))
    greys = ("#bbbbbb", "#999999", "#666666", "#222222")
    for k, col in zip(SLIDER_KS, greys):
        xs, ys = costmodel_curve(k, SLIDER_CS[start])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=col, dash="dash", width=1.5),
                                 name=f"k {k} at the slider's c", hovertemplate=f"k {k}: alpha %{{x:.2f}}: %{{y:.2f}}x<extra></extra>"))
    idx = list(range(own, own + len(SLIDER_KS)))
    steps = []
    for c in SLIDER_CS:
        ys = [costmodel_curve(k, c)[1] for k in SLIDER_KS]
        be = {k: metrics.break_even(k, c) for k in SLIDER_KS}
        note = ", ".join(f"k {k}: {'none' if b is None else f'{b:.2f}'}" for k, b in be.items())
        steps.append(dict(method="update", label=f"{c:.2f}",
                          args=[{"y": ys}, {"title.text": f"c = {c:.2f} ar steps a round; break-even alpha {note}"}, idx]))
    fig.update_layout(sliders=[dict(active=start, steps=steps, currentvalue=dict(prefix="round cost c (ar steps): "),
                                    pad=dict(t=45))],
                      title=dict(text=steps[start]["args"][1]["title.text"]), margin=dict(b=110),
                      yaxis=dict(range=[0, max(2.0, (fig.layout.yaxis.range or [0, 2])[1])]))
    return fig
