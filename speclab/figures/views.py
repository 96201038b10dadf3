"""One view spec per engine: which figures a step, the run strip and the summary get, and at what
size. The Jupyter player (speclab/widgets/player.py), the dashboard (speclab/apps/viewer.py) and the
static export (speclab/export.py) read these specs and nothing else, so a figure added here, or by a method
through `add_figure`, shows up in all three.

    VIEWS[engine]                  the engine's View: step figures (the main one first, then the
                                   detail table, decisions, p / q, the mask), run strip, summary
                                   figures each with its height
    add_view(view)                 a new engine's View (added_view for a `with` block; remove_view)
    lesson_of(trace)               the run's lesson, its engine's View's (figures.lessons): the steps
                                   the dashboard, the player and the export walk
    view_of(trace)                 the View for one trace: its engine's figures whose data the trace
                                   holds (decisions, lanes, verdicts show only where recorded), plus
                                   the figures its method added
    add_record_figure(spec)        a figure of a typed record (speclab.records): shown for every
                                   trace that holds the record, whatever method wrote it
    added_record_figure(spec)      the same for a `with` block; remove_record_figure undoes it
    add_figure(method, spec)       a figure for traces of one method only (a notebook's own);
    added_figure(method, spec)     the same for a `with` block (tests); remove_figure undoes it
    step_dict / step_figure        the main step figure (a dict for frames, a Figure)
    update_step(fig, trace, step)  a drawn main step figure moved to `step` in place
    run_strip(trace, step)         the run at a glance with `step` marked (None: the engine has none)
    go_to_step, step_title, ...    how steps are numbered and moved: figures.steps, re-exported here

A figure is a pure function `fn(trace, step) -> plotly Figure` (or None: nothing to draw for this
run), or, of kind "html", `fn(trace, step) -> str` (the step's detail table). Step figures draw step
`step` (0-based) and keep their trace count and height over the run, so a player redraws them in
place, unless `fresh` (p and q, the attention mask: their size changes with the step, so each step
is drawn anew); summary figures draw the whole run with a "current" marker at `step` (None:
unmarked, as the export draws them) that a player moves without redrawing. `folded` ones (the
mask) are shown on request: an accordion, a checkbox, a <details>. Every front end shows every
spec of the view, in its order: the detail table, p / q, the mask and the cost model explorer are
specs like any other, so the player, the dashboard and the export show the same set.

A method's own figure follows the record it draws, declared beside the drafter that writes it:

    from speclab.figures.views import FigureSpec, add_record_figure
    add_record_figure(FigureSpec("beam per level", beam_figure, record=BeamLevel, height=300))
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

import plotly.graph_objects as go

from speclab import records
from speclab.figures.compose import STEP_LAYOUT_KEYS, dag_dict, move_current, round_dict, update_figure
from speclab.figures.costmodel import costmodel_explorer_figure, costmodel_summary, trace_model
from speclab.figures.decisions import decision_summary, decision_table, has_decisions
from speclab.figures.detail import detail_html
from speclab.figures.diffusion import canvas_dict, confidence_bands, decoding_order
from speclab.figures.distributions import distributions
from speclab.figures.lanes import has_lanes, lanes_figure
from speclab.figures.lessons import LessonStep, dag_lesson, diffusion_lesson, speculative_lesson
from speclab.figures.mask import mask_dict, mask_size
from speclab.figures.steps import go_to_step, step_label, step_names, step_title  # numbering, defined there
from speclab.figures.summary import acceptance_summary, round_strip, timing
from speclab.figures.superposed import beam_frame, candidates_html, has_weights, weights_figure
from speclab.figures.verdicts import has_verdicts, rescued_figure
from speclab.trace import Trace, TraceError
from speclab.scoped import scoped

WHERE = ("step", "summary")
KINDS = ("figure", "html")
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
    record: type | None = None                  # the typed record it draws (speclab.records): shown only
                                                # for traces that hold it (add_record_figure: for all such)
    kind: str = "figure"                        # "figure": fn gives a plotly Figure; "html": an HTML string
    fresh: bool = False                         # a step figure whose size changes with the step: drawn anew
    folded: bool = False                        # shown on request (an accordion, a checkbox, <details>)
    tempered: bool = False                      # fn(trace, step, temperature=T) re-tempers it (p and q)
    key: str = ""                               # a short id for pages and tests (css class speclab-KEY);
                                                # "" : the name, lower case, dashes for spaces

    def __post_init__(self):
        if self.where not in WHERE:
            raise ValueError(f"figure {self.name!r}: where must be one of {WHERE}, got {self.where!r}")
        if self.kind not in KINDS:
            raise ValueError(f"figure {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.record is not None and self.record.level not in records.LEVELS:
            raise ValueError(f"figure {self.name!r}: record must be a declared speclab.records type")

    @property
    def slug(self) -> str:
        return self.key or "-".join(self.name.lower().split())

    def applies(self, trace: Trace) -> bool:
        return ((self.record is None or records.holds(trace, self.record))
                and (self.when is None or bool(self.when(trace))))

    def draw(self, trace: Trace, step: int | None = 0):
        """The figure (kind "html": the HTML) at `step`, or None where it has nothing to draw."""
        return self.fn(trace, step)

    def at(self, trace: Trace, step: int, static: bool = True) -> dict:
        """The figure at `step` as a plain {"data", "layout"} dict (frames, in-place updates); a
        fresh figure with nothing to draw at this step is an empty one that says so."""
        if self.frame is not None:
            return self.frame(trace, step, static)
        fig = self.fn(trace, step)
        if fig is None:
            return dict(data=[], layout=dict(title=dict(text=f"{self.name}: nothing at this {trace.steps_row().noun}",
                                                        font=dict(size=13)), height=120,
                                             xaxis=dict(visible=False), yaxis=dict(visible=False)))
        d = fig.to_plotly_json()
        d["layout"].pop("template", None)
        return d

    def moving_keys(self, d: dict) -> tuple:
        """The layout keys a step changes: the main step figures name theirs; others all but the size
        (a fresh figure all, its size too)."""
        if self.frame is not None:
            return STEP_LAYOUT_KEYS
        return tuple(k for k in d["layout"] if k != "template" and (self.fresh or k not in FIXED_LAYOUT))

    def follow(self, fig: go.Figure, trace: Trace, step: int) -> go.Figure:
        """Move `fig` (drawn by this spec for `trace`) to `step` in place: what players call."""
        if self.where == "summary" and not self.redraw:
            return move_current(fig, step)
        d = self.at(trace, step, static=False)
        return update_figure(fig, d, self.moving_keys(d))     # a fresh one's other trace count: replaced

    def pane_height(self, fig: go.Figure) -> int:
        return self.height or int(fig.layout.height or 450) + 20


@dataclass(frozen=True)
class View:
    """What an engine's traces show: step figures, a run strip, a summary."""
    engine: str
    step: tuple[FigureSpec, ...]                # the main step figure first: the one the export animates
    run_strip: FigureSpec | None = None         # the run at a glance under the step view, first in a summary
    summary: tuple[FigureSpec, ...] = ()
    lesson: Callable[[Trace], list[LessonStep] | None] | None = None   # the family's lesson (figures.lessons)

    @property
    def main(self) -> FigureSpec:
        return self.step[0]

    @property
    def whole_run(self) -> tuple[FigureSpec, ...]:
        """The run strip (where there is one) and the summary figures: a Summary tab, the export."""
        return ((self.run_strip,) if self.run_strip is not None else ()) + self.summary

    @property
    def names(self) -> list[str]:
        """Every figure of the view, in the order front ends show them."""
        return [f.name for f in self.step + self.whole_run]

    def spec(self, name: str) -> FigureSpec | None:
        return next((f for f in self.step + self.whole_run if f.name == name), None)


