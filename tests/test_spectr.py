"""SpecTr (drafters/spectr.py, rules/kseq.py): K-SEQ's cases as tensors in and tokens out, its
acceptance and output law at the token level, the joint of a round's first two tokens on a real
(tiny) model pair, the negative control the same test catches, greedy equality with `ar`, and the
trace a run leaves."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import greedy_identical_to_ar
from sampling_law import N, N_BROKEN, TEMPERATURES, departs, follows, pairs_of, table_law
from test_rules import chi2_p, first_two_joint, tally_first_two

from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.spectr import grow_chains
from speclab.decoding.rules import get_rule
from speclab.decoding.rules.kseq import beta_of, kseq, make, rho_star

V = 6


def draws(*us):
    it = iter(us)
    return lambda: next(it)


# -- token level ----------------------------------------------------------------------------------
def test_kseq_on_two_copies_of_a_point_mass_draft():
    """p = (1/2, 1/2), q = delta(0), k = 2: beta(rho) = 1/(2 rho), so f = 0 at rho* = 1/(2 - sqrt 2)
    and each copy of token 0 is accepted with 1 - 1/sqrt 2: P(accept) = 1/2 = p(0), and the
    residual is all on token 1."""
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    rho, b = rho_star(p, q, 2)
    assert 0 <= rho - 1 / (2 - math.sqrt(2)) < 1e-10 and b == pytest.approx(1 - 1 / math.sqrt(2))   # from above
    a = 1 - 1 / math.sqrt(2)
    x, i, tests, *_ = kseq([0, 0], p, q, draws(a - 1e-6), None)
    assert (x, i) == (0, 0) and tests[0][1] == pytest.approx(a)
    x, i, tests, *_ = kseq([0, 0], p, q, draws(a + 1e-6, a - 1e-6), None)
    assert (x, i, len(tests)) == (0, 1, 2)                  # the duplicate gets its own draw
    x, i, _, _, _, res = kseq([0, 0], p, q, draws(a + 1e-6, a + 1e-6), torch.Generator().manual_seed(0))
    assert (x, i) == (1, None) and res[0] < 1e-9 and res[1] == pytest.approx(1.0)


def test_kseq_is_plain_speculative_sampling_for_one_candidate_and_certain_where_q_is_p():
    p, q = torch.tensor([0.2, 0.3, 0.5]), torch.tensor([0.5, 0.3, 0.2])
    assert rho_star(p, q, 1) == (1.0, pytest.approx(0.7))
    assert kseq([0], p, q, draws(0.39), None)[1] == 0        # min(1, 0.2 / 0.5) = 0.4
    assert kseq([0], p, q, draws(0.41), None)[1] is None
    rho, b = rho_star(p, p, 4)
    assert rho == 1.0 and b == pytest.approx(1.0)
    assert kseq([0, 1, 2, 0], p, p, draws(0.999999), None)[1] == 0


def random_pair(seed: int, scale: float = 1.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, generator=g) * scale).softmax(-1), (torch.randn(V, generator=g) * scale).softmax(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rho_star_is_the_upper_root_and_leaves_a_residual_that_is_never_negative(seed):
    p, q = random_pair(seed)
    for k in (2, 4, 8):
        rho, b = rho_star(p, q, k)
        assert 1 <= rho <= k
        assert b == pytest.approx(float(torch.minimum(q.double(), p.double() / rho).sum()), abs=1e-12)
        f = 1 - (1 - b) ** k - rho * b
        assert -1e-9 <= f <= 0                              # the upper end of the bracket
        acc = torch.minimum(q.double(), p.double() / rho) * (1 - (1 - b) ** k) / b
        assert float((p.double() - acc).min()) >= -1e-12    # acc <= p: what the residual needs
        assert float((p.double() - acc).min()) <= 1e-6      # and tight: a smaller rho breaks it
    beta = beta_of(p, q)
    for r in (1.0, 1.7, 3.0):
        assert beta(r) == pytest.approx(float(torch.minimum(q, p / r).sum()), abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_kseq_accepts_as_often_as_the_paper_says_and_emits_p(seed, one_thread):
    """20,000 draws of k = 4 candidates from q: the acceptance rate is 1 - (1 - beta(rho*))^k (within
    4.5 standard errors), above single-draft speculative sampling's 1 - TV(p, q), and the emitted
    token follows p (chi-square)."""
    p, q = random_pair(seed)
    k, n = 4, 20000
    g = torch.Generator().manual_seed(10 + seed)
    draw = lambda: torch.rand((), generator=g).item()     # noqa: E731
    rho, b = rho_star(p, q, k)
    cands = torch.multinomial(q, n * k, replacement=True, generator=g).view(n, k).tolist()
    counts, accepted = torch.zeros(V), 0
    for c in cands:
        x, i, *_ = kseq(c, p, q, draw, g, rho, b)
        counts[x] += 1
        accepted += i is not None
    want = 1 - (1 - b) ** k
    assert abs(accepted / n - want) < 4.5 * math.sqrt(want * (1 - want) / n)
    assert want > float(torch.minimum(p, q).sum()) + 0.05
    assert chi2_p(counts[None], p[None]) > 1e-3


# -- sequence level, on a real model pair ---------------------------------------------------------
@pytest.fixture(scope="module")
def tables():
    return model_tables()


def model_tables():
    """The logits of a tiny random Llama target and draft (V = 6) after a fixed prompt
    and after every continuation of one and two tokens: one batched forward each."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def tiny(seed):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                          initializer_range=0.3)
        return LlamaForCausalLM(cfg).eval()

    prompt = [1, 2, 3]
    seqs = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
    out = []
    for seed in (0, 1):                                     # the target, then the draft
        with torch.no_grad():
            lg = tiny(seed)(seqs).logits                    # (36, 5, V)
        n = len(prompt)
        table = {(): lg[0, n - 1]}
        table |= {(a,): lg[V * a, n] for a in range(V)}
        table |= {(a, b): lg[V * a + b, n + 1] for a in range(V) for b in range(V)}
        out.append(table)
    return out


