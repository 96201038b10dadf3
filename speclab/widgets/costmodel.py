"""The cost model with sliders: alpha, k and c beside a measured run (notebook 08).

    CostModelExplorer(m)             m: speclab.metrics.cost_model(run, ar_run) (or None: sliders only);
                                     displayed, the sliders (Jupyter) or a self-contained copy (nbconvert)
    CostModelExplorer(m, target=..., prompt=...)   adds "run it": `synthetic` at the sliders' alpha and
                                     k beside `ar` on that target and prompt (speclab.bench.curve), its
                                     measured speed-up a point on the figure beside the drawn one

The figure is speclab.figures.costmodel's, as a FigureWidget updated in place: the run's own curve
and points stay, and one more curve and point follow the sliders (expected speed-up =
tau(alpha, k) / c), with a line of text that reads the sliders' numbers out.
"""
from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from speclab import metrics
from speclab.figures.costmodel import costmodel_curve, costmodel_explorer_figure, costmodel_figure
from speclab.figures.offline import offline_html


class CostModelExplorer:
    def __init__(self, m: dict | None = None, target=None, prompt=None, max_new_tokens: int = 64, repeats: int = 3):
        self.m, self.target, self.prompt = m, target, prompt
        self.max_new_tokens, self.repeats = max_new_tokens, repeats
        self.measured: list[dict] = []
        a0 = m["token_alpha"] if m and m.get("token_alpha") is not None else 0.6
        k0 = m["k"] if m and m.get("k") else 4
        c0 = m["c"] if m and m.get("c") else 1.3
        self.alpha = W.FloatSlider(value=round(a0, 2), min=0.0, max=1.0, step=0.01, description="alpha",
                                   continuous_update=True)
        self.k = W.IntSlider(value=k0, min=1, max=16, description="k")
        self.c = W.FloatSlider(value=round(c0, 2), min=0.5, max=6.0, step=0.05, description="c")
        self.text = W.HTML()
        base = costmodel_figure(m, label="measured run") if m and m.get("c") else costmodel_figure({})
        self.fig = go.FigureWidget(base)
        # the points "run it" measured, then the sliders' curve and point (always the last two traces)
        self.fig.add_scatter(x=[], y=[], mode="markers", name="run it: measured",
                             marker=dict(color="#d62728", size=11, symbol="x"),
                             hovertemplate="alpha %{x:.2f}: measured %{y:.2f}x<extra></extra>")
        self.fig.add_scatter(x=[], y=[], mode="lines", name="sliders", line=dict(color="black", dash="dash"))
        self.fig.add_scatter(x=[], y=[], mode="markers", name="sliders: at alpha",
                             marker=dict(color="black", size=10, symbol="diamond"))
        for s in (self.alpha, self.k, self.c):
            s.observe(lambda _: self.update(), "value")
        self.run_button = W.Button(description="run it", tooltip="time synthetic at these alpha and k beside ar",
                                   disabled=target is None or prompt is None)
        self.run_button.on_click(lambda _: self.run_it())
        self.run_text = W.HTML("" if target is not None and prompt is not None else
                               "<i>give CostModelExplorer a target and a prompt to measure points</i>")
        self.update()
        self.view = W.VBox([W.HBox([self.alpha, self.k, self.c, self.run_button]), self.text, self.run_text, self.fig])

    def _repr_mimebundle_(self, **kwargs):
        """The sliders for Jupyter; for nbconvert and notebook viewers (no widget runs there) the
        same explorer as one self-contained plotly figure with a slider for c."""
        bundle = self.view._repr_mimebundle_(**kwargs)
        bundle["text/html"] = offline_html(costmodel_explorer_figure(self.m), note=(
            "the alpha / k / c explorer without a kernel: curves for k = 1, 2, 4, 8, the slider sets c "
            "(run the notebook in Jupyter for the three sliders)"))
        return bundle

    def update(self) -> dict:
        """Redraw the sliders' curve and point in place; returns the numbers it shows."""
        a, k, c = self.alpha.value, self.k.value, self.c.value
        tau = metrics.expected_tau(a, k)
        up = metrics.expected_speedup(tau, c)
        be = metrics.break_even(k, c)
        xs, ys = costmodel_curve(k, c)
        with self.fig.batch_update():
            curve, point = self.fig.data[-2], self.fig.data[-1]
            curve.x, curve.y = xs, ys
            point.x, point.y = [a], [up]
            self.fig.layout.yaxis.range = [0, max(1.2, max(ys), *(y for t in self.fig.data if t is not curve
                                                                   and t.mode == "markers" and t.y for y in t.y
                                                                   if y is not None)) * 1.1]
        self.text.value = (f"alpha {a:.2f} at k {k}: expected tau {tau:.2f}, round cost {c:.2f} ar steps: "
                           f"<b>{up:.2f}x</b>; break-even alpha "
                           + (f"{be:.2f}" if be is not None else "none (c >= k + 1: no draft can pay)"))
        return {"tau": tau, "speedup": up, "break_even": be}

    def run_it(self) -> dict:
        """Time `synthetic` at the sliders' alpha and k beside `ar` (speclab.bench.curve.measure_point) and
        put the measured speed-up on the figure; returns the point."""
        from speclab.bench.curve import measure_point
        if self.target is None or self.prompt is None:
            raise ValueError("run it needs a model and a prompt: CostModelExplorer(m, target=..., prompt=...)")
        a, k = self.alpha.value, self.k.value
        self.run_button.disabled = True
        self.run_text.value = f"running ar and synthetic[alpha={a:.2f}; k={k}], {self.repeats} times each ..."
        try:
            pt = measure_point(self.target, self.prompt, alpha=a, k=k, max_new_tokens=self.max_new_tokens,
                               repeats=self.repeats)
        finally:
            self.run_button.disabled = False
        self.measured.append(pt)
        marks = self.fig.data[-3]
        with self.fig.batch_update():
            marks.x = [p["alpha"] for p in self.measured]
            marks.y = [p["measured"] for p in self.measured]
        self.update()
        lo, hi = pt["spread"]
        exp = f"{pt['expected']:.2f}x" if pt["expected"] is not None else "none"
        self.run_text.value = (f"alpha {a:.2f}, k {k}: measured <b>{pt['measured']:.2f}x</b> ({lo:.2f}-{hi:.2f}x"
                               + ("" if pt["reliable"] else ", unreliable: " + "; ".join(pt["reasons"]))
                               + f"), tau {pt['tau']:.2f}, c {pt['c']:.2f}: the model with this c expects {exp}")
        return pt
