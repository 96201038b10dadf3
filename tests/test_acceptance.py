"""Acceptance rules: exact expectations, and chi-square tests that sampling keeps the target
distribution (10^5 draws, fixed seeds, p-value threshold 1e-3)."""
import pytest
import torch
from scipy.stats import chisquare

from speclab.decoding.acceptance import (Sampler, accept_prob, greedy_chain, greedy_ids, remove_token, residual,
                                         speculative_sampling_chain, walk_tree, warp)

N_DRAWS = 100_000
# the tree walk draws one host walk per sample (~0.3 ms each): 12,000 over 8 cells detect a TV of
# 0.03 from p with power > 0.9 at P_MIN (noncentral chi-square, df 7: lambda >= 4 N TV^2 = 43 against
# the 24.3 critical value), far past the 0.05 the sampling-power tests (tests/sampling_law.py) ask
N_TREE_DRAWS = 12_000
P_MIN = 1e-3


pytestmark = pytest.mark.usefixtures("one_thread")     # 10^5 tiny tensor ops (conftest)


def test_greedy_chain_exact():
    assert greedy_chain([5, 6, 7], [5, 6, 7, 8]) == (3, 8)      # all accepted: bonus
    assert greedy_chain([5, 9, 7], [5, 6, 7, 8]) == (1, 6)      # correction at the first mismatch
    assert greedy_chain([], [4]) == (0, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_greedy_ids_is_torch_argmax_with_ties_to_the_lowest_id(dtype):
    g = torch.Generator().manual_seed(0)
    for shape in [(49152,), (6, 49152), (2, 3, 7)]:
        x = torch.randn(*shape, generator=g).to(dtype)
        x[..., [6, 2, 4]] = 50.0                                # a three-way tie at the top
        if x.dim() > 1:
            x[0, ..., 3] = 60.0                                 # and rows with a single winner
        with torch.inference_mode():
            got = greedy_ids(x)
        assert got.dtype == torch.int64 and got.shape == x.shape[:-1]
        assert torch.equal(got, x.float().argmax(-1))
        assert set(got.flatten().tolist()) <= {2, 3}
    assert torch.equal(greedy_ids(x[..., ::2]), x[..., ::2].float().argmax(-1))     # a strided view


def test_accept_prob_exact():
    assert accept_prob(0.2, 0.4) == pytest.approx(0.5)
    assert accept_prob(0.6, 0.3) == 1.0
    assert accept_prob(0.3, None) == pytest.approx(0.3)       # point mass: q(x) = 1


def test_a_token_the_target_cannot_emit_is_never_accepted():
    """p(x) = 0 rejects before q is looked at (q(x) = 0 once made it 1); q(x) = 0 with p(x) > 0 accepts;
    u = 0.0, which torch.rand can return, does not accept an impossible token either."""
    from speclab.decoding.acceptance import accepts, speculative_sampling_chain
    assert accept_prob(0.0, 0.0) == 0.0 and accept_prob(0.0, None) == 0.0 and accept_prob(0.0, 0.5) == 0.0
    assert accept_prob(0.4, 0.0) == 1.0
    assert not accepts(0.0, 0.0, 0.3) and accepts(0.0, 0.1, 0.3)
    n, tok, _ = speculative_sampling_chain([1], torch.tensor([[1., 0.]]), torch.tensor([[1., 0.], [1., 0.]]),
                                           torch.tensor([.5]), None)
    assert (n, tok) == (0, 0)


def test_residual_and_remove_token():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(remove_token(p, 0), torch.tensor([0.0, 0.6, 0.4]))


def test_warp_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert torch.allclose(warp(logits, Sampler(1.0, top_k=2)), torch.tensor([2 / 3, 1 / 3, 0, 0]))
    assert torch.allclose(warp(logits, Sampler(1.0, top_p=0.7)), torch.tensor([2 / 3, 1 / 3, 0, 0]))
    assert torch.equal(warp(logits, Sampler(0.0)), torch.tensor([1.0, 0, 0, 0]))
    with pytest.raises(ValueError, match="temperature"):
        Sampler(-1.0)


def _chi2(counts: torch.Tensor, probs: torch.Tensor):
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a token the target gives probability 0"
    exp = probs[keep].double() / probs[keep].double().sum() * counts.sum()
    return chisquare(counts[keep].double().numpy(), exp.numpy()).pvalue


@pytest.mark.parametrize("sampler", [Sampler(1.0), Sampler(0.7, top_k=4), Sampler(1.3, top_p=0.8)])
def test_speculative_sampling_keeps_target_distribution(sampler):
    g = torch.Generator().manual_seed(0)
    V = 6
    p_logits, q_logits = torch.randn(2, V, generator=g) * 1.5, torch.randn(V, generator=g) * 1.5
    p = warp(p_logits, sampler)                                  # (2, V): first and bonus position
    q = warp(q_logits, sampler)[None]                            # (1, V)
    counts = torch.zeros(V)
    xs = torch.multinomial(q[0], N_DRAWS, replacement=True, generator=g)
    us = torch.rand(N_DRAWS, generator=g)
    for x, u in zip(xs.tolist(), us):
        n, tok, _ = speculative_sampling_chain([x], q, p, u.view(1), g)
        counts[x if n == 1 else tok] += 1
    assert _chi2(counts, p[0]) > P_MIN


def _tree_first_token_counts(p_row, children_q, sampler, point_mass, g):
    """First committed token from a root with 3 children: i.i.d. from q, or distinct point masses."""
    V = p_row.shape[0]
    counts = torch.zeros(V)
    for _ in range(N_TREE_DRAWS):
        if point_mass:
            toks = torch.randperm(V, generator=g)[:3].tolist()
            qmap = {}
        else:
            toks = torch.multinomial(children_q, 3, replacement=True, generator=g).tolist()
            qmap = {-1: children_q}
        draw = lambda: torch.rand((), generator=g).item()
        path, emitted, _, _ = walk_tree({-1: [0, 1, 2]}, toks, qmap, lambda n: p_row, sampler, g, draw)
        counts[toks[path[0]] if path else emitted] += 1
    return counts


@pytest.mark.parametrize("point_mass", [False, True])
def test_tree_recursive_rejection_keeps_target_distribution(point_mass):
    g = torch.Generator().manual_seed(1)
    V, sampler = 8, Sampler(1.0)
    p_logits = torch.randn(V, generator=g) * 2
    q = warp(torch.randn(V, generator=g) * 2, sampler)
    counts = _tree_first_token_counts(p_logits, q, sampler, point_mass, g)
    assert _chi2(counts, warp(p_logits, sampler)) > P_MIN


def test_greedy_walk_takes_longest_matching_path():
    # root children: 0 (tok 3), 1 (tok 4); node 1 -> 2 (tok 5); target argmax: root 4, after 1: 5, after 2: 9
    argmax = {-1: 4, 1: 5, 2: 9, 0: 0}
    logits = lambda n: torch.nn.functional.one_hot(torch.tensor(argmax[n]), 10).float()
    path, emitted, _, tries = walk_tree({-1: [0, 1], 1: [2]}, [3, 4, 5], {}, logits, Sampler(0.0), None, lambda: 0.0)
    assert path == [1, 2] and emitted == 9
    assert [t.node for t in tries] == [0, 1, 2] and [t.accepted for t in tries] == [False, True, True]