def figure_from(frame: Callable) -> Callable:
    """fn(trace, step) -> Figure from a frame(trace, step, static) -> dict."""
    return lambda trace, step=0: go.Figure(frame(trace, 0 if step is None else step))


def step_view(name: str, frame: Callable) -> FigureSpec:
    return FigureSpec(name, figure_from(frame), "step", frame=frame)


# -- figures of any engine, shown where the trace recorded what they draw ---------------------------
DECISIONS = FigureSpec("decisions", decision_table, "step", when=has_decisions)
DECISIONS_OVER_RUN = FigureSpec("decisions over the run", decision_summary, when=has_decisions)
LANES = FigureSpec("timing lanes", lanes_figure, when=has_lanes, redraw=True)
# everything recorded about the step, as a table (a round's nodes, a step's slots, a strategy's path)
DETAIL = FigureSpec("step detail", lambda trace, step: detail_html(trace, 0 if step is None else step), "step",
                    kind="html", key="detail")


def has_pq(trace: Trace) -> bool:
    """p and q were recorded (record="full") for some round's draft node."""
    return trace.record == "full" and any(n.p_topk and n.q_topk for r in trace.rounds for n in r.nodes)


def _mask_fits(trace: Trace) -> bool:
    return mask_size(trace) <= MASK_MAX_SLOTS


