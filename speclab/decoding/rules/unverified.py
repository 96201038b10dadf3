"""`unverified`: every drafted token stands; the target only reads them (FoReaL's handoff, lossy).

FoReaL-Decoding (Li et al. 2025, "What makes Reasoning Models Different? Follow the Reasoning Leader
for Efficient Decoding") has no verification: the draft model finishes a sentence the leader began,
and its words are kept. On the engine's round that is a rule that accepts every candidate:

    test(p, q, x, u):  accepted = True for every x;  residual = p (never read: nothing is rejected)

The verify forward still runs over the chain, because the leader's cache must hold the draft's
sentence before it writes the next one, and the round's bonus, drawn from p after the last draft
token as in every round, is the leader's first token of the next sentence. The walk records exact's
verdict beside this one (the same uniform draw), so a node the exact rule would have rejected is a
token where the draft and the leader part ways: the paper's token-level misalignment. Each test
records the leader's own greedy token there (`top`).

LUD (Sun et al. 2024) keeps the same way the tail of a lexical unit its placeholders guessed
(decoding/drafters/lud.py): the model's next-token rows read it, and exact's verdict beside says
where a guess and the model's own token part.

`induced` (the bench's TV column): a round's first token is x ~ q, always kept, so its law is q
(nothing drafted: p itself); exact, no slack.
"""
from __future__ import annotations

import torch

from speclab.decoding.rules.base import Rule, register_rule


def test(p, q, x, u, params, given=None):
    """Every candidate accepted; the inputs name the target's greedy token at each (given.top)."""
    ok = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    inputs = [dict(top=int(t)) for t in given.top.tolist()]
    return ok, p, dict(threshold=[0.0] * len(x), inputs=inputs)


def induced(P, q, params: dict, model=None):
    """The first token's law: q where a token was drafted, P where none was; (dist, 0.0)."""
    return (P.float() if q is None else q.to(P).float()), 0.0


UNVERIFIED = register_rule(Rule(
    name="unverified", guarantee="lossy", test=test, induced=induced, reads=("top",), only_for=("foreal", "lud"),
    summary="every draft token kept unverified, the target only reading them; exact's verdict recorded beside "
            "(FoReaL-Decoding's sentence handoff, Li et al. 2025)"))
