"""One view spec per engine: which figures a step, the run strip and the summary get, and at what
size. The Jupyter player (speclab/widgets/player.py), the dashboard (speclab/apps/viewer.py) and the
static export (speclab/export.py) read these specs and nothing else, so a figure added here, or by a method
through `add_figure`, shows up in all three.

    VIEWS[engine]                  the engine's View: step figures (the main one first), run strip,
                                   summary figures each with its height, whether it has a mask view
    add_view(view)                 a new engine's View (added_view for a `with` block; remove_view)
    view_of(trace)                 the View for one trace: its engine's figures whose data the trace
                                   holds (decisions, lanes, verdicts show only where recorded), plus
                                   the figures its method added
    add_figure(method, spec)       a method's own figure, for traces of that method only;
    added_figure(method, spec)     the same for a `with` block (tests); remove_figure undoes it
    step_dict / step_figure        the main step figure (a dict for frames, a Figure)
    update_step(fig, trace, step)  a drawn main step figure moved to `step` in place
    run_strip(trace, step)         the run at a glance with `step` marked (None: the engine has none)
    go_to_step, step_title, ...    how steps are numbered and moved: figures.steps, re-exported here

A figure is a pure function `fn(trace, step) -> plotly Figure` (or None: nothing to draw for this
run). Step figures draw step `step` (0-based) and keep their trace count and height over the run,
so a player redraws them in place; summary figures draw the whole run with a "current" marker at
`step` (None: unmarked, as the export draws them) that a player moves without redrawing.

A method adds its own figure in the file that defines it, beside its registry row:

    from speclab.figures.views import FigureSpec, add_figure
    add_figure("my-method", FigureSpec("drafts kept", kept_figure, where="summary", height=300))
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

import plotly.graph_objects as go

from speclab.figures.compose import STEP_LAYOUT_KEYS, dag_dict, move_current, round_dict, update_figure
from speclab.figures.costmodel import costmodel_summary
from speclab.figures.decisions import decision_summary, decision_table, has_decisions
from speclab.figures.diffusion import canvas_dict, confidence_bands, decoding_order
from speclab.figures.lanes import has_lanes, lanes_figure
from speclab.figures.mask import mask_size
from speclab.figures.steps import go_to_step, step_label, step_names, step_title  # numbering, defined there
from speclab.figures.summary import acceptance_summary, round_strip, timing
from speclab.figures.verdicts import has_verdicts, rescued_figure
from speclab.trace import Trace, TraceError
from speclab.scoped import scoped

WHERE = ("step", "summary")
# the attention mask is a grid of slots x slots, redrawn at every step: past 512 (a quarter of a
# million cells) it takes seconds a step and its cells are too small to read, so such runs have none
MASK_MAX_SLOTS = 512
FIXED_LAYOUT = ("template", "height", "width", "margin")      # what stepping never changes


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a view and how the front ends lay it out."""
    name: str                                   # unique within a view; front ends key panes by it
    fn: Callable                                # fn(trace, step) -> go.Figure | None
    where: str = "summary"                      # "step": one step, redrawn as the step moves;
                                                # "summary": the whole run, its "current" marker moved
    height: int | None = None                   # px of the dashboard's pane; None: the figure's own + 20
    when: Callable[[Trace], bool] | None = None  # shown only for traces this says yes to (None: always)
    frame: Callable | None = None               # frame(trace, step, static) -> dict: a step figure as a
                                                # plain dict, None for traces that never change when
                                                # static=False (what frames and players send)
    redraw: bool = False                        # a summary figure redrawn at every step (its marker
                                                # is more than a line: the lanes' current spans)

    def __post_init__(self):
        if self.where not in WHERE:
            raise ValueError(f"figure {self.name!r}: where must be one of {WHERE}, got {self.where!r}")

    def applies(self, trace: Trace) -> bool:
        return self.when is None or bool(self.when(trace))

    def draw(self, trace: Trace, step: int | None = 0) -> go.Figure | None:
        return self.fn(trace, step)

    def at(self, trace: Trace, step: int, static: bool = True) -> dict:
        """The figure at `step` as a plain {"data", "layout"} dict (frames, in-place updates)."""
        if self.frame is not None:
            return self.frame(trace, step, static)
        d = self.fn(trace, step).to_plotly_json()
        d["layout"].pop("template", None)
        return d

    def moving_keys(self, d: dict) -> tuple:
        """The layout keys a step changes: the main step figures name theirs; others all but the size."""
        return STEP_LAYOUT_KEYS if self.frame is not None else tuple(k for k in d["layout"] if k not in FIXED_LAYOUT)

    def follow(self, fig: go.Figure, trace: Trace, step: int) -> go.Figure:
        """Move `fig` (drawn by this spec for `trace`) to `step` in place: what players call."""
        if self.where == "summary" and not self.redraw:
            return move_current(fig, step)
        d = self.at(trace, step, static=False)
        return update_figure(fig, d, self.moving_keys(d))

    def pane_height(self, fig: go.Figure) -> int:
        return self.height or int(fig.layout.height or 450) + 20


