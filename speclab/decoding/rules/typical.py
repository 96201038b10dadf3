"""`typical`: Medusa-2's typical acceptance (Cai et al. 2024), lossy by design.

A drafted token x is accepted where the target gives it more than an entropy-adaptive floor:

    P = the target's distribution after x's parent (temperature, top-k, top-p applied)
    H = -sum P log(P + 1e-5)                       (fp32)
    accept x  iff  P(x) > min(eps, delta * exp(-H))  (strict)

Over a tree the longest accepted path wins, ties going to the higher sum of log P (the shared
walk's "longest" path, decoding/acceptance.py); the round then emits the target's argmax after
that path (Medusa's fast mode, its default: the correction is
greedy even when sampling). Defaults eps = 0.09 (`posterior_threshold`) and delta = 0.3
(`posterior_alpha`), as `medusa_generate` passes them (Medusa's own helper functions swap the
two). At temperature 0 P is one-hot and the rule is `exact`'s greedy match, so it refuses T = 0.
Each test draws a uniform u (whatever the recording level, so the text never depends on it) to
record what `exact` would have decided with it: a token accepted here that `exact` rejected is
one the rule rescued.

`induced` (the bench's TV column): for one candidate x ~ q at the root, the first token is x where
P(x) > floor and the target's argmax otherwise, so its law is q on {P > floor} plus the rest of q's
mass on argmax P (nothing drafted: argmax P alone); exact, no slack.
"""
from __future__ import annotations

import math

import torch

from speclab.decoding.acceptance import greedy_ids, rowsum
from speclab.decoding.rules.base import Rule, register_rule


def prepare(params: dict, model=None) -> dict:
    eps, delta = float(params["eps"]), float(params["delta"])
    if not 0 < eps <= 1 or delta <= 0:
        raise ValueError(f"typical takes 0 < eps <= 1 and delta > 0, got eps={eps}, delta={delta}")
    return dict(eps=eps, delta=delta)


def test(p, q, x, u, params, given=None):
    """P(x) > min(eps, delta exp(-H(P))) per candidate, P = p (B, V) its parent's warped p; the
    residual is p itself (typical never resamples: the walk emits the target's argmax)."""
    H = -rowsum(p * (p + 1e-5).log()).double()                                    # (B,)
    floor = torch.clamp(params["delta"] * torch.exp(-H), max=params["eps"])       # (B,) fp64
    p_x = p.gather(-1, x[:, None])[:, 0]                                          # (B,) fp32
    ok = p_x > floor.to(p_x.dtype)
    inputs = [dict(p=round(a, 6), entropy=round(h, 4)) for a, h in zip(p_x.tolist(), H.tolist())]
    return ok, p, dict(threshold=floor.tolist(), inputs=inputs)


def induced(P, q, params: dict, model=None):
    """The law of a round's first token for one candidate x ~ q (None: nothing drafted) under P:
    (dist, 0.0). The floor is computed as the walk computes it."""
    eps, delta = float(params["eps"]), float(params["delta"])
    P = P.float()
    top = int(greedy_ids(P))
    out = torch.zeros_like(P)
    if q is None:
        out[top] = 1.0
        return out, 0.0
    H = float(-(P * (P + 1e-5).log()).sum())
    ok = P > min(eps, delta * math.exp(-H))
    q = q.to(P)
    out = torch.where(ok, q, out)
    out[top] += float(q[~ok].sum())
    return out, 0.0


TYPICAL = register_rule(Rule(
    name="typical", guarantee="lossy", test=test, prepare=prepare, path="longest", induced=induced, greedy=False, params=dict(eps=0.09, delta=0.3),
    summary="accept x where p(x) > min(eps, delta exp(-H(p))); the longest accepted path, then the target's "
            "argmax (Medusa-2's typical acceptance, Cai et al. 2024)"))
