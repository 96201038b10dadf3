"""Graft (decoding/drafters/graft.py): prune-then-graft within one budget, on the code zoo with the
toy EAGLE head. Greedy identical to ar; every round within its budget; the pruning follows the
rule (the least likely leaves below `keep`, never the copy's shared prefix), and each round's
Decision says what it did. Under sampling the joint law of the first two tokens is the target's, and
the same trees verified against a q they were not drawn from are caught. The real-model numbers: BENCHMARKS.md (a bench command, not a test)."""
from __future__ import annotations

import pytest
import torch
from conftest import toy_heads
from test_rasd import PROMPT, tiny  # noqa: F401 (tiny: the sampling tests' pair and EAGLE head, a fixture)

import speclab
from speclab.decoding.drafters.graft import needed, path_probs, prune
from speclab.decoding.tree import DraftTree

NEW = 32


@pytest.fixture(scope="module")
def eagle(target):
    return toy_heads(target)["eagle"], target[1]


def test_greedy_identical_to_ar_and_within_its_budget(target, eagle, heldout_prompts):
    pruned = grafted = 0
    for prompt in heldout_prompts[:3]:
        ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
        r = speclab.generate(target, prompt, "graft", draft=eagle, max_new_tokens=NEW, record="light",
                             budget=4, lookup=6, threshold=None, keep=1.0)
        assert r.ids == ref, f"graft diverged from ar on {prompt[:40]!r}"
        for rnd in r.trace.rounds:
            assert rnd.drafted <= 4                                    # the copy never goes past the budget
            for d in rnd.decisions:
                assert d.policy == "graft" and d.threshold == 1.0
                assert d.output["pruned"] == rnd.info["pruned"] == len(d.inputs["pruned_p"])
                assert d.output["grafted"] == rnd.info["grafted"]
                assert all(p < 1.0 for p in d.inputs["pruned_p"])
                assert d.inputs["pruned_p"] == sorted(d.inputs["pruned_p"])   # the least likely first
                # the copy takes the slots pruning freed, and no more: the tree's size less the pruned
                # plus the grafted is what the verify holds; where a leaf went, the budget is full
                assert rnd.drafted == d.inputs["tree"] - d.output["pruned"] + d.output["grafted"]
                assert not d.output["pruned"] or rnd.drafted == 4
            pruned += rnd.info.get("pruned", 0)
            grafted += rnd.info.get("grafted", 0)
    assert pruned > 0 and grafted > 0                                 # code repeats: copies pushed leaves out
    # eagle[lookup] verifies the copy on top of a full tree: past the budget
    top = speclab.generate(target, heldout_prompts[0], "eagle", draft=eagle, max_new_tokens=NEW, budget=4,
                           lookup=6, threshold=None)
    assert max(rnd.drafted for rnd in top.trace.rounds) > 4


def test_prune_takes_the_least_likely_leaves_below_keep_and_spares_the_shared_prefix():
    tree = DraftTree()
    a = tree.add(5, -1, 0.9, "h3")          # p 0.9
    b = tree.add(6, a, 0.5, "h3+1")         # p 0.45
    c = tree.add(7, a, 0.2, "h3+1")         # p 0.18
    d = tree.add(8, -1, 0.05, "h3")         # p 0.05
    assert [round(x, 3) for x in path_probs(tree)] == [0.9, 0.45, 0.18, 0.05]
    out, dropped = prune(tree, 2, keep=0.5, protect=set())
    assert dropped == [0.05, 0.18] and out.tokens == [5, 6] and out.parents == [-1, 0]
    out, dropped = prune(tree, 3, keep=0.5, protect={b})                # b protected: only c and d go
    assert dropped == [0.05, 0.18] and out.tokens == [5, 6]
    out, dropped = prune(tree, 4, keep=0.95, protect=set())           # leaves go, then their parents
    assert len(out) == 0 and dropped == [0.05, 0.18, 0.45, 0.9]
    assert prune(tree, 2, keep=0.01, protect=set())[1] == []          # nothing is that unlikely
    assert needed(tree, DraftTree.chain([5, 6, 9])) == (1, [a, b]) and needed(tree, DraftTree.chain([4])) == (1, [])
    del d, c