@dataclass(frozen=True)
class View:
    """What an engine's traces show: a step view, a run strip, a summary, maybe a mask view."""
    engine: str
    step: tuple[FigureSpec, ...]                # the main step figure first: the one the export animates
    run_strip: FigureSpec | None = None         # the run at a glance under the step view, first in a summary
    summary: tuple[FigureSpec, ...] = ()
    mask: bool = False                          # the attention mask of a step's forward (figures.mask)

    @property
    def main(self) -> FigureSpec:
        return self.step[0]

    @property
    def whole_run(self) -> tuple[FigureSpec, ...]:
        """The run strip (where there is one) and the summary figures: a Summary tab, the export."""
        return ((self.run_strip,) if self.run_strip is not None else ()) + self.summary


def figure_from(frame: Callable) -> Callable:
    """fn(trace, step) -> Figure from a frame(trace, step, static) -> dict."""
    return lambda trace, step=0: go.Figure(frame(trace, 0 if step is None else step))


def step_view(name: str, frame: Callable) -> FigureSpec:
    return FigureSpec(name, figure_from(frame), "step", frame=frame)


# -- figures of any engine, shown where the trace recorded what they draw ---------------------------
DECISIONS = FigureSpec("decisions", decision_table, "step", when=has_decisions)
DECISIONS_OVER_RUN = FigureSpec("decisions over the run", decision_summary, when=has_decisions)
LANES = FigureSpec("timing lanes", lanes_figure, when=has_lanes, redraw=True)

VIEWS = {
    "speculative": View(
        "speculative", step=(step_view("round", round_dict), DECISIONS),
        run_strip=FigureSpec("tokens per round", round_strip, height=260),
        summary=(FigureSpec("acceptance", acceptance_summary, height=380),
                 FigureSpec("timing", timing, height=300),
                 FigureSpec("cost model", costmodel_summary, height=380),
                 FigureSpec("rescued tokens", rescued_figure, height=280, when=has_verdicts),
                 DECISIONS_OVER_RUN, LANES),
        mask=True),
    "diffusion": View(       # heights None: the canvas and the order map grow with the run
        "diffusion", step=(step_view("canvas", canvas_dict), DECISIONS),
        run_strip=FigureSpec("confidence bands", confidence_bands),
        summary=(FigureSpec("decoding order", decoding_order), DECISIONS_OVER_RUN, LANES),
        mask=True),
    "dag": View("dag", step=(step_view("strategies", dag_dict),), summary=(LANES,)),
}

__all__ = ["FigureSpec", "View", "VIEWS", "view_of", "add_view", "added_view", "remove_view", "add_figure", "added_figure", "remove_figure", "step_dict",
           "step_figure", "update_step", "run_strip", "go_to_step", "step_label", "step_names", "step_title"]

# method name -> the figures it added (add_figure); shown for traces of that method only
METHOD_FIGURES: dict[str, tuple[FigureSpec, ...]] = {}


def engine_view(trace: Trace) -> View:
    if trace.engine not in VIEWS:
        raise ValueError(f"no view for the {trace.engine!r} engine (views exist for {', '.join(VIEWS)})")
    return VIEWS[trace.engine]


def view_of(trace: Trace) -> View:
    """The figures this trace shows: its engine's, less those whose data it did not record, plus
    its method's own."""
    base, own = engine_view(trace), METHOD_FIGURES.get(trace.method, ())
    keep = lambda specs, where: tuple(f for f in specs + tuple(f for f in own if f.where == where) if f.applies(trace))
    strip = base.run_strip if base.run_strip is not None and base.run_strip.applies(trace) else None
    mask = base.mask and mask_size(trace) <= MASK_MAX_SLOTS
    return replace(base, step=keep(base.step, "step"), run_strip=strip, summary=keep(base.summary, "summary"),
                   mask=mask)


def add_view(view: View) -> View:
    """The view spec of a new engine (decoding/engines.register_engine adds the engine itself): the
    player, the dashboard and the export show its traces with these figures."""
    if view.engine in VIEWS:
        raise ValueError(f"the {view.engine!r} engine already has a view: remove_view it first")
    VIEWS[view.engine] = view
    return view


def remove_view(engine: str) -> None:
    VIEWS.pop(engine, None)


def added_view(view: View):
    """add_view for the length of a `with` block (a test's engine)."""
    return scoped(add_view, remove_view, view, view.engine)