# p and q of the round's first draft node at the temperature that ran (the dashboard re-tempers it)
PQ = FigureSpec("p and q", lambda trace, step, temperature=None: distributions(
    trace, 0 if step is None else step, temperature=temperature), "step", when=has_pq, fresh=True, tempered=True,
    key="dist")
# the attention mask the step's forward used: a verify's tree mask, a diffusion step's block mask
MASK = FigureSpec("attention mask", lambda trace, step: go.Figure(mask_dict(trace, 0 if step is None else step)),
                  "step", when=_mask_fits, fresh=True, folded=True, key="mask")
# alpha / k / c: this run's cost model, with sliders that work offline
COST_EXPLORER = FigureSpec("cost model explorer", lambda trace, step: costmodel_explorer_figure(
    m if (m := trace_model(trace))["c"] is not None else None), when=lambda t: trace_model(t) is not None, height=460)

VIEWS = {
    "speculative": View(
        "speculative", step=(step_view("round", round_dict), DETAIL, DECISIONS, PQ, MASK),
        run_strip=FigureSpec("tokens per round", round_strip, height=260),
        summary=(FigureSpec("acceptance", acceptance_summary, height=380),
                 FigureSpec("timing", timing, height=300),
                 FigureSpec("cost model", costmodel_summary, height=380), COST_EXPLORER,
                 FigureSpec("rescued tokens", rescued_figure, height=280, when=has_verdicts),
                 DECISIONS_OVER_RUN, LANES), lesson=speculative_lesson),
    "diffusion": View(       # heights None: the canvas and the order map grow with the run
        "diffusion", step=(step_view("canvas", canvas_dict), DETAIL, DECISIONS, MASK),
        run_strip=FigureSpec("confidence bands", confidence_bands),
        summary=(FigureSpec("decoding order", decoding_order), DECISIONS_OVER_RUN, LANES), lesson=diffusion_lesson),
    "dag": View("dag", step=(step_view("strategies", dag_dict), DETAIL), summary=(LANES,), lesson=dag_lesson),
    # Superposed Decoding: the k drafts side by side, the step's candidate table, the weights over the run
    "superposed": View("superposed", step=(step_view("drafts", beam_frame),
                                           FigureSpec("step detail", candidates_html, "step", kind="html", key="detail")),
                       summary=(FigureSpec("superposition weights", weights_figure, height=300, when=has_weights),)),
}

__all__ = ["FigureSpec", "View", "VIEWS", "view_of", "lesson_of", "LessonStep", "add_view", "added_view", "remove_view", "add_figure",
           "added_figure", "remove_figure", "add_record_figure", "added_record_figure", "remove_record_figure",
           "step_dict", "step_figure", "update_step", "run_strip", "go_to_step", "step_label", "step_names",
           "step_title"]

# method name -> the figures it added (add_figure); shown for traces of that method only
METHOD_FIGURES: dict[str, tuple[FigureSpec, ...]] = {}
# figures of typed records (add_record_figure): shown for every trace holding the record
RECORD_FIGURES: dict[str, FigureSpec] = {}


def engine_view(trace: Trace) -> View:
    if trace.engine not in VIEWS:
        raise ValueError(f"no view for the {trace.engine!r} engine (views exist for {', '.join(VIEWS)})")
    return VIEWS[trace.engine]


