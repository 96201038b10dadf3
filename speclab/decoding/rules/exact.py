"""`exact`: the acceptance rules that keep the target's distribution, the default of every run.

    greedy          accept a node iff its token is the target's argmax after its parent (the first
                    such sibling); emit the target's argmax where the walk stops
    spec-sampling   accept x with probability min(1, p(x) / q(x)); after a rejection, the next
                    sibling is tried against the residual max(0, p - q), normalised; where every
                    sibling is rejected, sample the residual; after a whole path, sample p (bonus)
    point-mass      a draft with no distribution (q = 1 on its token): accept with probability p(x),
                    then remove x from p before the next sibling (recursive rejection)

Leviathan et al. 2023 and Chen et al. 2023 (speculative sampling); SpecInfer (Miao et al. 2024) and
Sequoia for recursive rejection over a tree. Its tensor test is acceptance.py's `speculative_test`
(the walk also asks it for exact's verdict beside a lossy rule's), over the shared walk:

    test(p, q, x, u):  accepted = u <= min(1, p(x) / q(x))  (never where p(x) = 0)
                       residual = norm(max(0, p - q))       (q one-hot at x for a point-mass draft)
    greedy (u None):   accepted = x == argmax p              (p one-hot: the same formula)
"""
from speclab.decoding.acceptance import speculative_test
from speclab.decoding.rules.base import Rule, register_rule

test = speculative_test

EXACT = register_rule(Rule(
    name="exact", guarantee="identical-to-ar", test=test,
    summary="greedy match; speculative sampling with min(1, p/q), residual resampling and the bonus from p; "
            "recursive rejection over siblings (Leviathan et al. 2023, Chen et al. 2023, SpecInfer)"))
