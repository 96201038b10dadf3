"""`rsd`: Recursive Speculative Decoding's verify (Jeon et al. 2024), lossless.

The siblings of a node were drawn WITHOUT replacement from q (drafters/rsd.py, Gumbel-Top-k), so
the j-th one follows q renormalised without the earlier ones. Each is one speculative-sampling
test against the residual the earlier rejections left:

    P = p(.|node);  Q = q(.|node)
    for x in the children, in draw order:
        Q_j = norm(Q)                         accept x with probability min(1, P(x) / Q_j(x))
        on a rejection: P = norm((P - Q_j)+), Q(x) = 0      (P(x) is then exactly 0)
    all rejected: emit a sample of P;  a leaf accepted: the bonus from p after it

Stage j is an ordinary speculative-sampling step whose proposal is exactly the law of the j-th
sibling given the earlier ones, so by induction the emitted token follows p. Keeping the full q at
every stage (`renormalise=False`, a broken variant kept for the negative test) is off by a TV of
0.06-0.12 on small vocabularies. At temperature 0 it is the greedy match.
"""
from __future__ import annotations

from speclab.decoding.acceptance import Tried, accepts, remove_token, residual, sample, walk_tree, warp
from speclab.decoding.rules.base import Rule, register_rule


def make(params: dict, model=None, renormalise: bool = True):
    def walk(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at=None):
        if sampler.greedy:
            return walk_tree(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at)
        node, path, tries = -1, [], []
        while True:
            P = warp(p_at(node), sampler)
            q = q_at.get(node)
            Q = q.clone() if q is not None else None
            nxt = None
            for c in children.get(node, []):
                x = tokens[c]
                Qj = (Q / Q.sum() if renormalise else q) if Q is not None else None
                p_x, q_x = float(P[x]), (float(Qj[x]) if Qj is not None else None)
                u = draw()
                ok = accepts(u, p_x, q_x)
                tries.append(Tried(c, ok, u, p_x, q_x))
                if ok:
                    nxt = c
                    break
                if Qj is None:
                    P = remove_token(P, x)
                else:
                    P = residual(P, Qj)
                    Q[x] = 0.0
            if nxt is None:
                return path, int(sample(P, gen)), P, tries
            path.append(nxt)
            node = nxt
    return walk


RSD = register_rule(Rule(
    name="rsd", guarantee="identical-to-ar", make=make, needs_q=True, only_for=("tree-rsd",),
    summary="recursive rejection over siblings drawn without replacement, each tested against q renormalised "
            "without the earlier ones (RSD, Jeon et al. 2024)"))
