"""Draft trees: shapes, records, and clear errors for bad trees."""
import pytest
import torch

import speclab
from speclab.decoding.speculative import Drafter
from speclab.decoding.tree import DraftTree
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED

PROMPT = "    def keys(self):\n        return list(self._data.keys())\n\n    def values(self):\n"


def test_static_tree_follows_its_pattern(target, draft):
    paths = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    r = speclab.generate(target, PROMPT, "tree-static", draft=draft, max_new_tokens=12, paths=paths)
    first = r.trace.rounds[0]
    assert first.drafted == len(paths) == len(first.nodes)
    depths = sorted(n.depth for n in first.nodes)
    assert depths == [1, 1, 2, 2, 3]
    for rd in r.trace.rounds:                       # decisions are consistent with the path
        acc = [n.id for n in rd.nodes if n.decision == ACCEPTED]
        assert acc == rd.accepted
        assert all(n.decision in (ACCEPTED, REJECTED, NOT_REACHED) for n in rd.nodes)
        for n in rd.nodes:                          # the accepted path is parent-linked
            if n.id in rd.accepted and n.parent >= 0:
                assert n.parent in rd.accepted


def test_dynamic_tree_respects_budget_and_order(target, draft):
    r = speclab.generate(target, PROMPT, "tree-dynamic", draft=draft, max_new_tokens=16, budget=5, width=3,
                         record="full")
    for rd in r.trace.rounds:
        assert rd.drafted <= 5
        tried = sorted((n for n in rd.nodes if n.try_order is not None), key=lambda n: n.try_order)
        assert [n.try_order for n in tried] == list(range(len(tried)))
        assert all(n.p_topk for n in rd.nodes)


@pytest.mark.parametrize("params,words", [
    (dict(budget=0), "node budget must be an integer >= 1"),
    (dict(width=0), "width must be an integer >= 1"),
    (dict(threshold=1.5), r"threshold must be in \(0, 1\)"),
])
def test_dynamic_tree_bad_params(target, draft, params, words):
    with pytest.raises(ValueError, match=words):
        speclab.generate(target, PROMPT, "tree-dynamic", draft=draft, max_new_tokens=4, **params)


def test_a_dynamic_tree_grows_only_as_deep_as_the_draft_is_sure():
    """threshold: no draft forward past a depth whose best cumulative probability is below it."""
    from speclab.decoding.drafters.trees import grow_dynamic
    gen = torch.Generator().manual_seed(0)

    def q_of(sure: float):                        # the draft's top choice has probability `sure` everywhere
        calls = []

        def q_at(tree):
            calls.append(len(tree))
            q = torch.rand(1 + len(tree), 50, generator=gen)
            q[:, 0] = 0
            q = q / q.sum(-1, keepdim=True) * (1 - sure)
            q[:, 0] = sure
            return q
        return q_at, calls
    q_at, calls = q_of(0.9)                       # 0.9, 0.81, 0.73: above 0.5 at every depth
    sure = grow_dynamic(6, 3, 4, q_at, threshold=0.5)
    assert len(calls) == 4 and sure.info["levels"] == 4
    q_at, calls = q_of(0.6)                       # 0.6, then 0.36 < 0.5: the third forward is not run
    mid = grow_dynamic(6, 3, 4, q_at, threshold=0.5)
    assert len(calls) == 2 and mid.info["levels"] == 2 and len(mid) == 6
    q_at, calls = q_of(0.3)                       # unsure from the root: only its top `width` children
    flat = grow_dynamic(6, 3, 4, q_at, threshold=0.5)
    assert len(calls) == 1 and flat.parents == [-1, -1, -1] and flat.tokens[0] == 0
    q_at, calls = q_of(0.3)
    assert grow_dynamic(6, 3, 4, q_at).info["levels"] == 4 and len(calls) == 4    # no threshold: always `depth`


@pytest.mark.parametrize("paths,words", [([], "at least one path"), ([[0, 1]], "no parent path"), ([[-1]], "ranks >= 0")])
def test_static_tree_bad_paths(target, draft, paths, words):
    with pytest.raises(ValueError, match=words):
        speclab.generate(target, PROMPT, "tree-static", draft=draft, max_new_tokens=4, paths=paths)


class UserDrafter(Drafter):
    name = "user"

    def __init__(self, tokens, parents):
        super().__init__()
        self.tokens, self.parents = tokens, parents

    def propose(self, ctx):
        t = DraftTree(tokens=list(self.tokens), parents=list(self.parents))
        t.q_tok, t.source = [1.0] * len(self.tokens), ["user"] * len(self.tokens)
        return t


@pytest.mark.parametrize("tokens,parents,words", [
    ([5, 6], [-1, 1], "cycle or forward reference"),
    ([5, 6], [-1, -3], "dangling parent"),
    ([5, 99999], [-1, 0], "outside the vocabulary"),
    ([5, 6], [-1], "2 tokens but 1 parents"),
])
def test_malformed_user_tree(target, tokens, parents, words):
    with pytest.raises(ValueError, match=words):
        speclab.generate(target, PROMPT, UserDrafter(tokens, parents), max_new_tokens=4)


def test_user_drafter_plugs_in_and_stays_lossless(target):
    ref = speclab.generate(target, PROMPT, "ar", max_new_tokens=12).ids
    r = speclab.generate(target, PROMPT, UserDrafter([ref[0], 7, ref[1]], [-1, -1, 0]), max_new_tokens=12)
    assert r.ids == ref and r.trace.method == "user"
    assert r.trace.rounds[0].accepted[:2] == [0, 2]