def test_bad_parameters_are_refused_in_one_line(target, eagle, heldout_prompts):
    with pytest.raises(ValueError, match="keep is a path probability"):
        speclab.generate(target, heldout_prompts[0], "graft", draft=eagle, max_new_tokens=4, keep=1.5)
    with pytest.raises(ValueError, match="lookup must be at least 1"):
        speclab.generate(target, heldout_prompts[0], "graft", draft=eagle, max_new_tokens=4, lookup=0)


def graft_of(pair, head):
    from speclab.decoding.registry import build_drafter
    return build_drafter("graft", pair[0], head, dict(budget=3, width=2, depth=2, threshold=None, lookup=4,
                                                       ngram=1, keep=1.0))


def uniform_q(tree, sampler, inner):
    """The broken variant: the root's children (the head's and the copy's) tested as samples of a
    uniform q they were not drawn from: accepted with min(1, p/q), residual (p - q)+."""
    from test_sampling_power import V
    if len(tree):
        tree.set_q(-1, torch.full((V,), 1.0 / V))


@pytest.mark.usefixtures("one_thread")
def test_sampled_grafted_trees_follow_the_target_and_a_wrong_q_is_caught(tiny):
    """Under sampling every node, the head's and the copy's, is a point mass to the rule; the joint law
    of the first two tokens is the target's (tests/sampling_law.py), with copies accepted, and the same
    trees verified against a q they were not drawn from depart from it."""
    from sampling_law import N, N_BROKEN, departs, draw_pairs, follows, target_law
    from test_sampling_power import Misreported

    from speclab.decoding.acceptance import Sampler
    from speclab.decoding.speculative import decode
    pair, head, lm = tiny
    copied = 0
    for seed in range(30):
        _, rounds, _ = decode(lm, graft_of(pair, head), PROMPT, 2, Sampler(1.0), seed=seed, record="light")
        assert all(n.rule == "point-mass" for rd in rounds for n in rd.nodes)
        copied += sum("-gram@" in rd.nodes[a].source for rd in rounds for a in rd.accepted)
    assert copied > 0                               # the copy is tried and taken under sampling too
    law = target_law(pair[0], PROMPT, Sampler(1.0))
    follows(law, draw_pairs(lm, graft_of(pair, head), PROMPT, Sampler(1.0), n=N))
    departs(law, draw_pairs(lm, Misreported(graft_of(pair, head), uniform_q), PROMPT, Sampler(1.0), n=N_BROKEN))


def test_the_figure_follows_the_grafting_record_in_every_view(target, eagle, heldout_prompts):
    from speclab.figures.views import view_of
    r = speclab.generate(target, heldout_prompts[1], "graft", draft=eagle, max_new_tokens=24, budget=4, lookup=6,
                         threshold=None, keep=1.0)
    spec = view_of(r.trace).spec("head and copy")
    fig = spec.draw(r.trace, 2)
    head, copy = fig.data[0].y, fig.data[1].y
    accepted = [len(rnd.accepted) for rnd in r.trace.rounds]
    assert [h + c for h, c in zip(head, copy)] == accepted and sum(copy) > 0
    assert list(fig.data[2].y) == [rnd.info.get("grafted", 0) for rnd in r.trace.rounds]
    top = speclab.generate(target, heldout_prompts[1], "eagle", draft=eagle, max_new_tokens=8, lookup=6)
    assert "head and copy" in view_of(top.trace).names                  # the record, not the method
    plain = speclab.generate(target, heldout_prompts[1], "eagle", draft=eagle, max_new_tokens=8)
    assert "head and copy" not in view_of(plain.trace).names
