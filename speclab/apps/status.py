"""What the player shows besides its figures: tips for its buttons and one status line per run."""
from __future__ import annotations

import html

from speclab.apps import runs
from speclab.metrics import n_steps, token_alpha
from speclab.trace import Trace

PLAYER_TIPS = {"slower": "play slower", "first": "first {}", "previous": "previous {}", "reverse": "play backwards",
               "pause": "pause", "play": "play", "next": "next {}", "last": "last {}", "faster": "play faster"}


def player_css(step_name: str) -> str:
    """Tooltips for the player's buttons (its model gives them no title), and words instead of the
    "-" / "+" icons, which change the playback speed, not the step."""
    tip = ("content: '{}'; position: absolute; top: 105%; left: 50%; transform: translateX(-50%); z-index: 10; "
           "background: #333; color: white; padding: 2px 6px; border-radius: 3px; font-size: 12px; "
           "white-space: nowrap; pointer-events: none;")
    rules = ["button { position: relative; }", "button.slower svg, button.faster svg { display: none; }",
             "button.slower::before { content: 'slower'; } button.faster::before { content: 'faster'; }"]
    rules += [f"button.{b}:hover::after {{ {tip.format(t.format(step_name))} }}" for b, t in PLAYER_TIPS.items()]
    return "\n".join(rules)


def visible_text(text: str) -> str:
    """Line breaks and tabs as marks, so an output of blank lines still shows on one line."""
    return html.escape(text.replace("\n", "⏎").replace("\t", "⇥")) or "∅"


def status_html(trace: Trace) -> str:
    """One line about the run, built from the trace alone (so it shows what really ran)."""
    t = trace.totals
    a = token_alpha(trace.rounds)
    alpha = "-" if a is None else f"{a:.2f}"
    models = ", ".join(f"{role} {m.name} ({m.runs_on()})" for role, m in trace.models.items())
    if trace.steps_row().canvas:        # no draft: one model checks its own parallel proposals
        stats = f"{t.new_tokens} new tokens in {t.target_forwards} forwards ({t.tau:.2f} tokens per forward)"
    elif trace.dag is not None:         # no draft, no rounds: one forward, then a path through the DAG
        stats = f"{t.new_tokens} output tokens from {t.target_forwards} forward(s)"
        if trace.dag is not None:
            run = trace.dag
            path = run.paths.get(run.chosen, [])
            stats += (f"; strategy {html.escape(run.chosen)}: a path through {len(path)} of {run.num_vertices} "
                      f"vertices ({len(run.paths)} strateg{'y' if len(run.paths) == 1 else 'ies'} decoded"
                      + (f", {sum(run.valid.values())} of {len(run.valid)} with a valid answer" if run.valid else "")
                      + ")")
    else:
        stats = (f"{t.new_tokens} new tokens, tau {t.tau:.2f}, alpha {alpha} (per judged draft token), "
                 f"{t.accepted} of {t.drafted} drafted tokens kept, target forwards {t.target_forwards}, "
                 f"draft forwards {t.draft_forwards}")
    T = trace.sampling.temperature
    if trace.dag is not None:           # one forward; only the sampling strategy draws, at its own T
        chosen = trace.dag.chosen if trace.dag is not None else ""
        stats += f", sampled at T = {T:g}" if chosen == "sample" and T else ""
    else:
        stats += ", greedy" if not T else f", sampled at T = {T:g}"
    return (f"<b>{html.escape(trace.method)}</b> ({html.escape(models)}): "
            f"prompt <code class='speclab-prompt-echo'>{visible_text(runs.prompt_text(trace))}</code> &rarr; "
            f"<code class='speclab-output'>{visible_text(runs.output_text(trace))}</code><br>"
            f"{stats}, wall {t.wall_s:.2f} s, {n_steps(trace)} step(s)" + batched(trace))


def batched(trace: Trace) -> str:
    """A run decoded in a batch with others (the server batches pages' runs of one method and
    model): its output is its run alone, its times are the batch's."""
    size = trace.params.get("batch_size")
    if not isinstance(size, int) or size < 2:
        return ""
    return f"; decoded in a batch of {size} runs (its output is its own run's, its times the batch's)"
