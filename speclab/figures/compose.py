"""The step figures of the engines, as plain dicts, and how a drawn figure moves to another step.

Speculative (`round_dict`): the token strip (current round outlined) above the round's draft tree,
one figure with two rows so a FigureWidget or a frame updates both at once. DAG (`dag_dict`): the
DAG figure, a step per strategy. Diffusion: the canvas (figures.diffusion.canvas_dict), a step per
denoising forward. Heights are fixed over the run so stepping never makes the page jump. Which
engine shows which is the view spec's business (figures.views).

`update_figure` brings a drawn figure to another step's dict in place; `move_current` moves only a
whole-run figure's "current" marker.
"""
from __future__ import annotations

import plotly.graph_objects as go

from speclab.figures.dag import dag_figure
from speclab.figures.tokens import strip_parts
from speclab.figures.tree import tree_parts
from speclab.metrics import n_steps
from speclab.trace import Trace


def tree_rows(trace: Trace) -> int:
    """The most leaves any round's tree has (+1 for the emitted token): sizes the tree panel."""
    most = 1
    for r in trace.rounds:
        ids, parents = {n.id for n in r.nodes}, {n.parent for n in r.nodes}
        most = max(most, len(ids - parents) + 1)
    return most


def dag_dict(trace: Trace, step: int = 0, static: bool = True) -> dict:
    """The DAG figure with strategy `step` highlighted, as a plain dict (`static` changes nothing)."""
    n = n_steps(trace)
    d = dag_figure(trace, step).to_plotly_json()
    d["layout"].pop("template", None)      # the default template is large and never changes
    d["layout"]["meta"] = dict(step=step % n, steps=n, engine=trace.engine)
    return d


def round_dict(trace: Trace, step: int = 0, static: bool = True) -> dict:
    """A speculative round as a plain {"data", "layout"} dict, unvalidated: the token strip over
    the draft tree. static=False puts None for traces that are the same at every step (a long
    run's token strip), so players and frames skip them."""
    n = n_steps(trace)
    strip, tree = strip_parts(trace, step, static=static), tree_parts(trace, step)
    h1, h2, gap = strip["height"], max(200, 45 * tree_rows(trace)), 70
    area = h1 + gap + h2
    for t in tree["data"]:
        t.update(xaxis="x2", yaxis="y2")
    layout = dict(
        title=dict(text=strip["title"]), height=area + 110, plot_bgcolor="white", barmode="overlay",
        # itemsizing: legend markers keep their size on rounds with no node of that kind
        margin=dict(l=10, r=10, t=60, b=50), legend=dict(orientation="h", y=0, yanchor="top", itemsizing="constant"),
        xaxis=dict(strip["xaxis"], domain=[0, 1], anchor="y"),
        yaxis=dict(strip["yaxis"], domain=[(h2 + gap) / area, 1], anchor="x"),
        xaxis2=dict(tree["xaxis"], domain=[0, 1], anchor="y2"),
        yaxis2=dict(tree["yaxis"], domain=[0, h2 / area], anchor="x2"),
        annotations=[dict(text=tree["title"], x=0, y=h2 / area, xref="paper", yref="paper",
                          xanchor="left", yanchor="bottom", showarrow=False, font=dict(size=14))],
        meta=dict(step=step % n, steps=n, engine=trace.engine))
    return dict(data=strip["data"] + tree["data"], layout=layout)


# the layout keys a step changes (titles, axes ranges, the step meta); the rest is fixed for a run
STEP_LAYOUT_KEYS = ("title", "annotations", "xaxis", "yaxis", "xaxis2", "yaxis2", "meta")


def update_figure(fig: go.Figure, d: dict, layout_keys=STEP_LAYOUT_KEYS) -> go.Figure:
    """Bring `fig` (a Figure or a FigureWidget) to the figure dict `d` in place: trace by trace
    (a None in d["data"] means "unchanged"), then the layout keys a step changes. How the Jupyter
    player and the dashboard move a figure from one step to the next without rebuilding it."""
    with fig.batch_update():
        if len(d["data"]) == len(fig.data):
            for old, new in zip(fig.data, d["data"]):
                if new is not None:
                    new = new if isinstance(new, dict) else new.to_plotly_json()
                    old.update({k: v for k, v in new.items() if k != "type"}, overwrite=True)
        else:   # never for the figures shipped here (fixed trace counts), kept for custom ones
            fig.data = []
            fig.add_traces([t for t in d["data"] if t is not None])
        fig.layout.update({k: d["layout"][k] for k in layout_keys if k in d["layout"]})
    return fig


def move_current(fig: go.Figure, step: int) -> go.Figure:
    """Move `fig`'s "current" markers to `step` (0-based) in place, without redrawing the figure:
    every whole-run view draws its marker at the step's 1-based number on one axis (a vertical line
    x = [s, s] or a horizontal one y = [s, s]), so only that coordinate changes."""
    with fig.batch_update():
        for t in fig.data:
            if t.name != "current":
                continue
            for axis in ("x", "y"):
                v = getattr(t, axis)
                if v is not None and len(v) == 2 and v[0] is not None and v[0] == v[1]:
                    t.update({axis: [step + 1, step + 1]})
                    break
    return fig
