"""`rapid`: RAPID's retrieval-augmented target (Chen et al., ICML 2025), lossy by design.

RAPID's RAG drafter (drafters/rapid.py) reads a retrieved slice of the prompt, and may know what the
long-context target misses. The paper moves the target toward it at inference time: one step of
distilling the draft's distribution q into the target's logits, whose gradient of KL(q || p) with
respect to the logits is p - q, and verifies against the result:

    p^     = softmax(log p + eta (q - p))         p, q: the warped target and draft distributions
    accept x ~ q with probability min(1, p^(x) / q(x))
    reject: resample from norm((p^ - q)+); all accepted: the bonus from p (nothing drafted there)

So the text follows p^, not p: tokens the draft is surer of than the target gain mass. eta = 0 is
the exact rule; speclab's default eta = 1 is its own (a logit moves by at most eta), not the paper's
tuned value. Sampling only: a greedy draft carries no q, and at T = 0 p^ would need the draft's
whole distribution there. The paper's rule is one of a chain (a rejection's residual is p^'s, and a
second sibling would enrich it again), so it verifies `rapid`'s chains only. Each test records p(x),
q(x) and p^(x) (`p_tilde`); `exact` is decided with the same draw, so a token accepted here and
rejected there is one the draft's knowledge rescued.

`induced` (the bench's TV column): speculative sampling against p^ emits p^ exactly, so a round's
first token follows p^ (nothing drafted: p); TV(p^, p) is the rule's price a step, with no slack.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import accept_mask, pick, residual_rows
from speclab.decoding.rules.base import Rule, register_rule


def enrich(p: torch.Tensor, q: torch.Tensor, eta: float) -> torch.Tensor:
    """p^ = softmax(log p + eta (q - p)) per row (..., V): zero where p is (top-k / top-p cut)."""
    return (p.log() + eta * (q - p)).softmax(-1)


def prepare(params: dict, model=None) -> dict:
    eta = float(params["eta"])
    if not 0 <= eta <= 100:
        raise ValueError(f"rapid takes 0 <= eta <= 100 (the step toward the draft, in logits), got {eta}")
    return dict(eta=eta)


def test(p, q, x, u, params, given=None):
    """The speculative-sampling test and its residual, against p^ instead of p."""
    P = enrich(p, q, params["eta"])                                               # (B, V)
    p_x, q_x, t_x = pick(p, x), pick(q, x), pick(P, x)
    ok = accept_mask(t_x, q_x, u)
    inputs = [dict(p=round(a, 6), q=round(b, 6), p_tilde=round(c, 6))
              for a, b, c in zip(p_x.tolist(), q_x.tolist(), t_x.tolist())]
    return ok, residual_rows(P, q), dict(threshold=[params["eta"]] * len(inputs), inputs=inputs)


def induced(P, q, params: dict, model=None):
    """The law of a round's first token for one candidate x ~ q (None: nothing drafted) under P."""
    P = P.float()
    return (P if q is None else enrich(P, q.to(P), float(params["eta"]))), 0.0


RAPID = register_rule(Rule(
    name="rapid", guarantee="lossy", test=test, prepare=prepare, induced=induced, needs_q=True, greedy=False,
    params=dict(eta=1.0), only_for=("rapid",),
    summary="speculative sampling against the target moved toward the RAG drafter: softmax(log p + eta (q - p)), "
            "one step of distilling q into p's logits (RAPID, Chen et al. ICML 2025)"))