def add_figure(method: str, spec: FigureSpec) -> FigureSpec:
    """Show `spec` for every trace of `method` (a registry name), after its engine's figures."""
    mine = METHOD_FIGURES.get(method, ())
    if any(f.name == spec.name for f in mine):
        raise ValueError(f"{method!r} already has a figure named {spec.name!r}; remove_figure it first")
    METHOD_FIGURES[method] = mine + (reading_records(method, spec),)
    return spec


# A method's own figure reads records only that method writes (a round's info, a decision's inputs),
# which the trace schema leaves free-form, so loading cannot check them. A hand-edited or damaged
# file, or another method's trace saved under this method's name, breaks the figure with one of
# these; every view reports it as the trace's fault, in one line, naming the figure.
RECORD_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError)


def reading_records(method: str, spec: FigureSpec) -> FigureSpec:
    """`spec` with a failure of its figure on records it cannot read raised as one TraceError."""
    def guarded(fn: Callable | None) -> Callable | None:
        if fn is None:
            return None

        @functools.wraps(fn)
        def run(*args):
            try:
                return fn(*args)
            except TraceError:
                raise
            except RECORD_ERRORS as e:
                why = (str(e).splitlines() or [""])[0][:120]
                raise TraceError(f"the {method} records in this trace do not fit its figure {spec.name!r} "
                                 f"({type(e).__name__}: {why}); re-record the run") from e
        return run
    return replace(spec, fn=guarded(spec.fn), when=guarded(spec.when), frame=guarded(spec.frame))


def remove_figure(method: str, name: str) -> None:
    left = tuple(f for f in METHOD_FIGURES.get(method, ()) if f.name != name)
    if left:
        METHOD_FIGURES[method] = left
    else:
        METHOD_FIGURES.pop(method, None)


def added_figure(method: str, spec: FigureSpec):
    """add_figure for the length of a `with` block (what a test, or a notebook cell, wants)."""
    return scoped(lambda s: add_figure(method, s), lambda name: remove_figure(method, name), spec, spec.name)


# PEARL's lanes over its modes (figures.pearl imports no view, so it is wired here)
from speclab.figures.pearl import has_pearl_lanes, pearl_figure  # noqa: E402
add_figure("pearl", FigureSpec("lanes and modes", pearl_figure, when=has_pearl_lanes, redraw=True))
# SpecDec++'s head against the target and its draft lengths (figures.specdecpp imports no view)
from speclab.figures.specdecpp import has_stop_decisions, stopping_figure  # noqa: E402
add_figure("specdec++", FigureSpec("stopping rule", stopping_figure, when=has_stop_decisions, height=360))
# dllm-draft's block filled forward by forward, over the verify's verdicts (figures.dllm_draft imports no view)
from speclab.figures.dllm_draft import block_fill_figure, has_block_fill  # noqa: E402
add_figure("dllm-draft", FigureSpec("block filling", block_fill_figure, "step", when=has_block_fill))
add_figure("flexdraft", FigureSpec("block filling", block_fill_figure, "step", when=has_block_fill))
# OSD's acceptance over the rounds, its draft updates marked, the draft version (figures.osd imports no view)
from speclab.figures.osd import has_osd_versions, osd_figure  # noqa: E402
add_figure("osd", FigureSpec("online draft", osd_figure, when=has_osd_versions, height=380))
# synthetic acceptance: the profile asked for against the verify's (figures.synthetic imports no view)
from speclab.figures.synthetic import has_synthetic, synthetic_figure  # noqa: E402
add_figure("synthetic", FigureSpec("acceptance profile", synthetic_figure, when=has_synthetic, height=380,
                                   redraw=True))


# -- the main step figure and the run strip, for any engine ----------------------------------------
def step_dict(trace: Trace, step: int = 0, static: bool = True) -> dict:
    """The main step figure as a plain {"data", "layout"} dict, unvalidated: what export frames are
    made of. static=False puts None for traces that are the same at every step, so players and
    frames skip them."""
    return engine_view(trace).main.at(trace, step, static)


def step_figure(trace: Trace, step: int = 0) -> go.Figure:
    """Everything about one step in one figure: the token strip over the draft tree (speculative),
    the canvas over its confidences (diffusion), every strategy's path (dag)."""
    return go.Figure(step_dict(trace, step))


def update_step(fig: go.Figure, trace: Trace, step: int) -> go.Figure:
    """`fig` (made by step_figure for this trace) moved to `step` in place."""
    return engine_view(trace).main.follow(fig, trace, step)


def run_strip(trace: Trace, step: int = 0) -> go.Figure | None:
    """The whole run at a glance with `step` marked (None where the engine has none: a DAG is its
    own whole run)."""
    spec = engine_view(trace).run_strip
    return spec.draw(trace, step) if spec is not None else None
