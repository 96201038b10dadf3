"""`tree-rsd-s`: RSD-S, Recursive Speculative Decoding's draft tree grown by Stochastic Beam Search
(Jeon et al. 2024, after Kool et al. 2019): sequences drawn without replacement from the draft,
W of them kept at every level, so the target's budget is W x L nodes however the tree branches.

Level d takes the W partial sequences of level d - 1 (the beam; level 0 is the committed prefix
with phi = G = 0) and scores every child x of every beam node n with the draft's q(.|n)
(temperature, top-k, top-p applied, as the target's are):

    phi(x) = phi(n) + log q(x | n)                           the sequence's draft log-probability
    G~(x)  = phi(x) + Gumbel(0, 1)                           perturbed (the run's generator)
    Z(n)   = max over n's children of G~                     the children's best
    G(x)   = -log(exp(-G(n)) - exp(-Z(n)) + exp(-G~(x)))     Gumbel truncated at the parent's G

and keeps the W best G among all W x V children: a parent whose children all lose keeps none (its
sequence is truncated early). G is increasing in G~, and G~ - phi(n) is the Gumbel-Top-k key of
x among its siblings, so each node's kept children are the first of its own Gumbel-Top-k draw, in
key order: sibling j follows q renormalised without the earlier ones. How many are kept depends
only on the draw's values, and (an exponential race) the j-th value is independent of which token
holds it given the earlier ones, so sibling j, when there is one, still has that law: the verify
is RSD-C's `rsd` rule (rules/rsd.py), recursive rejection against the renormalised q, lossless
(tests/test_sampling_power.py). At temperature 0 the noise is gone and the tree is the draft's
beam search (the W likeliest sequences per level), verified by the greedy match.

width: W, sequences kept per level; depth: L, levels (one draft forward each). Each node's
`source` is "b{j}:{G:.2f}" (the j-th kept sibling, its beam score). The round's info is a
BeamSearch record (speclab/records.py): the width (beam_width) and per level how many sequences
kept no child (beam_truncated). Recorded per level (record "light" or "full"):
Decision("tree-rsd-s", {"level", "parents", "truncated", "candidates"}, threshold = the lowest
kept score, output = the kept nodes, at = the level); "candidates" are the W kept, then up to W
best dropped, each [parent node, token, phi, G, node or -1]. Drawn by figures/rsd_s.py.
"""
from __future__ import annotations

import math

import torch

from speclab.decoding.acceptance import warp
from speclab.decoding.drafters.model import host_read
from speclab.decoding.drafters.trees import TreeDrafterBase
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision

POLICY = "tree-rsd-s"


def log1mexp(a: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(a)) for a <= 0, accurate at both ends (Maechler 2012)."""
    return torch.where(a > -math.log(2), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


def truncated_gumbel(g_tilde: torch.Tensor, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """G = -log(exp(-T) - exp(-Z) + exp(-G~)): Gumbels G~ with maximum Z shifted so their maximum is
    T, the parent's score (Kool et al. 2019, appendix B.3's stable form). Shapes broadcast."""
    v = t - g_tilde + log1mexp(g_tilde - z)
    return t - v.clamp_min(0) - torch.log1p(torch.exp(-v.abs()))


def beam_level(logq: torch.Tensor, phi: torch.Tensor, g: torch.Tensor, gen: torch.Generator | None,
               sampled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One level's children scored: logq (B, V) float64 log q(.|beam node), phi and g (B,) the beam's
    log-probabilities and scores. Returns (phi (B, V), G (B, V)): sampled, G is the truncated Gumbel
    above; not sampled (temperature 0), G = phi, beam search."""
    phi_c = phi[:, None] + logq
    if not sampled:
        return phi_c, phi_c
    u = torch.rand(logq.shape, generator=gen, device=logq.device, dtype=torch.float64).clamp_min(1e-300)
    g_tilde = phi_c - (-u.log()).log()                                     # phi + Gumbel(0, 1)
    z = g_tilde.max(-1, keepdim=True).values
    return phi_c, truncated_gumbel(g_tilde, z, g[:, None])


class RSDSDrafter(TreeDrafterBase):
    name = POLICY

    def __init__(self, draft, width: int = 5, depth: int = 3, backend: str = "auto"):
        super().__init__(draft, backend)
        for what, v in (("width", width), ("depth", depth)):
            if type(v) is not int or v < 1:
                raise ValueError(f"{what} must be an integer >= 1 (width: sequences kept per level, depth: levels), "
                                 f"got {v!r}")
        self.width, self.depth = width, depth

    def propose(self, ctx: Context) -> DraftTree:
        return grow_beam(self.width, self.depth, self.q_at(ctx), self.sampler, self.gen, self.record is not None)


def grow_beam(W: int, L: int, q_at, sampler, gen: torch.Generator | None, record: bool = True) -> DraftTree:
    """The tree of a stochastic beam of width W over L levels. q_at(tree) -> (1 + N, V): the draft's
    probabilities after the committed prefix, then after each node of `tree` (called once a level).
    Host reads: one a level (the kept and best dropped candidates, with their scores)."""
    sampled = not sampler.greedy
    tree = DraftTree(info={"shape": "rsd-s", "depth": L, "beam_width": W, "beam_truncated": []})
    beam = [-1]                                                            # level d - 1's nodes
    phi = g = None
    for level in range(1, L + 1):
        rows = q_at(tree)[[n + 1 for n in beam]]                          # (B, V)
        if phi is None:
            phi = g = torch.zeros(len(beam), dtype=torch.float64, device=rows.device)
        q = warp(rows.clamp_min(1e-30).log(), sampler) if sampled else rows
        phi_c, G = beam_level(q.double().log(), phi, g, gen, sampled)     # (B, V) each
        V = G.shape[-1]
        finite = int(torch.isfinite(G).sum())
        n, shown = min(W, finite), min(2 * W, finite)                      # kept; kept + the best dropped
        top = G.flatten().topk(shown)                                      # best first, at every recording level
        flat = top.indices
        ids_h, rows_h, phi_h, g_h, q_h = host_read(flat % V, flat // V, phi_c.flatten()[flat], top.values,
                                                   q.flatten()[flat].double())
        kept = sorted(range(n), key=lambda i: (rows_h[i], -g_h[i]))        # by parent, each parent's best first
        node_of, sib, parents_kept = {}, {}, set()
        for i in kept:
            r = rows_h[i]
            if sampled and r not in parents_kept:
                tree.set_q(beam[r], q[r])
            parents_kept.add(r)
            j = sib[r] = sib.get(r, -1) + 1
            node_of[i] = tree.add(ids_h[i], beam[r], q_h[i] if sampled else None, f"b{j}:{g_h[i]:.2f}")
        if record:
            tree.decisions.append(Decision(POLICY, {
                "level": level, "parents": list(beam),
                "truncated": [beam[r] for r in range(len(beam)) if r not in parents_kept],
                "candidates": [[beam[rows_h[i]], ids_h[i], round(phi_h[i], 4), round(g_h[i], 4),
                                node_of.get(i, -1)] for i in range(shown)]},
                threshold=round(g_h[n - 1], 4), output=[node_of[i] for i in kept], at=level))
        tree.info["beam_truncated"].append(len(beam) - len(parents_kept))
        beam = [node_of[i] for i in kept]
        sel = torch.tensor([rows_h[i] * V + ids_h[i] for i in kept], device=G.device)
        phi, g = phi_c.flatten()[sel], G.flatten()[sel]
    return tree