def spectr_first_two(walk, tables, T: float, n: int, k: int = 3, seed: int = 0):
    """Counts (V, V) of the first two tokens of SpecTr rounds (k chains of 2 drawn by the drafter's
    own grow_chains from the tiny draft, verified by `walk`) against the target's joint."""
    p_log, q_log = tables
    s, g = Sampler(T), torch.Generator().manual_seed(seed)
    draw = lambda: torch.rand((), generator=g).item()     # noqa: E731

    def prefix(tree, node):
        return tuple(tree.tokens[i] for i in tree.path_to(node))

    q_probs = {key: lg.softmax(-1) for key, lg in q_log.items()}

    def q_at(tree):                                         # the draft's probabilities, as a draft forward gives them
        return torch.stack([q_probs[prefix(tree, i)] for i in range(-1, len(tree))])

    counts = torch.zeros(V, V)
    for _ in range(n):
        tree = grow_chains(k, 2, q_at, s, g)
        path, emitted, _, _ = walk(tree.children(), tree.tokens, tree.q_map(),
                                   lambda node: p_log[prefix(tree, node)], s, g, draw)
        tally_first_two(counts, [tree.tokens[i] for i in path] + [emitted], p_log, s, g)
    return counts, first_two_joint(p_log, s, V)


@pytest.mark.parametrize("T", TEMPERATURES)
def test_spectr_emits_the_targets_joint_distribution(T, tables, one_thread):
    """Three chains of two tokens, K-SEQ per depth with the survivors' rho* recomputed: the joint of
    the first two tokens is the target's (tests/sampling_law.py: N draws, 6 cells, alpha 0.001)."""
    counts, joint = spectr_first_two(get_rule("k-seq").make({}), tables, T, N)
    follows(table_law(joint), pairs_of(counts))


def test_kseq_with_rho_fixed_at_one_is_caught(tables, one_thread):
    """The negative control: k independent plain tests (rho = 1) over-accept the draft's tokens, and
    the same test sees the joint move off the target's (at T = 0.7, where it departs most)."""
    counts, joint = spectr_first_two(make({}, rho=1.0), tables, 0.7, N_BROKEN)
    departs(table_law(joint), pairs_of(counts))


# -- runs on the toy zoo --------------------------------------------------------------------------
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):"]


