"""Every acceptance rule with a tensor form at batch > 1 (decoding/acceptance.py's shared walk,
its batched form in decoding/batch.py): the tensor test's law on fixed p, q with many uniforms (and
a broken variant it catches), the batched walk against the host walk lane by lane, and on the toy
zoo at batch 4 each sequence identical to its batch-1 run, greedy and sampled; the first token of
a sampled batch follows the target."""
from __future__ import annotations

import re

import pytest
import torch
from scipy.stats import chisquare

import speclab
from speclab.decoding.acceptance import Form, Sampler, Verify, residual, residual_rows, speculative_test, walk, warp
from speclab.decoding.rules import get_rule, rule_params
from speclab.decoding.rules.base import batch_rules

pytestmark = pytest.mark.usefixtures("one_thread")

P = torch.tensor([.30, .25, .15, .12, .10, .08])
Q = torch.tensor([.05, .05, .10, .10, .30, .40])


def law_of_test(test, n: int, point: bool, seed: int = 0) -> torch.Tensor:
    """Counts of the token one test emits over n candidates: x ~ Q (or the point-mass draft 4), u
    uniform; accepted x, or a sample of the residual the test hands on."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((n,), 4) if point else torch.multinomial(Q, n, replacement=True, generator=g)
    q = torch.nn.functional.one_hot(x, 6).float() if point else Q.expand(n, 6)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    ok, res, _ = test(P.expand(n, 6), q, x, u, {}, None)
    other = torch.multinomial(res, 1, generator=g)[:, 0]
    return torch.bincount(torch.where(ok, x, other), minlength=6).double()


@pytest.mark.parametrize("point", [False, True], ids=["sampled-draft", "point-mass"])
def test_the_exact_tensor_test_emits_the_target_law_and_a_broken_one_is_caught(point):
    """100,000 candidates in one call of the test: chi-square against p above 0.001; the same test
    with the residual left as p (no subtraction of q) is caught."""
    n = 100_000
    counts = law_of_test(speculative_test, n, point)
    assert chisquare(counts.numpy(), (P.double() / P.double().sum() * n).numpy()).pvalue > 1e-3
    broken = lambda p, q, x, u, params, given: (speculative_test(p, q, x, u)[0], p, {})   # noqa: E731
    counts = law_of_test(broken, n, point)
    assert chisquare(counts.numpy(), (P.double() / P.double().sum() * n).numpy()).pvalue < 1e-3
    assert torch.equal(residual_rows(P[None], Q[None])[0], residual(P, Q))


def test_greedy_is_the_one_hot_case():
    """u None: accepted iff x is the target's token, whatever q; p handed on unchanged."""
    from speclab.decoding.acceptance import Given
    ok, res, _ = speculative_test(None, None, torch.tensor([3, 1, 1]), None, {}, Given(top=torch.tensor([3, 3, 1])))
    assert ok.tolist() == [True, False, True] and res is None


def lanes_of(n: int, seed: int, tree: str):
    """n lanes over the same fixed target rows (V = 6), each its own generator: a chain of two
    sampled from Q, two point-mass siblings, or two siblings drawn i.i.d. from Q with a child each."""
    rows = {-1: P.log(), 0: torch.tensor([.1, .1, .5, .1, .1, .1]).log(), 1: torch.tensor([.2, .2, .2, .2, .1, .1]).log(),
            2: torch.tensor([.05, .05, .1, .1, .2, .5]).log(), 3: torch.tensor([.3, .3, .1, .1, .1, .1]).log()}
    out = []
    for b in range(n):
        g = torch.Generator().manual_seed(seed + b)
        if tree == "chain":
            x0 = int(torch.multinomial(Q, 1, generator=g))
            children, tokens, q_at = {-1: [0], 0: [1]}, [x0, int(torch.multinomial(Q, 1, generator=g))], {-1: Q, 0: Q}
        elif tree == "point":
            children, tokens, q_at = {-1: [0, 1]}, [4, 0], {}
        else:
            tokens = torch.multinomial(Q, 4, replacement=True, generator=g).tolist()     # i.i.d. siblings
            children, q_at = {-1: [0, 1], 0: [2], 1: [3]}, {-1: Q, 0: Q, 1: Q}
        out.append(Verify(children, tokens, q_at, rows.__getitem__, g,
                          lambda g=g: torch.rand((), generator=g).item()))
    return out


@pytest.mark.parametrize("rule", ["exact", "rsd", "typical"])
@pytest.mark.parametrize("tree", ["chain", "point", "tree"])
def test_the_batched_walk_is_the_host_walk_lane_by_lane(rule, tree):
    """One walk over 12 lanes returns, lane by lane, what each lane's walk alone returns (paths,
    tokens, tries with their draws and both verdicts), at T = 0.7."""
    if rule == "rsd" and tree == "point":
        pytest.skip("rsd reads q: its drafts are sampled")
    row, s = get_rule(rule), Sampler(0.7)
    params = row.prepared(rule_params(rule, {}))
    together = walk(row.form, params, lanes_of(12, 5, tree), s)
    alone = [walk(row.form, params, [v], s)[0] for v in lanes_of(12, 5, tree)]
    assert [o[:2] for o in together] == [o[:2] for o in alone]
    assert [[(t.node, t.accepted, t.u, t.exact, t.threshold) for t in o[3]] for o in together] == \
        [[(t.node, t.accepted, t.u, t.exact, t.threshold) for t in o[3]] for o in alone]
    assert len({(tuple(o[0]), o[1], tuple(t.exact for t in o[3])) for o in together}) > 1   # lanes differ


