"""RSD-S (drafters/rsd_s.py, figures/rsd_s.py): the truncated Gumbel as numbers in and out, the beam's
best sequence following the draft's law over sequences (and the beam without truncation caught by
the same test), greedy equality with `ar` on the toy zoo, and what a sampled run records and draws.
Its verify's law (the `rsd` rule over the beam's trees) is tests/test_sampling_power.py's."""
from __future__ import annotations

import math

import pytest
import torch
from sampling_law import N, N_BROKEN, departs, follows, pairs_of, table_law

from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters import rsd_s
from speclab.decoding.drafters.rsd_s import RSDSDrafter, grow_beam, truncated_gumbel

pytestmark = pytest.mark.usefixtures("one_thread")     # tiny products: one thread (conftest)

V = 4


# -- the truncated Gumbel --------------------------------------------------------------------------
def test_the_truncated_gumbel_puts_the_best_child_at_the_parents_score_and_keeps_the_order():
    """G = -log(exp(-T) - exp(-Z) + exp(-G~)): the child with G~ = Z gets T exactly, every other one
    less, in G~'s order; a child q gives no mass stays at -inf."""
    g_tilde = torch.tensor([-0.5, 1.25, 0.0, -math.inf], dtype=torch.float64)
    t = torch.tensor(-2.0, dtype=torch.float64)
    G = truncated_gumbel(g_tilde, g_tilde.max(), t)
    assert G[1] == t and G[3] == -math.inf
    assert G[1] > G[2] > G[0]
    want = -torch.log(torch.exp(-t) - torch.exp(-g_tilde.max()) + torch.exp(-g_tilde[:3]))
    assert torch.allclose(G[:3], want, rtol=0, atol=1e-12)
    far = truncated_gumbel(torch.tensor([30.0, -40.0], dtype=torch.float64), torch.tensor(30.0, dtype=torch.float64),
                           torch.tensor(-30.0, dtype=torch.float64))            # exp(30) beside exp(40): stable form
    assert far[0] == -30.0 and far[1] == pytest.approx(-40.0 - math.log1p(math.exp(-10.0)), abs=1e-12)


# -- the beam's best sequence: a draw from the draft's law over sequences --------------------------
def tables(scale: float = 2.0, seed: int = 2) -> dict:
    """The draft's logits (V = 4) after a fixed prefix and after each first token."""
    logit = lambda s: torch.randn(V, generator=torch.Generator().manual_seed(s)) * scale   # noqa: E731
    return {(): logit(seed), **{(a,): logit(100 * seed + 10 + a) for a in range(V)}}


def best_sequences(q_log: dict, n: int, T: float = 1.0, width: int = 2, seed: int = 0):
    """Counts (V, V) of the beam's best two-token sequence (the last level's top score) over n beams
    of `width`, and the draft's joint over two-token sequences. Stochastic beam search keeps the
    sequence of the highest perturbed score among ALL sequences, so the best follows q's joint."""
    s, g = Sampler(T), torch.Generator().manual_seed(seed)
    q_probs = {key: lg.softmax(-1) for key, lg in q_log.items()}

    def q_at(tree):
        paths = [()] + [tuple(tree.tokens[i] for i in tree.path_to(k)) for k in range(len(tree))]
        return torch.stack([q_probs.get(p, torch.full((V,), 1 / V)) for p in paths])
    counts = torch.zeros(V, V)
    for _ in range(n):
        tree = grow_beam(width, 2, q_at, s, g)
        node = tree.decisions[-1].inputs["candidates"][0][-1]         # best first
        a, b = (tree.tokens[i] for i in tree.path_to(node))
        counts[a, b] += 1
    joint = torch.stack([warp(q_log[()], s)[a] * warp(q_log[(a,)], s) for a in range(V)])
    return counts, joint


def test_the_beams_best_sequence_follows_the_drafts_law_over_sequences():
    counts, joint = best_sequences(tables(), N)
    follows(table_law(joint), pairs_of(counts))


