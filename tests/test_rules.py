"""Acceptance rules (speclab/decoding/rules/): each rule's cases written as tensors in and ids out,
its distribution where it claims one, the refusals a run gets in one line, and a run that records
both verdicts per node."""
from __future__ import annotations

import math

import pytest
import torch
from sampling_law import N, N_BROKEN, TEMPERATURES, departs, follows, pairs_of, table_law

from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.rules import check_run, get_rule, rule_params

LOG = lambda *p: torch.tensor(p).log()       # noqa: E731 (logits of a distribution)
NEVER = lambda: 0.999999                     # noqa: E731 (a draw that accepts only what is certain)


def walk_of(name, model=None, **params):
    return get_rule(name).make(rule_params(name, params), model)


def test_typical_takes_the_longest_path_over_the_floor_then_the_targets_argmax():
    """p after the root: H is high, so the floor min(eps, delta exp(-H)) is low and both children
    pass; the one whose child passes too wins; after it the target's argmax is emitted."""
    walk = walk_of("typical")
    children, tokens = {-1: [0, 1], 1: [2]}, [0, 1, 3]
    rows = {-1: LOG(.35, .30, .20, .15), 0: LOG(.25, .25, .25, .25), 1: LOG(.1, .1, .1, .7), 2: LOG(.1, .6, .2, .1)}
    path, emitted, dist, tries = walk(children, tokens, {}, rows.__getitem__, Sampler(1.0), None, NEVER)
    assert path == [1, 2] and emitted == 1 and dist is None
    P = torch.tensor([.35, .30, .20, .15])
    H = float(-(P * (P + 1e-5).log()).sum())
    first = tries[0]
    assert first.threshold == pytest.approx(min(0.09, 0.3 * math.exp(-H)))
    assert first.inputs["entropy"] == pytest.approx(H, abs=1e-4)
    assert [t.node for t in tries if t.accepted] == [1, 2]
    assert all(t.exact is False for t in tries)          # u = 0.999999 > min(1, p): exact rejects all


def test_typical_rejects_below_the_floor_and_breaks_ties_by_likelihood():
    walk = walk_of("typical", eps=0.5, delta=10.0)       # floor 0.5 whatever H
    children, tokens = {-1: [0, 1]}, [0, 1]
    path, emitted, _, _ = walk(children, tokens, {}, lambda n: LOG(.45, .40, .15) if n == -1 else LOG(.2, .3, .5),
                               Sampler(1.0), None, NEVER)
    assert path == [] and emitted == 0                  # nothing over 0.5: the target's argmax
    walk = walk_of("typical", eps=0.3, delta=10.0)
    path, _, _, _ = walk(children, tokens, {}, lambda n: LOG(.35, .45, .2) if n == -1 else LOG(.2, .3, .5),
                         Sampler(1.0), None, NEVER)
    assert path == [1]                                  # equal lengths: the likelier token


def test_lantern_pools_the_nearest_tokens_mass_within_the_budget():
    """Token 1's neighbours by embedding are 2 (close) then 3; p(2) = 0.08 fits a budget of 0.1,
    p(2) + p(3) does not: p~(1) = p(1) + 0.08. Greedy: accepted where p~ beats every other token."""
    class Emb:
        def __init__(self):
            self.weight = torch.tensor([[9., 9.], [0., 0.], [0.1, 0.], [1., 0.], [5., 5.]])

    model = type("M", (), {"get_input_embeddings": lambda self: Emb()})()
    walk = walk_of("lantern", model, k=3, delta=0.1)
    rows = lambda n: LOG(.40, .35, .08, .10, .07)        # noqa: E731
    path, emitted, _, tries = walk({-1: [0]}, [1], {}, rows, Sampler(0.0), None, NEVER)
    t = tries[0]
    assert t.inputs["pooled"] == 1 and t.inputs["neighbours"] == [2]
    assert t.inputs["tv"] == pytest.approx(0.08, abs=1e-6) and t.inputs["p_tilde"] == pytest.approx(0.43, abs=1e-6)
    assert path == [0] and t.accepted and t.exact is False          # rescued: exact wanted token 0
    walk = walk_of("lantern", model, k=3, delta=0.05)                # no neighbour fits: exact's verdict
    path, emitted, _, tries = walk({-1: [0]}, [1], {}, rows, Sampler(0.0), None, NEVER)
    assert path == [] and emitted == 0 and tries[0].inputs["pooled"] == 0


