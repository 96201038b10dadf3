"""Figures that keep showing outside Jupyter: beside the interactive plotly output, a self-contained
HTML copy that nbconvert's HTML (and any page that shows a notebook's HTML outputs) draws offline.

    from speclab.figures.offline import keep_figures
    keep_figures()        # in a notebook's first cell: every plotly figure from here on emits both

Jupyter (JupyterLab, Notebook 7, VS Code) shows the interactive `application/vnd.plotly.v1+json`
output and ignores the HTML copy; nbconvert, which has no plotly renderer, shows the HTML copy. The
copy needs plotly.js, and never from a CDN: the first figure of a kernel carries plotly.js itself,
gzipped (about a third of its size) and unpacked by the browser's DecompressionStream, and every
later figure waits for it. So an executed notebook holds plotly.js once, not once per figure.

The renderer is an object the notebook's kernel owns (registered in plotly's renderers): whether
plotly.js was sent is per kernel, one reader's. Execute a notebook for nbconvert without storing
widget state (`--ExecutePreprocessor.store_widget_state=False`): stored, it is several MB of widget
code that nbconvert would hand to a widget manager it loads from a CDN; without it nbconvert shows
the player's offline still.
"""
from __future__ import annotations

import base64
import gzip
import html
import json
import uuid
from functools import lru_cache
from pathlib import Path

import plotly
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer
from plotly.utils import PlotlyJSONEncoder

PLOTLY_MIME = "application/vnd.plotly.v1+json"
RENDERER = "speclab_offline"


@lru_cache(maxsize=1)
def plotly_js_gz() -> str:
    """plotly.min.js of the installed plotly, gzipped and base64-encoded (immutable: cached)."""
    js = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    return base64.b64encode(gzip.compress(js, compresslevel=9, mtime=0)).decode("ascii")


def loader_html() -> str:
    """A script that unpacks plotly.js into the page once (window.speclabPlotly: a promise)."""
    return ("<script>if(!window.speclabPlotly){window.speclabPlotly=(async()=>{if(window.Plotly)return;"
            f"const b=Uint8Array.from(atob('{plotly_js_gz()}'),c=>c.charCodeAt(0));"
            "const s=new Blob([b]).stream().pipeThrough(new DecompressionStream('gzip'));"
            "const js=await new Response(s).text();const e=document.createElement('script');"
            "e.textContent=js;document.head.appendChild(e);})();}</script>")


def figure_html(fig_dict: dict, config: dict | None = None) -> str:
    """A div and a script that draws the figure once plotly.js is in the page (no network)."""
    div = f"speclab-{uuid.uuid4().hex[:12]}"
    spec = json.dumps({"data": fig_dict.get("data", []), "layout": fig_dict.get("layout", {}),
                       "config": config or {"responsive": True}}, cls=PlotlyJSONEncoder)
    spec = spec.replace("</", "<\\/")                  # no "</script>" inside the script
    height = (fig_dict.get("layout") or {}).get("height") or 450
    return (f'<div id="{div}" class="speclab-offline-figure" style="width:100%;height:{int(height)}px"></div>'
            f"<script>(window.speclabPlotly||Promise.resolve()).then(()=>{{const f={spec};"
            f"Plotly.newPlot('{div}',f.data,f.layout,f.config);}});</script>")


class OfflineRenderer(MimetypeRenderer):
    """plotly's interactive mimetype plus the self-contained HTML copy (plotly.js with the first)."""

    def __init__(self):
        # a dict, not a flag: plotly copies a renderer (shallowly) for every figure it shows, and
        # every copy must see that this kernel already sent plotly.js
        self.state = {"sent": False}

    def to_mimebundle(self, fig_dict: dict) -> dict:
        head = "" if self.state["sent"] else loader_html()
        self.state["sent"] = True
        interactive = json.loads(json.dumps(dict(fig_dict, config={}), cls=PlotlyJSONEncoder))
        return {PLOTLY_MIME: interactive, "text/html": head + figure_html(fig_dict)}

    def html(self, fig_dict: dict) -> str:
        """Only the HTML copy (with plotly.js if this kernel has not sent it yet)."""
        return self.to_mimebundle(fig_dict)["text/html"]


def renderer() -> OfflineRenderer:
    """The kernel's offline renderer, registered in plotly's renderers on first use."""
    r = pio.renderers[RENDERER] if RENDERER in pio.renderers else None
    if not isinstance(r, OfflineRenderer):
        r = OfflineRenderer()
        pio.renderers[RENDERER] = r
    return r


def keep_figures() -> OfflineRenderer:
    """Make every plotly figure shown from here on (a cell's last value, fig.show()) emit the
    offline HTML copy beside the interactive output; returns the renderer."""
    r = renderer()
    pio.renderers.default = RENDERER
    return r


def offline_html(*figs, note: str = "") -> str:
    """The HTML copy of figures (Figures, FigureWidgets or dicts) through the kernel's renderer,
    under an optional note: what a widget shows where no widget can run."""
    parts = [f"<p style='font-size:90%;color:#555'>{html.escape(note)}</p>"] if note else []
    for fig in figs:
        parts.append(renderer().html(fig if isinstance(fig, dict) else fig.to_plotly_json()))
    return "".join(parts)
