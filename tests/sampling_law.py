"""The law of the first two sampled tokens, and a test of it with known power (issue 69).

A lossless method must emit, at temperature T, the target's own joint law of its first two new
tokens: p(x1) p(x2 | x1), read here from the target model's logits. `target_law` bins that law
into CELLS cells (the CELLS - 1 likeliest pairs and one "other" cell); `draw_pairs` runs the
method's real round (the engine's `decode`: the target's forward, the method's drafter, the
acceptance rule) over N seeds; `follows` / `departs` test the binned counts by Pearson's
chi-square at ALPHA.

How many draws (`N`): the alternative to detect is any law at total variation TV = 0.05 from the
target's on the binned cells. Over cells with target probabilities p_i, a law p_i + d_i has
chi-square divergence sum d_i^2 / p_i >= (sum |d_i|)^2 = 4 TV^2 (Cauchy-Schwarz against sum p_i =
1), so Pearson's statistic on N draws is noncentral chi-square with df = CELLS - 1 and
noncentrality lambda >= 4 N TV^2, whatever the alternative's shape (equality: half the target's
mass gains TV in proportion, the other half loses it, the worst case). `draws_for` finds the
smallest N with P(ncx2(df, 4 N TV^2) > chi2.isf(ALPHA, df)) >= POWER using scipy. With CELLS = 6,
ALPHA = 1e-3, TV = 0.05, POWER = 0.9: critical value 20.52, lambda = 29.2, N = 2,921 (a table,
same calculation: df 3 -> 2,594; df 5 -> 2,921; df 9 -> 3,408; at alpha 0.01, df 5 -> 2,203).
Every family's test draws N at each of T = 0.7 and 1. Its broken variant is a negative control:
it runs once, at the temperature where it departs most, and must be rejected there on
N_BROKEN = draws_for(tv=0.1) = 731 draws (the same calculation for a departure of TV 0.1; the
controls depart by 0.1 to 0.65, and a control that departs by less needs N). Seeds are fixed, so
a run is reproducible: ALPHA is the chance that a correct method fails at a fresh set of seeds
(after a change to the random stream).

Where the time goes: a draw is a few forwards of a one-layer model, each mostly Python overhead,
so `draw_pairs_in_batch` runs a batchable method's draws as lanes of the batch engine
(decoding/batch.py), one target forward per round for all of them; a lane is its run alone, bit
for bit (test_batch), so its law is the single run's.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from speclab.decoding.acceptance import Sampler, warp

ALPHA, TV, POWER, CELLS = 1e-3, 0.05, 0.9, 6
TEMPERATURES = (0.7, 1.0)


@lru_cache
def draws_for(cells: int = CELLS, tv: float = TV, alpha: float = ALPHA, power: float = POWER) -> int:
    """The fewest draws for which Pearson's chi-square over `cells` cells at level `alpha` rejects
    every law at binned total variation >= tv from the target's with probability >= power
    (noncentrality 4 N tv^2: the worst case, see the module's docstring)."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2
    df = cells - 1
    crit = chi2.isf(alpha, df)
    lam = brentq(lambda x: ncx2.sf(crit, df, x) - power, 1e-6, 1e4)
    return int(np.ceil(lam / (4 * tv * tv)))


N = draws_for()
N_BROKEN = draws_for(tv=0.1)


@dataclass
class Law:
    """A law of (x1, x2) binned: `pairs` the named cells, `probs` their probabilities with the
    "other" cell last."""
    pairs: list[tuple[int, int]]
    probs: np.ndarray

    def counts(self, drawn: list[tuple[int, int]]) -> np.ndarray:
        where = {pair: i for i, pair in enumerate(self.pairs)}
        out = np.zeros(len(self.probs))
        for pair in drawn:
            out[where.get(tuple(pair), len(self.pairs))] += 1
        return out

    def pvalue(self, drawn) -> float:
        from scipy.stats import chisquare
        obs = self.counts(drawn)
        return float(chisquare(obs, self.probs * obs.sum()).pvalue)

    def tv(self, drawn) -> float:
        obs = self.counts(drawn)
        return 0.5 * float(np.abs(obs / obs.sum() - self.probs).sum())


def target_law(model, prompt_ids: list[int], sampler: Sampler, cells: int = CELLS, firsts: int = 8) -> Law:
    """The target's law of its first two tokens after `prompt_ids` under `sampler`, binned: the
    cells - 1 likeliest pairs (x1 among the `firsts` likeliest first tokens) and "other"."""
    with torch.no_grad():
        p1 = warp(model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].double(), sampler).double()
        top1 = p1.topk(firsts).indices.tolist()
        rows = model(input_ids=torch.tensor([prompt_ids + [a] for a in top1])).logits[:, -1].double()
    joint = {}
    for a, row in zip(top1, rows):
        p2 = warp(row, sampler).double()
        v, i = p2.topk(cells)
        joint |= {(a, b): float(p1[a] * pb) for b, pb in zip(i.tolist(), v.tolist())}
    pairs = sorted(joint, key=joint.get, reverse=True)[: cells - 1]
    probs = np.array([joint[k] for k in pairs] + [0.0])
    probs[-1] = 1.0 - probs[:-1].sum()
    assert probs[-1] > 0.05 and probs[:-1].min() * N > 20, probs     # every cell well filled
    return Law(pairs, probs)