def test_lantern_spends_at_most_its_budget_per_test_and_is_lossy_under_sampling():
    """Over a one-node draft sampled from q: exact's first token follows p; LANTERN accepts more,
    pools at most delta of p per test (the TV its relaxed target spends), and its output moves off p
    (the residual comes from the original p, so the run as a whole is not held within delta:
    docs/methods.md says so)."""
    class Emb:
        weight = torch.eye(6) + torch.arange(6.)[:, None] * 0.01

    model = type("M", (), {"get_input_embeddings": lambda self: Emb()})()
    p, q = torch.tensor([.30, .25, .15, .12, .10, .08]), torch.tensor([.05, .05, .10, .10, .30, .40])
    gen = torch.Generator().manual_seed(0)
    draw = lambda: torch.rand((), generator=gen).item()   # noqa: E731
    n = 20000

    def run(walk):
        counts, accepted, spent = torch.zeros(6), 0, []
        for _ in range(n):
            x = int(torch.multinomial(q, 1, generator=gen))
            path, emitted, _, tries = walk({-1: [0], 0: []}, [x], {-1: q}, lambda node: p.log(), Sampler(1.0), gen, draw)
            counts[x if path else emitted] += 1
            accepted += bool(path)
            spent += [t.inputs["tv"] for t in tries if t.inputs]
        return counts / n, accepted / n, spent
    tv = lambda a: float((a - p).abs().sum() / 2)          # noqa: E731
    dist, acc_exact, _ = run(walk_of("exact"))
    assert tv(dist) < 0.02
    dist, acc_lantern, spent = run(walk_of("lantern", model, k=5, delta=0.1))
    assert max(spent) <= 0.1 and acc_lantern > acc_exact + 0.05 and tv(dist) > 0.05


def test_rapid_tests_the_draft_against_the_target_moved_toward_it():
    """p = (.5, .3, .2), q = (.1, .8, .1), x = 1, eta 2: p^ = softmax(log p + 2 (q - p)) = (.187, .677,
    .136), so x passes where u <= p^(1) / q(1) = .847 (exact: .375); a rejection resamples norm((p^ - q)+),
    and after an accepted leaf the bonus comes from p itself."""
    p, q = torch.tensor([.5, .3, .2]), torch.tensor([.1, .8, .1])
    hat = (p.log() + 2 * (q - p)).softmax(-1)
    a = float(hat[1] / q[1])
    assert a == pytest.approx(0.8466, abs=1e-3)
    walk = walk_of("rapid", eta=2.0)
    gen = torch.Generator().manual_seed(0)
    path, emitted, dist, tries = walk({-1: [0]}, [1], {-1: q}, lambda n: p.log(), Sampler(1.0), gen, lambda: a - 0.01)
    t = tries[0]
    assert path == [0] and t.accepted and t.exact is False                  # rescued: exact rejects at .837
    assert t.inputs["p_tilde"] == pytest.approx(float(hat[1]), abs=1e-6) and t.threshold == 2.0
    assert torch.allclose(dist, p)                                          # the bonus from p
    path, emitted, dist, tries = walk({-1: [0]}, [1], {-1: q}, lambda n: p.log(), Sampler(1.0), gen, lambda: a + 0.01)
    assert path == [] and not tries[0].accepted
    assert torch.allclose(dist, (hat - q).clamp_min(0) / (hat - q).clamp_min(0).sum())


def test_rapid_at_eta_0_is_the_exact_rule_draw_for_draw():
    g = torch.Generator().manual_seed(3)
    for case in range(40):
        p_log, q = torch.randn(5, generator=g) * 2, torch.randn(5, generator=g).mul(2).softmax(-1)
        x = int(torch.multinomial(q, 1, generator=g))
        runs = []
        for name, params in (("exact", {}), ("rapid", dict(eta=0.0))):
            gen, draws = torch.Generator().manual_seed(case), iter(torch.rand(4, generator=torch.Generator().manual_seed(case)).tolist())
            path, emitted, _, _ = walk_of(name, **params)({-1: [0]}, [x], {-1: q}, lambda n: p_log, Sampler(0.8), gen,
                                                          lambda: next(draws))
            runs.append((path, emitted))
        assert runs[0] == runs[1], case


def test_a_run_is_refused_in_one_line_where_its_rule_cannot_serve_it():
    with pytest.raises(ValueError, match="no greedy form"):
        check_run("typical", greedy=True)
    check_run("lantern", greedy=True)                     # LANTERN's greedy form exists
    with pytest.raises(ValueError, match="does not take \\['eps'\\]"):
        rule_params("lantern", {"eps": 0.1})
    with pytest.raises(ValueError, match="lantern takes k >= 1"):
        walk_of("lantern", object(), delta=2.0)
    with pytest.raises(ValueError, match="no greedy form"):
        check_run("rapid", greedy=True)
    with pytest.raises(ValueError, match="verifies the drafts of rapid only"):
        check_run("rapid", greedy=False, method="draft-model")
    with pytest.raises(ValueError, match="reads the draft's distribution q"):
        check_run("rapid", greedy=False, point_mass=True, method="rapid")
    with pytest.raises(ValueError, match="rapid takes 0 <= eta"):
        walk_of("rapid", eta=-1.0)


