"""What a decoding method's output is held to: one word per method and rule, the strongest first.

Every front end shows it (`speclab methods`, the dashboard, the bench, the trace's `guarantee`), and
a test per word holds the methods to it: identical-to-ar by greedy equality and the sampling test,
identical-to-one-per-step by FreeDave's equality with one-token-per-step decoding.
"""
from __future__ import annotations

GUARANTEES = {
    "identical-to-ar": "greedy: identical to ar token for token in the same dtype; sampling: the target's "
                       "distribution, exactly",
    "identical-to-one-per-step": "identical to greedy one-token-per-step decoding of the same diffusion LM",
    "deterministic": "reproducible from its seed, but held to no reference decoder",
    "lossy": "trades fidelity for speed: its quality is measured against the reference",
}
LOSSLESS = ("identical-to-ar", "identical-to-one-per-step")


def check(what: str, value: str) -> str:
    if value not in GUARANTEES:
        raise ValueError(f"{what}: guarantee must be one of {', '.join(GUARANTEES)}, got {value!r}")
    return value


def weakest(*values: str) -> str:
    """The weakest of several guarantees (a lossy rule makes any method lossy)."""
    order = list(GUARANTEES)
    return max(values, key=order.index)
