"""What a step is called and how it is numbered, defined once for every view (figure titles,
hovers, the players' labels, the detail panel, the export's slider).

Steps are 0-based indices in code (`trace.rounds[step]`) and 1-based wherever a person reads
them: "round 3 of 20" is `trace.rounds[2]`. n_steps (speclab.metrics) says how many there are; go_to_step is where a control that moves the
step lands.
"""
from __future__ import annotations

from speclab.metrics import n_steps
from speclab.trace import Trace


def step_label(trace: Trace) -> str:
    """What one step is called on a slider: its engine row's noun (trace.Steps)."""
    return trace.steps_row().noun


def step_names(trace: Trace) -> list[str]:
    """Slider labels: the engine row's names where it has them (a DAG's strategies), 1-based numbers otherwise."""
    names = trace.steps_row().names
    return names(trace) if names is not None else [str(k + 1) for k in range(n_steps(trace))]


def step_title(trace: Trace, step: int) -> str:
    """Step `step` (0-based) as people read it: "round 3 of 20", "strategy viterbi (2 of 6)"."""
    n = n_steps(trace)
    step %= n
    if trace.steps_row().names is not None:
        return f"{step_label(trace)} {step_names(trace)[step]} ({step + 1} of {n})"
    return f"{step_label(trace)} {step + 1} of {n}"


def go_to_step(trace: Trace, now: int, by: int | str = 0) -> int:
    """Where a control lands from step `now` (0-based): `by` steps on (1 next, -1 back) or "first" /
    "last", kept within the run. What a player's slider, keys and buttons all call."""
    last = max(n_steps(trace) - 1, 0)
    step = {"first": 0, "last": last}[by] if isinstance(by, str) else int(now) + int(by)
    return min(max(step, 0), last)
