"""speclab.widgets: the Jupyter front end (ipywidgets). `show(trace_or_result)` -> Player.

The figures come from speclab.figures; this package only wires them to Play, a slider and a
detail panel. In Colab, run `from google.colab import output; output.enable_custom_widget_manager()`
first so the plotly FigureWidget can render. `keep_figures()` makes every figure (and the player's
still) also a self-contained HTML copy, so an executed notebook converted by nbconvert shows them offline.
"""
from speclab.figures.detail import detail_html
from speclab.figures.offline import keep_figures
from speclab.widgets.player import Player, as_trace, show

__all__ = ["show", "Player", "as_trace", "detail_html", "keep_figures"]