def test_the_batched_walk_emits_the_targets_first_token():
    """2,000 lanes of the sampled two-level tree in one walk of the exact rule: the first emitted
    token follows p (chi-square above 0.001)."""
    s, n = Sampler(1.0), 2000
    lanes = lanes_of(n, 100, "tree")
    out = walk(get_rule("exact").form, {}, lanes, s)
    first = torch.tensor([v.tokens[o[0][0]] if o[0] else o[1] for v, o in zip(lanes, out)])
    counts = torch.bincount(first, minlength=6).double()
    assert chisquare(counts.numpy(), (P.double() / P.double().sum() * n).numpy()).pvalue > 1e-3


NEW = 16
ZOO_RULES = [r for r in batch_rules() if not get_rule(r).only_for]          # rsd is tree-rsd's only


@pytest.fixture(scope="module")
def four(heldout_prompts):
    return [heldout_prompts[i] for i in (3, 0, 7, 1)]


def _kw(rule, draft, **kw):
    return dict(draft=draft, max_new_tokens=NEW, rule=rule, k=3, **kw)


@pytest.mark.parametrize("rule", [r for r in ZOO_RULES if get_rule(r).greedy])
def test_greedy_batch_of_four_equals_each_prompt_alone(rule, target, draft, four):
    rs = speclab.generate(target, four, "draft-model", record="light", **_kw(rule, draft))
    alone = [speclab.generate(target, p, "draft-model", record=None, **_kw(rule, draft)).ids for p in four]
    assert [r.ids for r in rs] == alone
    if rule != "exact":
        assert all(r.trace.params["rule"] == rule for r in rs)
        tested = [n for r in rs for rd in r.trace.rounds for n in rd.nodes if n.decision != "not_reached"]
        assert tested and all(set(n.verdicts) == {rule, "exact"} for n in tested)


@pytest.mark.parametrize("rule", ZOO_RULES)
def test_sampled_batch_of_four_equals_each_seed_alone(rule, target, draft, four):
    """T = 0.7: lane i draws from its own generator (seed + i), as its run alone does."""
    kw = _kw(rule, draft, temperature=0.7)
    rs = speclab.generate(target, four, "draft-model", seed=3, record=None, **kw)
    assert [r.ids for r in rs] == [speclab.generate(target, p, "draft-model", seed=3 + i, record=None, **kw).ids
                                   for i, p in enumerate(four)]
    if rule == "typical":                                  # a tree too: the longest path, batched
        kw = dict(draft=draft, max_new_tokens=NEW, rule=rule, temperature=0.7, budget=8, width=3)
        rs = speclab.generate(target, four, "tree-dynamic", seed=9, record=None, **kw)
        assert [r.ids for r in rs] == [speclab.generate(target, p, "tree-dynamic", seed=9 + i, record=None, **kw).ids
                                       for i, p in enumerate(four)]


def test_first_token_of_a_sampled_exact_batch_follows_the_target(target, draft):
    """One batch of 160 lanes of one prompt at T = 0.7, top-k 6 (modest: the law of the test itself
    is checked above on 100,000 draws): the first token against the target's p."""
    model, tok = target
    prompt, n, s = "import os\n\ndef main(", 160, Sampler(0.7, top_k=6)
    with torch.no_grad():
        p = warp(model(input_ids=torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])).logits[0, -1], s)
    rs = speclab.generate(target, [prompt] * n, "draft-model", draft=draft, max_new_tokens=1, k=2, temperature=0.7,
                          top_k=6, seed=[7000 + i for i in range(n)], record=None)
    counts = torch.bincount(torch.tensor([r.ids[0] for r in rs]), minlength=len(p)).double()
    keep = p > 0
    assert counts[~keep].sum() == 0
    q = p[keep].double()                                      # summed in double: scipy checks the totals agree
    assert chisquare(counts[keep].numpy(), (q / q.sum() * n).numpy()).pvalue > 1e-3


def test_a_rule_without_a_batched_form_refuses_a_batch_in_one_line(target):
    with pytest.raises(ValueError, match=re.escape("rule 'judge' reads the target's hidden state")) as e:
        speclab.generate(target, ["def f():", "class A:"], "draft-model", max_new_tokens=2, rule="judge")
    assert "\n" not in str(e.value)
    from speclab.decoding.rules import Rule, registered_rule
    from speclab.decoding.acceptance import walk_tree
    with registered_rule(Rule(name="toy-walk", guarantee="identical-to-ar", summary="", make=lambda params, model=None: walk_tree)):
        with pytest.raises(ValueError, match="rule 'toy-walk' has no tensor form on the shared walk") as e:
            speclab.generate(target, ["def f():", "class A:"], "ar", max_new_tokens=2, rule="toy-walk")
        batch_with = str(e.value).split("or batch with ")[1].split(", ")
        assert {"exact", "lantern", "rsd", "typical"} <= set(batch_with) and "toy-walk" not in batch_with
    with pytest.raises(ValueError, match="needs a tensor test on a shared path"):
        Rule(name="nothing", guarantee="lossy", summary="")
    assert isinstance(get_rule("exact").form, Form)
