"""Figures: pure functions (trace, step, options) -> plotly Figure, shared by every view.

No UI toolkit here: the Jupyter widgets, the Panel app and the HTML export all call these. Every
figure draws with traces only (no layout shapes) and keeps the same number of traces for every
step, so a player can update a figure in place and an export can animate it with frames.

    token_strip(trace, step)       the output coloured by origin; `step` outlines one round
    draft_tree(trace, step)        one round's draft tree, decisions and accepted path
    step_figure(trace, step)       token strip over draft tree (speculative) or the DAG (dag)
    round_strip(trace, step)       tokens per round for the whole run, `step` marked
    acceptance_summary(trace)      accepted length strip, histogram, per-position acceptance
    timing(trace)                  draft vs verify seconds per round
    compare_chart(runs, reference) tokens per second per run, speed-up over the baseline on each bar
    dag_figure(trace, step)        a DAG run with each strategy's path; `step` highlights one
    canvas_figure(trace, step)     a diffusion canvas after one denoising step, over the confidence
                                   of its masked positions (block shaded, threshold line)
    decoding_order(trace, step)    position x step confidence heatmap, marked where committed
    confidence_bands(trace, step)  min / median / max confidence and commits per denoising step
    run_strip(trace, step)         the run at a glance under a step view (round strip or bands)
    mask_figure(trace, step)       the attention mask a step's forward used (a verify's tree mask,
                                   a diffusion step's block-causal or bidirectional mask)
    step_title(trace, step)        "round 3 of 20": how every view numbers a step (1-based)
    go_to_step(trace, now, by)     where a control moving the step lands (next, back, first, last)
    detail_html(trace, step)       everything recorded about one step, as an HTML table
    update_step(fig, trace, step)  a step figure moved to another step in place (players)
    decision_table / decision_summary   policy decisions of a step / over the run (any method)
    lanes_figure(trace, step)      timing lanes (drafting beside verifying) as a Gantt chart
    rescued_figure(trace, step)    draft tokens a lossy rule accepted where the exact rule did not
    handoff_figure(trace, step)    per round the leader's token and the draft's, split by whether the
                                   leader would have written them (FoReaL; figures/foreal.py)
    length_figure(trace, step)     a learned length policy's features, choices and accepted tokens
                                   (SpecKV; figures/speckv.py)
    skip_mask_figure(trace, step)  layers x rounds: which layers each round's draft or forward ran,
                                   over its accepted length (every trace holding skip masks)
    router_figure(trace, step)     per layer the router's score for the prompt and the skip mask it chose,
                                   once per request (FiRST; figures/first.py)
    stream_figure(trace, step)     per layer the agreement with the final layer, plain exits against the
                                   accelerated stream, and each drafted token's exit layer (M2R2; figures/m2r2.py)
    subdraft_figure(trace, step)   per sub-draft depth of a sorted draft, its acceptance on this target, and
                                   the depth drafted from round by round (S2D; figures/s2d.py)
    lud_figure(trace, step)        a round's placeholders against the threshold, where its lexical unit ended,
                                   and the run's units by length (LUD; figures/lud.py)
    certainty_figure(trace, step)  slots x steps: each masked slot's entropy until it committed under the
                                   threshold or was forced, and the steps each slot used (dParallel;
                                   figures/dparallel.py)
    slice_figure(trace, step)      rounds x context positions: the retrieved slice a RAG drafter reads
                                   against the target's whole context (RAPID; figures/rapid.py)
    transfer_figure(trace, step)   per future offset, how often the transferred hidden state's top-1 is the
                                   token the target then wrote, and the transfer layer (Hidden Transfer)
    fusion_figure(trace, step)     a fused retrieval + draft tree coloured by each node's origin, the
                                   retrieved branches pruned beside it (RASD; figures/rasd.py)
    beam_frame(trace, step)        Superposed Decoding's k drafts side by side with their scores, one
                                   step's beam; candidates_html / weights_figure: its candidate table
                                   and superposition weights (figures/superposed.py)
    view_of(trace), add_figure     which figures a trace shows (figures.views: one spec per engine,
                                   the figures a method adds); every front end reads it
"""
from speclab.figures.compose import move_current, n_steps, update_figure
from speclab.figures.compare import compare_chart
from speclab.figures.dag import dag_figure
from speclab.figures.detail import detail_html
from speclab.figures.diffusion import canvas_figure, confidence_bands, decoding_order
from speclab.figures.mask import mask_figure
from speclab.figures.decisions import decision_summary, decision_table
from speclab.figures.lanes import lanes_figure
from speclab.figures.steps import go_to_step, step_label, step_names, step_title
from speclab.figures.summary import acceptance_summary, calibration_figure, per_position, round_strip, timing
from speclab.figures.skips import skip_mask_figure  # importing it adds the skip-mask record's figure
import speclab.figures.rsd_s  # noqa: F401,E402 (importing it adds the beam-search record's figure)
from speclab.figures.tokens import cells, token_strip
from speclab.figures.tree import draft_tree
from speclab.figures.verdicts import rescued_figure
from speclab.figures.views import (FigureSpec, View, add_figure, added_figure, remove_figure, run_strip, step_dict,
                                   step_figure, update_step, view_of)

__all__ = ["token_strip", "draft_tree", "step_figure", "round_strip", "acceptance_summary", "timing",
           "calibration_figure",
           "dag_figure", "per_position", "cells", "n_steps", "step_dict", "canvas_figure", "decoding_order",
           "confidence_bands", "run_strip", "step_label", "step_names", "step_title", "detail_html",
           "update_figure", "update_step", "move_current", "compare_chart", "mask_figure", "go_to_step",
           "decision_table", "decision_summary", "lanes_figure", "rescued_figure", "FigureSpec", "View",
           "view_of", "add_figure", "added_figure", "remove_figure", "skip_mask_figure"]