def test_spectr_greedy_is_identical_to_ar(target, draft):
    for r in greedy_identical_to_ar(target, PROMPTS, "spectr", draft, max_new_tokens=24):
        assert r.trace.totals.tau > 1.2 and all(rnd.info["k"] == 1 for rnd in r.trace.rounds)


def test_a_sampled_run_records_kseq_decisions_both_verdicts_and_the_chains(target, draft):
    """At T = 0.8: every round drafts 4 chains of 4 tokens (`source` names the chain); every tested
    node carries k-seq's and exact's verdicts and one decision with rho*, beta, k', p(x), q(x), its
    threshold the acceptance probability min(1, p / (rho q)); K-SEQ never accepts where the
    single-draft test with the same u rejects (rho* >= 1), and rejects some it would accept; a
    deeper depth tests only the survivors; the run replays, and its rounds saw the committed
    text's own target distribution (the cache kept a right path)."""
    import speclab
    from speclab.trace import replay
    model, tok = target
    r = speclab.generate(target, PROMPTS[0], "spectr", draft=draft, max_new_tokens=32, temperature=0.8,
                         seed=1, record="full")
    trace = r.trace
    assert trace.params["rule"] == "k-seq" and trace.guarantee == "identical-to-ar"
    assert replay(trace) == trace.output_ids
    tested, decisions = 0, 0
    for rnd in trace.rounds:
        assert len(rnd.nodes) == 16 and {n.source for n in rnd.nodes} == {f"chain{i}" for i in range(4)}
        by_id = {n.id: n for n in rnd.nodes}
        for d in rnd.decisions:
            node = by_id[d.at]
            assert set(node.verdicts) == {"k-seq", "exact"} and node.rule == "k-seq"
            assert 1 <= d.inputs["rho"] <= d.inputs["k"] and 0 <= d.inputs["beta"] <= 1
            assert d.inputs["p"] == pytest.approx(node.p, abs=1e-6) and d.inputs["q"] == pytest.approx(node.q, abs=1e-6)
            assert d.threshold == pytest.approx(min(1.0, node.p / (d.inputs["rho"] * node.q)), rel=1e-4)
            # the candidates of a depth are the chains that agreed with every token emitted before it
            alive = [n for n in rnd.nodes if n.depth == node.depth
                     and [by_id[a].token for a in path_of(by_id, n)[:-1]] == rnd.path_tokens[:node.depth - 1]]
            assert d.inputs["k"] == len(alive)
        tested += sum(n.decision != "not_reached" for n in rnd.nodes)
        decisions += len(rnd.decisions)
    nodes = [n for rnd in trace.rounds for n in rnd.nodes if n.verdicts]
    assert tested == decisions > 0
    assert not any(n.verdicts["k-seq"] == "accepted" and n.verdicts["exact"] == "rejected" for n in nodes)
    assert any(n.verdicts["k-seq"] == "rejected" and n.verdicts["exact"] == "accepted" for n in nodes)
    assert any(d.inputs["k"] < 4 for rnd in trace.rounds for d in rnd.decisions)
    # the first draft depth of each round read the target after the committed text: a fresh forward agrees
    ids = trace.prompt_ids + trace.output_ids
    with torch.no_grad():
        fresh = model(torch.tensor([ids])).logits[0]
    done = len(trace.prompt_ids)
    for rnd in trace.rounds:
        first = next(n for n in rnd.nodes if n.parent == -1)
        want = warp(fresh[done - 1], Sampler(0.8))
        assert [t for t, _ in first.p_topk] == want.topk(5).indices.tolist()
        assert [v for _, v in first.p_topk] == pytest.approx(want.topk(5).values.tolist(), abs=1e-4)
        done += rnd.kept


def path_of(by_id, n):
    path = [n.id]
    while by_id[path[0]].parent >= 0:
        path.insert(0, by_id[path[0]].parent)
    return path


def test_a_bad_chain_count_is_refused_in_one_line(draft):
    from speclab.decoding.drafters.spectr import SpecTrDrafter
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        SpecTrDrafter(draft[0], k=0)
    with pytest.raises(ValueError, match="lower k"):
        SpecTrDrafter(draft[0], k=16, L=4)