def view_of(trace: Trace) -> View:
    """The figures this trace shows: its engine's, less those whose data it did not record, plus
    its method's own."""
    base = engine_view(trace)
    own = tuple(RECORD_FIGURES.values()) + METHOD_FIGURES.get(trace.method, ())
    keep = lambda specs, where: tuple(f for f in specs + tuple(f for f in own if f.where == where) if f.applies(trace))
    strip = base.run_strip if base.run_strip is not None and base.run_strip.applies(trace) else None
    return replace(base, step=keep(base.step, "step"), run_strip=strip, summary=keep(base.summary, "summary"))


def lesson_of(trace: Trace | None) -> list[LessonStep] | None:
    """The lesson of a run (its engine's View declares it): the steps every front end walks; None
    where the engine has none or the run cannot show it (a run that never drafted)."""
    if trace is None or trace.engine not in VIEWS or VIEWS[trace.engine].lesson is None:
        return None
    return VIEWS[trace.engine].lesson(trace)


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


def add_record_figure(spec: FigureSpec) -> FigureSpec:
    """Show `spec` (its `record` set) for every trace that holds that record, after its engine's
    figures: the figure follows the data, whichever method wrote it."""
    if spec.record is None:
        raise ValueError(f"figure {spec.name!r} names no record: give FigureSpec(record=...) or use add_figure")
    if spec.name in RECORD_FIGURES:
        raise ValueError(f"a record figure named {spec.name!r} exists; remove_record_figure it first")
    RECORD_FIGURES[spec.name] = reading_records(f"{spec.record.name!r} record", spec)
    return spec


def remove_record_figure(name: str) -> None:
    RECORD_FIGURES.pop(name, None)


def added_record_figure(spec: FigureSpec):
    """add_record_figure for the length of a `with` block (a test's, a notebook cell's)."""
    return scoped(add_record_figure, remove_record_figure, spec, spec.name)


def add_figure(method: str, spec: FigureSpec) -> FigureSpec:
    """Show `spec` for every trace of `method` (a registry name), after its engine's figures (a
    figure of data only that method writes; a figure of a typed record: add_record_figure)."""
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