def test_a_lossy_rule_records_both_verdicts_and_its_decisions():
    """On the toy zoo, typical at T = 0.8: every tested node carries typical's and exact's verdicts,
    a policy decision per test, and the trace still replays; some token is rescued."""
    from speclab.decoding.registry import build_drafter
    from speclab.decoding.speculative import run
    from speclab.models.backends import make_lm
    from speclab.models.loading import model_info
    from speclab.models.zoo import load
    from speclab.trace import replay
    model, tok = load("code-target")
    draft = load("code-draft")[0]
    ids = tok("def fibonacci(n):")["input_ids"]
    trace = run(make_lm(model, "target"), build_drafter("draft-model", model, draft, {"k": 4}), tok, ids, 40,
                Sampler(0.8), 1, "light", "draft-model", {}, {"target": model_info(model, "code-target")},
                rule="typical", model=model)
    tested = [n for r in trace.rounds for n in r.nodes if n.decision != "not_reached"]
    assert tested and all(set(n.verdicts) == {"typical", "exact"} and n.rule == "typical" for n in tested)
    assert sum(len(r.decisions) for r in trace.rounds) == len(tested)
    assert any(n.verdicts["typical"] == "accepted" and n.verdicts["exact"] == "rejected" for n in tested)
    assert trace.params["rule"] == "typical" and trace.params["rule_params"] == {"eps": 0.09, "delta": 0.3}
    assert replay(trace) == trace.output_ids


def rsd_first_two(walk, T: float, n: int, seed: int = 0) -> torch.Tensor:
    """Counts (V, V) of the first two tokens RSD emits over a 2 x 2 tree drawn by the drafter's own
    Gumbel-Top-k, from fixed target and draft distributions over V = 6 tokens (no model: fast)."""
    from speclab.decoding.drafters.rsd import gumbel_top
    from speclab.decoding.tree import DraftTree
    V, g = 6, torch.Generator().manual_seed(seed)
    logit = lambda s: torch.randn(V, generator=torch.Generator().manual_seed(s)) * 1.5   # noqa: E731
    p_log = {(): logit(1), **{(a,): logit(10 + a) for a in range(V)}, **{(a, b): logit(100 + 6 * a + b) for a in range(V) for b in range(V)}}
    q_log = {(): logit(2), **{(a,): logit(50 + a) for a in range(V)}}
    s = Sampler(T)
    draw = lambda: torch.rand((), generator=g).item()      # noqa: E731
    counts = torch.zeros(V, V)
    for _ in range(n):
        tree, prefix = DraftTree(), {-1: ()}
        for parent in [-1]:
            q = warp(q_log[()], s)
            tree.set_q(-1, q)
            for x in gumbel_top(q[None], 2, g)[0][0].tolist():
                node = tree.add(x, -1, float(q[x]))
                prefix[node] = (x,)
                q2 = warp(q_log[(x,)], s)
                tree.set_q(node, q2)
                for y in gumbel_top(q2[None], 2, g)[0][0].tolist():
                    prefix[tree.add(y, node, float(q2[y]))] = (x, y)
        path, emitted, _, _ = walk(tree.children(), tree.tokens, tree.q_map(), lambda node: p_log[prefix[node]],
                                   s, g, draw)
        tally_first_two(counts, [tree.tokens[i] for i in path] + [emitted], p_log, s, g)
    return counts, first_two_joint(p_log, s, V)


def tally_first_two(counts: torch.Tensor, toks: list[int], p_log: dict, s: Sampler, g) -> None:
    """Count a round's first two emitted tokens; a round that emitted one draws the second from p."""
    if len(toks) < 2:
        toks = toks + [int(torch.multinomial(warp(p_log[tuple(toks)], s), 1, generator=g))]
    counts[toks[0], toks[1]] += 1


def first_two_joint(p_log: dict, s: Sampler, V: int) -> torch.Tensor:
    """The target's joint (V, V) of its first two tokens, as warped."""
    return torch.stack([warp(p_log[()], s)[a] * warp(p_log[(a,)], s) for a in range(V)])


def chi2_p(counts: torch.Tensor, joint: torch.Tensor) -> float:
    from scipy.stats import chisquare
    n = counts.sum()
    exp, obs = (joint.flatten() * n).double(), counts.flatten().double()
    keep = exp >= 5                                       # pool the rare cells into one
    e, o = exp[keep], obs[keep]
    if (~keep).any():
        e, o = torch.cat([e, exp[~keep].sum()[None]]), torch.cat([o, obs[~keep].sum()[None]])
    return float(chisquare(o.numpy(), e.numpy() * o.sum().item() / e.sum().item()).pvalue)


@pytest.mark.parametrize("T", TEMPERATURES)
def test_rsd_emits_the_targets_joint_distribution(T):
    """Two levels of siblings drawn without replacement, verified by `rsd`: the joint of the first
    two tokens is p's (tests/sampling_law.py: N draws, 6 cells, alpha 0.001)."""
    counts, joint = rsd_first_two(walk_of("rsd"), T, N)
    follows(table_law(joint), pairs_of(counts))


def test_rsd_without_renormalising_q_is_caught():
    """The negative control: keeping the full q for later siblings is not lossless, and the same
    test sees it (at T = 0.7, where it departs most)."""
    from speclab.decoding.rules.rsd import make
    counts, joint = rsd_first_two(make({}, renormalise=False), 0.7, N_BROKEN)
    departs(table_law(joint), pairs_of(counts))
