"""`lantern`: LANTERN's relaxed acceptance (Jang et al., ICLR 2025), adapted to text; lossy with a
total-variation budget.

LANTERN pools the target's mass over a latent neighbourhood of the drafted token: for an image
model the VQ codebook's nearest codes, here the tokens nearest to x by the target's own input
embedding (L2), found once per token and kept on the model for later runs.

    N(x)   = the k tokens nearest x (x itself excluded), nearest first
    c_j    = p(N(x)_1) + ... + p(N(x)_j)
    J      = the largest j with c_j <= delta           (0 if none)
    p~(x)  = p(x) + c_J                                 TV(p, p~) = c_J <= delta
    sampling: accept x with probability min(1, p~(x) / q(x)); on a rejection the residual comes
              from the ORIGINAL p, as the exact rule forms it (norm((p - q)+), or p without x for a
              point-mass draft); the paper's code also zeroes q on x's k + 1 nearest, which
              speclab does not reproduce
    greedy:   p[x] <- p~(x); accept iff x is then the argmax (the code's greedy mode; the emitted
              correction is the target's own argmax)

Defaults k = 1000 and delta = 0.1, the paper's. Each test records p(x), q(x), J, the pooled mass
c_J (the TV it spent), p~(x) and the first pooled ids; `exact` is decided with the same draw, so a
token accepted here and rejected there is one the neighbourhood rescued.

`induced` (the bench's TV column): for one candidate x ~ q at the root, the first token's law is
q(y) a(y) + (1 - sum_x q(x) a(x)) r(y), with a(x) = min(1, p~(x) / q(x)) and r the residual from the
original p. Pooling only matters where p(x) < q(x) (elsewhere a(x) = 1 already), and there it moves
q(x) a(x) by at most room(x) = min(q(x), p(x) + delta) - p(x); those tokens are pooled largest room
first, up to COVER of them and until the rooms left sum to at most SLACK, and the rest keep the
exact rule's min(1, p(x) / q(x)): the returned slack (the rooms left) bounds the error in TV.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import accept_mask, pick, residual, residual_rows
from speclab.decoding.rules.base import Rule, register_rule

SHOWN = 8                                       # pooled ids kept in a decision's record


class Neighbours:
    """The k nearest tokens of a token by the L2 distance of input embeddings, computed on first
    use (one matrix-vector product per distinct token, never a V x V matrix) and kept."""

    def __init__(self, embed: torch.Tensor, k: int):
        self.E = embed.detach().float()
        self.sq = self.E.square().sum(-1)                                # (V,) |e|^2
        self.k = min(k, self.E.shape[0] - 1)
        self.table: dict[int, torch.Tensor] = {}

    def __call__(self, x: int) -> torch.Tensor:
        if x not in self.table:
            d = self.sq - 2 * (self.E @ self.E[x])                       # |e - e_x|^2 - |e_x|^2: one product
            d[x] = float("inf")
            self.table[x] = d.topk(self.k, largest=False).indices        # nearest first
        return self.table[x]


def neighbours(model, k: int) -> Neighbours:
    """The model's neighbour table for k, kept on the model (derived from its weights, as its packed
    weights are), so every run of the rule on it reuses what earlier runs found."""
    E = model.get_input_embeddings().weight
    tables = model.__dict__.setdefault("_speclab_neighbours", {})
    key = (k, E.data_ptr(), E.dtype)
    if key not in tables:
        tables[key] = Neighbours(E, k)
    return tables[key]


def pool(P: torch.Tensor, ids: torch.Tensor, delta: float) -> tuple[int, float]:
    """(J, c_J): the longest nearest-first prefix of ids whose mass under P stays within delta."""
    c = P[ids].cumsum(0)
    J = int((c <= delta).sum())
    return J, (float(c[J - 1]) if J else 0.0)


def prepare(params: dict, model=None) -> dict:
    k, delta = int(params["k"]), float(params["delta"])
    if k < 1 or not 0 < delta < 1:
        raise ValueError(f"lantern takes k >= 1 and 0 < delta < 1, got k={k}, delta={delta}")
    if model is None:
        raise ValueError("rule 'lantern' reads the target's input embedding: run it on a model")
    return dict(k=k, delta=delta, near=neighbours(model, k))


def test(p, q, x, u, params, given):
    """Pool each candidate's nearest tokens' mass within delta into p~(x), then: sampling, the
    speculative-sampling test on p~(x) with the residual from p; greedy (u None), p~(x) against
    every other token of the target's softmax (given.soft)."""
    delta = params["delta"]
    P = given.soft if u is None else p                                            # (B, V)
    ids = torch.stack([params["near"](t) for t in x.tolist()]).to(P.device)        # (B, k) nearest first
    c = P.gather(-1, ids).cumsum(-1)                                              # (B, k)
    J = (c <= delta).sum(-1)                                                      # (B,)
    mass = torch.where(J > 0, c.gather(-1, (J - 1).clamp_min(0)[:, None])[:, 0], torch.zeros_like(c[:, 0]))
    p_x = pick(P, x)
    pooled = (p_x + mass.double()).clamp(max=1.0)                                 # p~(x), fp64
    if u is None:
        rest = P.scatter(-1, x[:, None], -1.0).max(-1).values                     # the best other token
        ok, res = pooled >= rest.double(), p
    else:
        ok, res = accept_mask(pooled, pick(q, x), u), residual_rows(P, q)
    Js = J.tolist()
    inputs = [dict(p=round(a, 6), pooled=j, tv=round(m, 6), p_tilde=round(t, 6), neighbours=ids[b, :min(j, SHOWN)].tolist())
              for b, (a, j, m, t) in enumerate(zip(p_x.tolist(), Js, mass.tolist(), pooled.tolist()))]
    return ok, res, dict(threshold=[delta] * len(Js), inputs=inputs)