def reading_records(owner: str, spec: FigureSpec) -> FigureSpec:
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
                raise TraceError(f"the {owner} records in this trace do not fit its figure {spec.name!r} "
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


# the records' own figures (each figures module imports no view, so they are wired here): each shows
# for every trace holding its record, whichever method wrote it
from speclab.figures.pearl import has_pearl_lanes, pearl_figure  # noqa: E402
from speclab.figures.specdecpp import has_stop_decisions, stopping_figure  # noqa: E402
from speclab.figures.dllm_draft import block_fill_figure, has_block_fill  # noqa: E402
from speclab.figures.osd import has_osd_versions, osd_figure  # noqa: E402
from speclab.figures.synthetic import has_synthetic, synthetic_figure  # noqa: E402
from speclab.figures.graft import graft_figure, has_grafts  # noqa: E402
from speclab.figures.rapid import has_slices, slice_figure  # noqa: E402
from speclab.figures.rasd import fusion_figure, has_fusion  # noqa: E402
from speclab.figures.treefit import fit_figure, has_fits  # noqa: E402
from speclab.figures.foreal import handoff_figure, has_handoff  # noqa: E402
from speclab.figures.speckv import has_length_choices, length_figure  # noqa: E402
from speclab.figures.ete import ete_figure, has_ete  # noqa: E402
from speclab.figures.hidden_transfer import has_transfer, transfer_figure  # noqa: E402
from speclab.figures.peagle import block_figure, has_blocks  # noqa: E402
from speclab.figures.ppd import has_ppd_fit, ppd_figure  # noqa: E402
from speclab.figures.first import has_router_choice, router_figure  # noqa: E402
from speclab.figures.m2r2 import has_stream_exits, stream_figure  # noqa: E402
from speclab.figures.s2d import has_subdrafts, subdraft_figure  # noqa: E402
from speclab.figures.lud import has_units, lud_figure  # noqa: E402
from speclab.figures.dparallel import certainty_figure, has_entropy_commits  # noqa: E402
for _spec in (
        # PEARL's lanes over its modes
        FigureSpec("lanes and modes", pearl_figure, record=records.PearlMode, when=has_pearl_lanes, redraw=True),
        # a stopping rule's head against the target, and the draft lengths it chose (SpecDec++)
        FigureSpec("stopping rule", stopping_figure, record=records.StopReason, when=has_stop_decisions, height=360),
        # a block drafter's block filled forward by forward, over the verify's verdicts
        FigureSpec("block filling", block_fill_figure, "step", record=records.BlockFill, when=has_block_fill),
        # an online draft's acceptance over the rounds, its updates marked, its version
        FigureSpec("online draft", osd_figure, record=records.DraftVersion, when=has_osd_versions, height=380),
        # synthetic acceptance: the profile asked for against the verify's
        FigureSpec("acceptance profile", synthetic_figure, record=records.SyntheticRound, when=has_synthetic,
                   height=380, redraw=True),
        # a head's tree with a retrieved copy grafted in: accepted tokens by origin, grafts and prunes
        FigureSpec("head and copy", graft_figure, record=records.HeadCoverage, when=has_grafts, height=340),
        # a tree sized to the machine's verify costs: nodes kept, tokens expected and committed
        FigureSpec("tree fit", fit_figure, record=records.TreeFit, when=has_fits, height=340),
        # FoReaL's handoff: the leader's tokens, the draft's, and where the leader would differ
        FigureSpec("sentence handoff", handoff_figure, record=records.Handoff, when=has_handoff, height=340),
        # a learned length policy: the draft's features, the lengths chosen, what was accepted (SpecKV)
        FigureSpec("draft length choice", length_figure, record=records.DraftLength, when=has_length_choices,
                   height=380),
        # a RAG drafter's retrieved slice against the target's whole context, round by round (RAPID)
        FigureSpec("retrieved slice", slice_figure, record=records.RetrievedSlice, when=has_slices, height=360),
        # a retrieval tree pruned by the draft's q and fused with the draft's tree: nodes by origin (RASD)
        FigureSpec("retrieval fusion", fusion_figure, "step", record=records.RetrievalFusion, when=has_fusion,
                   fresh=True),
        # ETE's information meter: nats per round against the budget, cascades, rounds against NLL / B
        FigureSpec("information meter", ete_figure, record=records.EteRound, when=has_ete, height=580, redraw=True),
        # Hidden Transfer: each future offset's pseudo-state guess against what the target wrote, and layer l
        FigureSpec("transfer agreement", transfer_figure, record=records.TransferPrediction, when=has_transfer,
                   height=360),
        # a block drafted in one forward: each slot's q and verdict, each slot's acceptance over the run (P-EAGLE)
        FigureSpec("parallel block", block_figure, "step", record=records.ParallelBlock, when=has_blocks,
                   height=540),
        # PPD: acceptance by depth against the fit, the tree chosen for the machine, the rate per size
        FigureSpec("prompt-token tree", ppd_figure, "step", record=records.PpdFit, when=has_ppd_fit, height=380),
        # LUD: the round's placeholders against the threshold, where the unit ended; units by length
        FigureSpec("lexical units", lud_figure, "step", record=records.LexicalUnit, when=has_units, height=380),
        # FiRST: each layer's router score for this prompt against the threshold, and the mask it chose
        FigureSpec("layer routers", router_figure, record=records.RouterChoice, when=has_router_choice, height=380),
        # M2R2: per layer the agreement with the final layer, plain exits against the accelerated stream,
        # and the layer each drafted token exited after
        FigureSpec("accelerated stream", stream_figure, record=records.StreamExit, when=has_stream_exits,
                   height=380),
        # S2D: each sub-draft depth's acceptance on this target, the depth drafted from round by round
        FigureSpec("sub-draft depth", subdraft_figure, record=records.SubDraft, when=has_subdrafts, height=380),
        # dParallel: each slot's entropy step by step against the threshold, and the steps each slot used
        FigureSpec("certainty per slot", certainty_figure, record=records.EntropyCommit, when=has_entropy_commits,
                   height=540, redraw=True)):
    add_record_figure(_spec)


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
