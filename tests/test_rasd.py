"""RASD (decoding/drafters/rasd.py): a retrieval tree pruned by the head's q and fused with the head's
tree by longest prefix matching. The pruning and the fusion as exact cases; greedy identical to ar
on the code zoo with the toy EAGLE head, every node's source and every round's record consistent,
the figure following the record; under sampling the joint law of the first two tokens is the
target's (tests/sampling_law.py), and the same trees tested as samples of the head's q (the
distribution that pruned them) are caught. The real-model numbers: a bench command (docs/methods.md)."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import toy_heads

import speclab
from speclab.decoding.drafters.rasd import fuse, origin, prune_retrieval
from speclab.decoding.tree import DraftTree

NEW = 32


@pytest.fixture(scope="module")
def eagle(target):
    return toy_heads(target)["eagle"], target[1]


def test_pruning_drops_whole_branches_whose_first_token_the_draft_doubts():
    found = DraftTree()
    a = found.add(5, -1, 1.0, "suffix:self")
    found.add(6, a, 1.0, "suffix:self")
    b = found.add(7, -1, 1.0, "suffix:self")
    found.add(8, b, 1.0, "suffix:self")
    found.add(9, b, 1.0, "suffix:self")
    kept, ds = prune_retrieval(found, {5: 0.3, 7: 0.01}, prune=0.05)
    assert kept == {0, 1}
    assert [(d.inputs["token"], d.inputs["q"], d.inputs["nodes"], d.output) for d in ds] == \
        [(5, 0.3, 2, "kept"), (7, 0.01, 3, "pruned")]
    assert all(d.policy == "rasd-prune" and d.threshold == 0.05 for d in ds)
    assert prune_retrieval(found, {}, prune=0.0)[0] == set(range(5))       # 0 keeps all, even q = 0
    assert prune_retrieval(found, {5: 0.3}, prune=0.5)[0] == set()


def test_fusion_merges_each_retrieved_path_along_its_longest_prefix_in_the_draft():
    head = DraftTree()
    h = head.add(5, -1, 0.6, "h3")
    head.add(6, h, 0.5, "h3+1")
    head.add(4, -1, 0.2, "h3")
    found = DraftTree()
    a = found.add(5, -1, 1.0, "suffix:self")      # shares 5 -> 6 with the head, then 1 is new
    a2 = found.add(6, a, 1.0, "suffix:self")
    found.add(1, a2, 1.0, "suffix:self")
    found.add(2, a, 1.0, "suffix:self")           # 5 -> 2: a new sibling of 6
    found.add(9, -1, 1.0, "suffix:history")       # nothing shared: a new child of the root
    out, where, shared = fuse(head, found, set(range(5)))
    assert out.tokens == [5, 6, 4, 1, 2, 9] and out.parents == [-1, 0, -1, 1, 0, -1]
    assert [origin(s) for s in out.source] == ["both", "both", "draft", "retrieval", "retrieval", "retrieval"]
    assert out.source[:3] == ["both:h3", "both:h3+1", "draft:h3"] and out.source[5] == "retrieval:history"
    assert shared == 2 and where == {-1: -1, 0: 0, 1: 1, 2: 3, 3: 4, 4: 5}
    assert out.q_tok == [0.6, 0.5, 0.2, None, None, None] and not out.q_map()   # retrieved: no q; all point masses
    for p in set(out.parents):                      # no two siblings alike
        kids = [out.tokens[i] for i, q in enumerate(out.parents) if q == p]
        assert len(kids) == len(set(kids))
    out, _, _ = fuse(head, found, {4})              # a pruned branch never reaches the tree
    assert out.tokens == [5, 6, 4, 9]


def test_greedy_identical_to_ar_with_sources_and_records_consistent(target, eagle, heldout_prompts):
    from_retrieval = pruned = 0
    for prompt in heldout_prompts[:3]:
        ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
        r = speclab.generate(target, prompt, "rasd", draft=eagle, max_new_tokens=NEW, record="light",
                             prune=0.001, min_match=1)
        assert r.ids == ref, f"rasd diverged from ar on {prompt[:40]!r}"
        for rnd in r.trace.rounds:
            if "rasd_found" not in rnd.info:
                assert not rnd.nodes                 # the first round: no hidden state, no draft
                continue
            by = {o: sum(origin(n.source) == o for n in rnd.nodes) for o in ("draft", "retrieval", "both")}
            assert sum(by.values()) == rnd.drafted and by["retrieval"] == rnd.info.get("rasd_added", 0)
            assert by["both"] == rnd.info.get("rasd_shared", 0)
            prunes = [d for d in rnd.decisions if d.policy == "rasd-prune"]
            assert sum(d.inputs["nodes"] for d in prunes if d.output == "pruned") == rnd.info.get("rasd_pruned", 0)
            assert all((d.inputs["q"] >= 0.001) == (d.output == "kept") for d in prunes)
            assert all(rnd.nodes[d.at].token == d.inputs["token"] for d in prunes if d.output == "kept")
            pruned += rnd.info.get("rasd_pruned", 0)
            from_retrieval += sum(origin(rnd.nodes[a].source) != "draft" for a in rnd.accepted)
    assert from_retrieval > 0 and pruned > 0      # code repeats itself; the toy head doubts some of it


@pytest.mark.parametrize("kw, words", [(dict(prune=1.5), "prune is a draft probability"),
                                       (dict(retrieval=0), "retrieval"), (dict(retrieval=1000), "past its bound")])
def test_bad_parameters_are_refused_in_one_line(target, eagle, heldout_prompts, kw, words):
    with pytest.raises(ValueError, match=words):
        speclab.generate(target, heldout_prompts[0], "rasd", draft=eagle, max_new_tokens=4, **kw)


def test_the_figure_colours_nodes_by_source_and_lists_the_pruned(target, eagle, heldout_prompts):
    from speclab.figures.views import view_of
    r = speclab.generate(target, heldout_prompts[1], "rasd", draft=eagle, max_new_tokens=24, prune=0.001,
                         min_match=1)
    spec = view_of(r.trace).spec("retrieval fusion")
    step = next(i for i, rnd in enumerate(r.trace.rounds) if rnd.info.get("rasd_pruned"))
    fig = spec.draw(r.trace, step)
    rnd = r.trace.rounds[step]
    for k, o in zip((3, 4, 5), ("draft", "retrieval", "both")):
        shown = [t for t in fig.data[k].x if t is not None]
        assert len(shown) == sum(origin(n.source) == o for n in rnd.nodes)
    gone = [d for d in rnd.decisions if d.policy == "rasd-prune" and d.output == "pruned"]
    assert len([t for t in fig.data[7].x if t is not None]) == len(gone) > 0
    plain = speclab.generate(target, heldout_prompts[1], "eagle", draft=eagle, max_new_tokens=8)
    assert "retrieval fusion" not in view_of(plain.trace).names                # the record, not the method


# -- sampling: the tiny pair of test_sampling_power, its EAGLE head, a prompt of the target's own text --
# (sampled at T = 1 after [1, 2, 3]): its continuations are ones the target takes, so the fused trees hold
# draft, retrieval and both nodes, and the verify accepts from each
PROMPT = [1, 2, 3, 1, 14, 0, 1, 0, 1, 11, 5, 0, 1, 7, 15, 0, 6, 0, 1, 7, 4, 5, 0, 3, 10, 0, 1, 3, 14, 13, 8, 9,
          11, 0, 9, 15, 11, 11, 12, 6, 0, 10, 4]
def rasd(pair, head):
    from speclab.decoding.registry import build_drafter
    return build_drafter("rasd", pair[0], head, dict(budget=3, width=2, depth=2, threshold=None, prune=0.0,
                                                      min_match=1, retrieval=6))


@pytest.fixture(scope="module")
def tiny():
    from test_sampling_power import V, llama

    from speclab.models.backends import make_lm
    from speclab.models.heads import build_eagle, head_config
    target = llama(0)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    torch.manual_seed(0)
    head = build_eagle(target, head_config(target.config, "eagle"), torch.arange(V))
    C = target.config.hidden_size
    with torch.no_grad():                           # the target's own layer, fed the next token (as there)
        head.model.layers[0].load_state_dict(target.model.layers[-1].state_dict())
        head.eagle_fc.weight.zero_()
        head.eagle_fc.weight[:, C:] = torch.eye(C)
        head.eagle_fc.bias.zero_()
    lm = make_lm(target, "target")
    return (target, draft), head.eval(), lm


def q_of_head(tree, sampler, inner):
    """The broken variant: the root's children, drafted and retrieved, tested as samples of the head's
    q (the distribution that pruned the retrieval tree): accepted with min(1, p/q), residual (p - q)+."""
    if inner.root_logits is not None and len(tree):
        tree.set_q(-1, inner.root_logits.float().softmax(-1))


@pytest.mark.usefixtures("one_thread")
def test_sampled_fused_trees_follow_the_target_and_q_as_proposal_is_caught(tiny):
    from sampling_law import N, N_BROKEN, departs, draw_pairs, follows, target_law
    from test_sampling_power import Misreported

    from speclab.decoding.acceptance import Sampler
    from speclab.decoding.speculative import decode
    pair, head, lm = tiny
    seen, taken = set(), set()
    for seed in range(40):
        _, rounds, _ = decode(lm, rasd(pair, head), PROMPT, 2, Sampler(1.0), seed=seed, record="light")
        assert all(n.rule == "point-mass" for rd in rounds for n in rd.nodes)
        seen |= {origin(n.source) for rd in rounds for n in rd.nodes}
        taken |= {origin(rd.nodes[a].source) for rd in rounds for a in rd.accepted}
    assert seen == {"draft", "retrieval", "both"} and taken >= {"retrieval", "both"}
    law = target_law(pair[0], PROMPT, Sampler(1.0))
    follows(law, draw_pairs(lm, rasd(pair, head), PROMPT, Sampler(1.0), n=N))
    departs(law, draw_pairs(lm, Misreported(rasd(pair, head), q_of_head), PROMPT, Sampler(1.0), n=N_BROKEN))
