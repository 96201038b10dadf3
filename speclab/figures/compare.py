"""Several runs of one prompt side by side: how fast each was against the baseline of its family.

    compare_chart(runs, reference)   tokens per second per run (bars), the speed-up over the
                                     reference (metrics.speedup, as in the table beside it) and
                                     tokens per forward written on each bar

The reference is `ar` for speculative methods and one-token-per-step decoding for diffusion
policies; its bar is grey. Timings are the runs' own wall times (warm-up excluded by the caller).
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab import metrics
from speclab.figures import colors
from speclab.trace import Trace


def tokens_per_s(t: Trace) -> float:
    return t.totals.new_tokens / t.totals.wall_s if t.totals.wall_s else 0.0


def compare_chart(runs: dict[str, Trace], reference: Trace | None, reference_name: str = "ar",
                  spread: dict | None = None) -> go.Figure:
    """spread: method -> speclab.bench.timing.SpeedUp from repeated, interleaved runs: the bar's
    speed-up is then its median with the min-max, and "?" marks one judged unreliable."""
    names = ([reference_name] if reference is not None else []) + list(runs)
    traces = ([reference] if reference is not None else []) + list(runs.values())
    speed = [tokens_per_s(t) for t in traces]
    ups = [metrics.speedup(t.totals.wall_s, reference.totals.wall_s) if reference is not None else None
           for t in traces]
    spread = spread or {}
    labels = [(f"{spread[n].median:.2f}x ({spread[n].ratios.lo:.2f}-{spread[n].ratios.hi:.2f})"
               + ("" if spread[n].reliable else " ?")) if n in spread else (f"{u:.2f}x" if u else "")
              for n, u in zip(names, ups)]
    text = [lab + f"<br>{t.totals.tau:.2f} tok/fwd" for lab, t in zip(labels, traces)]
    bar_colors = [colors.REFERENCE if reference is not None and i == 0 else colors.ORIGIN["accepted"]
                  for i in range(len(names))]
    fig = go.Figure(go.Bar(x=names, y=speed, text=text, textposition="outside", marker_color=bar_colors,
                           hovertemplate="%{x}: %{y:.1f} tokens/s<extra></extra>", cliponaxis=False))
    top = max(speed, default=1.0) or 1.0
    fig.update_layout(title=f"tokens per second on this prompt (speed-up over {reference_name} on each bar)",
                      height=320, plot_bgcolor="white", margin=dict(l=50, r=10, t=60, b=40),
                      yaxis=dict(title="tokens / s", range=[0, top * 1.3], gridcolor="#eeeeee"))
    return fig
