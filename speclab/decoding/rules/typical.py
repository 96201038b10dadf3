"""`typical`: Medusa-2's typical acceptance (Cai et al. 2024), lossy by design.

A drafted token x is accepted where the target gives it more than an entropy-adaptive floor:

    P = the target's distribution after x's parent (temperature, top-k, top-p applied)
    H = -sum P log(P + 1e-5)                       (fp32)
    accept x  iff  P(x) > min(eps, delta * exp(-H))  (strict)

Over a tree the longest accepted path wins, ties going to the higher sum of log P; the round then
emits the target's argmax after that path (Medusa's fast mode, its default: the correction is
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

from speclab.decoding.acceptance import Tried, accepts, greedy_ids, warp
from speclab.decoding.rules.base import Rule, register_rule


def make(params: dict, model=None):
    eps, delta = float(params["eps"]), float(params["delta"])
    if not 0 < eps <= 1 or delta <= 0:
        raise ValueError(f"typical takes 0 < eps <= 1 and delta > 0, got eps={eps}, delta={delta}")

    def walk(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at=None):
        stats = {}

        def at(node):                          # (P, H, floor) after node
            if node not in stats:
                P = warp(p_at(node), sampler)
                H = float(-(P * (P + 1e-5).log()).sum())
                stats[node] = (P, H, min(eps, delta * math.exp(-H)))
            return stats[node]

        def best(node) -> tuple[int, float, list[int]]:
            """(accepted length, sum of log P, node path) of the best accepted path below node."""
            P, _, floor = at(node)
            out = (0, 0.0, [])
            for c in children.get(node, []):
                if P[tokens[c]] > floor:
                    n, ll, path = best(c)
                    cand = (n + 1, ll + math.log(float(P[tokens[c]])), [c] + path)
                    out = max(out, cand, key=lambda t: (t[0], t[1]))
            return out

        _, _, path = best(-1)
        tries, node = [], -1
        for step in path + [None]:             # every sibling tested on the way, in try order
            P, H, floor = at(node)
            q = q_at.get(node)
            for c in children.get(node, []):
                x = tokens[c]
                p_x, q_x = float(P[x]), (float(q[x]) if q is not None else None)
                tries.append(Tried(c, c == step, None, p_x, q_x, exact=accepts(draw(), p_x, q_x),
                                   inputs=dict(p=round(p_x, 6), entropy=round(H, 4)), threshold=floor))
            node = step if step is not None else node
        emitted = int(greedy_ids(p_at(node)))
        return path, emitted, None, tries
    return walk


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
    name="typical", guarantee="lossy", make=make, induced=induced, greedy=False, params=dict(eps=0.09, delta=0.3),
    summary="accept x where p(x) > min(eps, delta exp(-H(p))); the longest accepted path, then the target's "
            "argmax (Medusa-2's typical acceptance, Cai et al. 2024)"))