COVER, SLACK = 512, 1e-3                        # induced: tokens pooled per round at most, room left over


def induced(P, q, params: dict, model=None):
    """The law of a round's first token for one candidate x ~ q (None: nothing drafted, a sample of
    P) under P, and its slack (see the module's docstring)."""
    k, delta = int(params["k"]), float(params["delta"])
    P = P.float()
    if q is None:
        return P, 0.0
    if model is None:
        raise ValueError("rule 'lantern' reads the target's input embedding: give induced() the model")
    near = neighbours(model, k)
    q = q.to(P)
    drawn = q > 0
    a = torch.where(drawn, (P / q.clamp_min(1e-30)).clamp(max=1.0), torch.zeros_like(P))  # exact's min(1, p/q)
    low = torch.nonzero(drawn & (P < q)).flatten()                  # where pooling can raise a(x)
    # what pooling can change there: q(x) a(x) moves by at most min(q, p + delta) - p (pooled mass <= delta)
    room = torch.minimum(q[low], P[low] + delta) - P[low]
    order = room.argsort(descending=True, stable=True)
    low, room = low[order], room[order]
    left = room.flip(0).cumsum(0).flip(0)                           # what is left from each candidate on
    n = min(COVER, int((left > SLACK).sum()))
    for x in low[:n].tolist():                  # the walk's own neighbours (its table, kept on the model)
        _, mass = pool(P, near(x).to(P.device), delta)
        a[x] = min(1.0, min(1.0, float(P[x]) + mass) / float(q[x]))
    slack = float(left[n]) if n < len(low) else 0.0
    out = q * a
    return out + (1 - float(out.sum())) * residual(P, q), slack


LANTERN = register_rule(Rule(
    name="lantern", guarantee="lossy", test=test, prepare=prepare, reads=("soft",), induced=induced, params=dict(k=1000, delta=0.1),
    summary="accept x against p(x) plus the target's mass on x's nearest tokens (input embedding), within a "
            "total-variation budget delta (LANTERN, Jang et al. ICLR 2025, adapted to text)"))
