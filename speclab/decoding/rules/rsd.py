"""`rsd`: Recursive Speculative Decoding's verify (Jeon et al. 2024), lossless.

The siblings of a node were drawn WITHOUT replacement from q (drafters/rsd.py, Gumbel-Top-k; or
drafters/rsd_s.py, Stochastic Beam Search, whose kept siblings are a Gumbel-Top-k draw's first), so
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

from functools import partial

from speclab.decoding.acceptance import speculative_test, walk_tree
from speclab.decoding.rules.base import Rule, register_rule


def make(params: dict, model=None, renormalise: bool = True):
    """The host walk (the row's is the same, built from exact's test with without_replacement):
    walk_tree with siblings drawn without replacement; renormalise=False keeps the full q for
    every sibling (the exact rule's recursion, wrong for these drafts: the negative control)."""
    return partial(walk_tree, without_replacement=renormalise)


RSD = register_rule(Rule(
    name="rsd", guarantee="identical-to-ar", test=speculative_test, without_replacement=True, needs_q=True,
    only_for=("tree-rsd", "tree-rsd-s"),
    summary="recursive rejection over siblings drawn without replacement, each tested against q renormalised "
            "without the earlier ones (RSD, Jeon et al. 2024)"))