def test_a_beam_without_the_truncation_is_caught(monkeypatch):
    """The negative control: each level's children scored phi + a fresh Gumbel, not truncated at
    their parent's score; the best of the kept parents' children is then no draw from q over whole
    sequences (binned TV about 0.1 here). The verify would still hold p (each parent's kept children
    are a Gumbel-Top-k draw's first), so this is what the beam alone owes."""
    monkeypatch.setattr(rsd_s, "truncated_gumbel", lambda g_tilde, z, t: g_tilde)
    counts, joint = best_sequences(tables(), N_BROKEN)
    departs(table_law(joint), pairs_of(counts))


# -- runs on the toy zoo --------------------------------------------------------------------------
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):"]


def test_rsd_s_greedy_is_identical_to_ar(target, draft):
    """At temperature 0 the beam is the draft's beam search and the greedy match decides."""
    import speclab
    for prompt in PROMPTS:
        want = speclab.generate(target, prompt, "ar", max_new_tokens=24, record=None).ids
        r = speclab.generate(target, prompt, "tree-rsd-s", draft=draft, max_new_tokens=24)
        assert r.ids == want
        assert r.trace.totals.tau > 1.2 and all(len(rnd.nodes) == 15 for rnd in r.trace.rounds)


def test_a_sampled_run_records_the_beam_per_level_and_draws_it(target, draft, tmp_path):
    """At T = 0.8, width 3, depth 3: every round drafts 3 nodes a level; each level's decision lists
    the candidates best first, the kept 3 (its output) above the cut (threshold: the lowest kept
    score) and the dropped below it; each parent's children sit in descending score, the order the
    verify tries them; the run replays and survives a save and load; the beam figure draws the kept
    and dropped candidates of every level."""
    import speclab
    from speclab.figures.rsd_s import beam_figure
    from speclab.figures.views import view_of
    from speclab.trace import Trace, replay
    r = speclab.generate(target, PROMPTS[0], "tree-rsd-s", draft=draft, max_new_tokens=32, temperature=0.8,
                         seed=1, record="light", width=3, depth=3)
    trace = r.trace
    assert trace.params["rule"] == "rsd" and trace.guarantee == "identical-to-ar"
    assert replay(trace) == trace.output_ids
    for rnd in trace.rounds:
        levels = [d for d in rnd.decisions if d.policy == "tree-rsd-s"]
        assert [d.at for d in levels] == [1, 2, 3] and len(rnd.nodes) == 9
        assert rnd.info["beam_width"] == 3 and len(rnd.info["beam_truncated"]) == 3
        score = {}
        for d in levels:
            cands = d.inputs["candidates"]
            gs = [c[3] for c in cands]
            assert gs == sorted(gs, reverse=True) and len(cands) == 6
            kept = [c for c in cands if c[4] >= 0]
            assert sorted(c[4] for c in kept) == sorted(d.output) and len(kept) == 3
            assert min(c[3] for c in kept) == d.threshold >= max(c[3] for c in cands if c[4] < 0)
            assert len(d.inputs["truncated"]) == rnd.info["beam_truncated"][d.at - 1]
            for c in kept:
                score[c[4]] = c[3]
                assert rnd.nodes[c[4]].token == c[1] and rnd.nodes[c[4]].parent == c[0]
        kids = {}
        for n in rnd.nodes:
            kids.setdefault(n.parent, []).append(score[n.id])
        assert all(s == sorted(s, reverse=True) for s in kids.values())
    assert any(sum(rnd.info["beam_truncated"]) for rnd in trace.rounds)    # a sequence was cut early somewhere
    back = Trace.load(trace.save(tmp_path / "rsd-s.json"))
    assert back.rounds[0].decisions == trace.rounds[0].decisions
    assert "stochastic beam" in [f.name for f in view_of(back).step]
    fig = beam_figure(back, 0)
    drawn = {t.name: len([x for x in t.x if x is not None]) for t in fig.data}
    assert drawn["dropped"] == 9 and sum(v for k, v in drawn.items() if k.startswith("kept")) == 9
    assert drawn["cut (lowest kept score)"] == 6                             # a tick of two points a level


def test_bad_beam_parameters_are_refused_in_one_line(draft):
    with pytest.raises(ValueError, match="width must be an integer >= 1"):
        RSDSDrafter(draft[0], width=0)
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        RSDSDrafter(draft[0], depth=2.5)