def table_law(joint: torch.Tensor, cells: int = CELLS) -> Law:
    """A law of (x1, x2) given as a (V, V) table (a rule driven over logits tables, no model), binned
    as target_law bins a model's: its cells - 1 likeliest pairs and "other"."""
    V = joint.shape[1]
    v, i = joint.flatten().double().topk(cells - 1)
    probs = np.array(v.tolist() + [0.0])
    probs[-1] = 1.0 - probs[:-1].sum()
    assert probs[-1] > 0.05 and probs[:-1].min() * N > 20, probs     # every cell well filled
    return Law([divmod(int(k), V) for k in i], probs)


def pairs_of(counts: torch.Tensor) -> list[tuple[int, int]]:
    """The draws a (V, V) table of counts holds, as pairs."""
    return [(a, b) for (a, b), c in zip(np.ndindex(*counts.shape), counts.flatten().long().tolist()) for _ in range(c)]


def draw_pairs(lm, drafter, prompt_ids: list[int], sampler: Sampler, n: int = N, seed0: int = 0,
               decode=None) -> list[tuple[int, int]]:
    """The first two tokens of n runs of `drafter` on the target forward `lm` (seeds seed0 ..),
    through the engine's decode (or `decode`, a method's own loop with the same signature)."""
    from speclab.decoding.speculative import decode as engine_decode
    run = decode or engine_decode
    out = []
    for seed in range(seed0, seed0 + n):
        new, _, _ = run(lm, drafter, prompt_ids, 2, sampler, seed=seed, record=None)
        out.append((new[0], new[1]))
    return out


def pair_counts(lm, make_drafter, prompt_ids: list[int], sampler: Sampler, n: int, V: int, seed0: int = 0):
    """The first two tokens of n runs (seeds seed0 ..) on the target forward `lm`, each with the drafter
    make_drafter() gives, counted in a (V, V) table (float64), and each run's first round (what its
    draft kept): the loop of a test against next_two_joint's law."""
    from speclab.decoding.speculative import decode
    counts, firsts = torch.zeros(V, V, dtype=torch.float64), []
    for seed in range(seed0, seed0 + n):
        lm.reset()
        new, rounds, _ = decode(lm, make_drafter(), prompt_ids, 2, sampler, seed=seed, record=None)
        counts[new[0], new[1]] += 1
        firsts.append(rounds[0])
    return counts, firsts


def draw_pairs_in_batch(model, make_drafter, prompt_ids: list[int], sampler: Sampler, n: int = N,
                        seed0: int = 0, lanes: int = 128) -> list[tuple[int, int]]:
    """draw_pairs for a batchable method: n runs as lanes of the batch engine (seeds seed0 ..),
    `lanes` at a time (the shared-slot cache's attention grows with its width), each lane's drafter
    from make_drafter() and reused by the next batch (begin resets it)."""
    from speclab.decoding.batch import decode_batch
    drafters = [make_drafter() for _ in range(min(lanes, n))]
    out = []
    for s0 in range(seed0, seed0 + n, lanes):
        b = min(lanes, seed0 + n - s0)
        runs, _ = decode_batch(model, drafters[:b], [prompt_ids] * b, 2, sampler, list(range(s0, s0 + b)),
                               record=None)
        out += [(new[0], new[1]) for new, _, _ in runs]
    return out


def follows(law: Law, drawn) -> None:
    p = law.pvalue(drawn)
    assert p > ALPHA, f"p-value {p:.2e} <= {ALPHA}: binned TV {law.tv(drawn):.3f} from the target's law"


def departs(law: Law, drawn) -> None:
    p = law.pvalue(drawn)
    assert p <= ALPHA, f"the broken variant passed: p-value {p:.2e}, binned TV {law.tv(drawn):.3f}"


def next_two_joint(model, prompt_ids: list[int], sampler: Sampler) -> tuple[torch.Tensor, torch.Tensor]:
    """The law p1 (V,) of the model's next token after prompt_ids under `sampler` and the joint
    (V, V) of its next two, exact (a forward per first token), float64."""
    with torch.no_grad():
        p1 = warp(model(torch.tensor([prompt_ids])).logits[0, -1], sampler)
        joint = torch.stack([p1[x] * warp(model(torch.tensor([prompt_ids + [x]])).logits[0, -1], sampler)
                             for x in range(len(p1))]).double()                          # (V, V)
    return p1, joint


def own_text(lm, start: list[int] = [1, 2, 3], n: int = 30) -> list[int]:
    """`start` and the n tokens the target `lm` writes greedily after it: a prompt on its own text."""
    from speclab.decoding.speculative import Drafter, decode
    return start + decode(lm, Drafter(), start, n, Sampler(0.0), record=None)[0]


def pooled_chisquare(exp: torch.Tensor, obs: torch.Tensor) -> float:
    """Pearson's p-value of the counts `obs` against the expected counts `exp` (flat, the same total),
    the cells expected under 5 pooled into one; asserts nothing was counted where nothing is expected."""
    from scipy.stats import chisquare
    assert obs[exp == 0].sum() == 0
    keep = exp >= 5                                            # pool the rare cells into one
    e, o = exp[keep], obs[keep]
    if exp[~keep].sum() > 0:
        e, o = torch.cat([e, exp[~keep].sum()[None]]), torch.cat([o, obs[~keep].sum()[None]])
    e, o = e.double(), o.double()                              # scipy wants the totals equal to 1.5e-8:
    e = e * (o.sum() / e.sum())                                # a float32 table's rounding is not
    return float(chisquare(o.numpy(), e.numpy()).pvalue)
