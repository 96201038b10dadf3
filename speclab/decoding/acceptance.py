"""Acceptance rules: pure math on tensors, no model in sight.  p = target, q = draft.

  greedy          accept while the draft token is the target's argmax; emit the target's argmax
  spec-sampling   accept x ~ q with probability min(1, p(x)/q(x)); on rejection resample from
                  norm(max(0, p - q)); bonus from p when everything was accepted
  point-mass      q = delta(x) (n-gram, lookup, argmax drafts): accept with p(x); on rejection
                  zero p(x) and renormalise (the same formula with q one-hot)
  tree            multi-draft recursive rejection: try the children of the accepted node in order
                  with the rule above, updating the residual after each rejection (SpecInfer;
                  q = 1 children give sampling without replacement, EAGLE-2 style)

Temperature, top-k and top-p are applied the same way to p and q by `warp`.

Below the helpers: a rule as a tensor test over a batch of candidates and the one walk every rule
shares (`walk`: its host form for one verify's trace, its batched form over many lanes at once,
decoding/batch.py); `walk_tree` is the exact rule's host walk.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim, ties to the lowest id. bf16 / fp16 logits are widened first (exact).
    On a CPU numpy's vectorised argmax does it: torch's CPU argmax is scalar code, an order of
    magnitude slower on a row of a 49,152-token vocabulary; both give the same ids."""
    x = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.requires_grad:
        return x.argmax(-1)
    return torch.as_tensor(np.asarray(x.numpy().argmax(-1)))


def warp(logits: torch.Tensor, s: Sampler) -> torch.Tensor:
    """Logits (..., V) -> probabilities after temperature, top-k, top-p (greedy: one-hot argmax)."""
    logits = logits.float()
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / s.temperature
    if s.top_k is not None and s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)   # ties: lowest id first
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= s.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token id (0-d tensor) from probs (V,)."""
    return torch.multinomial(probs, 1, generator=gen)[0]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what is left of p after a rejected draft from q."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q exactly: nothing can have been rejected


def remove_token(p: torch.Tensor, x: int) -> torch.Tensor:
    """Residual for a rejected point-mass draft: p with x zeroed, renormalised."""
    return residual(p, torch.nn.functional.one_hot(torch.tensor(x, device=p.device), p.shape[-1]).float())


def accept_prob(p_x: float, q_x: float | None) -> float:
    """min(1, p(x) / q(x)); q(x) = None means a point-mass draft (q(x) = 1). A token the target
    cannot emit (p(x) = 0) is never accepted, whatever q says; one the draft gave no mass (q(x) = 0,
    a draft that emitted it anyway) always is where p(x) > 0."""
    if p_x <= 0:
        return 0.0
    if q_x is None:
        return min(1.0, p_x)
    return 1.0 if q_x <= 0 else min(1.0, p_x / q_x)


def accepts(u: float, p_x: float, q_x: float | None) -> bool:
    """The speculative-sampling test u <= min(1, p(x)/q(x)) for u ~ U[0, 1), never true where
    p(x) = 0 (u can be exactly 0)."""
    a = accept_prob(p_x, q_x)
    return a > 0 and u <= a


def greedy_chain(draft: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """(accepted count n, emitted token) for a chain: target_argmax has len(draft) + 1 entries."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, target_argmax[n]


def speculative_sampling_chain(draft: list[int], q: torch.Tensor, p: torch.Tensor, u: torch.Tensor,
                               gen: torch.Generator | None):
    """Leviathan / Chen for one chain. q (k, V) draft dists, p (k+1, V) target dists, u (k,).

    Returns (n accepted, emitted token, distribution it was drawn from).
    """
    for i, x in enumerate(draft):
        if not accepts(u[i].item(), p[i, x].item(), q[i, x].item()):
            r = residual(p[i], q[i])
            return i, int(sample(r, gen)), r
    return len(draft), int(sample(p[len(draft)], gen)), p[len(draft)]


@dataclass
class Tried:
    """One sibling tried at one node of the walk. A rule other than `exact` also says what the exact
    rule would have decided there (`exact`), the features it read (`inputs`) and its threshold."""
    node: int
    accepted: bool
    u: float | None
    p_x: float
    q_x: float | None
    exact: bool | None = None
    inputs: dict | None = None
    threshold: float | None = None


def greedy_step(kids: list[int], tokens: list[int], node: int, p_at, argmax_at, tries: list) -> tuple[int, int | None]:
    """One greedy test of the candidates `kids` after `node`: the target's argmax there and the
    first candidate holding it (None: none does); every candidate tried up to it joins `tries`."""
    best = argmax_at(node) if argmax_at is not None else int(greedy_ids(p_at(node)))
    nxt = next((c for c in kids if tokens[c] == best), None)
    for c in kids:
        tries.append(Tried(c, c == nxt, None, float("nan"), None))
        if c == nxt:
            break
    return best, nxt


def walk_tree(children: dict[int, list[int]], tokens: list[int], q_at: dict, p_at, sampler: Sampler,
              gen: torch.Generator | None, draw, argmax_at=None,
              without_replacement: bool = False) -> tuple[list[int], int, torch.Tensor | None, list[Tried]]:
    """The exact rule's host walk of one draft tree (the shared walk below with `speculative_test`).

    children: node -> its children in try order; tokens: node -> token; q_at: node -> draft dist
    (V,) its children were sampled from, or absent for point-mass children; p_at(node) -> target
    logits (V,) after that node (node -1 = after the committed prefix); draw() -> a uniform float.
    argmax_at(node) -> int, optional: the target's greedy token there, precomputed for the whole
    tree (one host transfer per round instead of one per node).
    Returns (accepted node path, emitted token, distribution it came from or None, tries in order).
    without_replacement: siblings sampled from q without replacement (RSD's Gumbel-Top-k): sibling j
    is tested against q renormalised without the earlier ones (rules/rsd.py).
    """
    form = Form("exact", speculative_test, without_replacement=without_replacement)
    return walk(form, {}, [Verify(children, tokens, q_at, p_at, gen, draw, argmax_at)], sampler)[0]


# ---------------------------------------------------------------------------------------------
# A rule as a tensor test, and the one walk every rule shares (vLLM splits its rejection sampler
# the same way: a per-token test, then the bookkeeping of where each request stops).
#
#   test(p, q, x, u, params, given) -> (accepted (B,) bool, residual (B, V), record)
#
#   B candidates at once (siblings of one lane, or one candidate from each lane of a batch):
#   p (B, V) the target's distribution at each candidate's parent (warped; after earlier siblings'
#   rejections, the residual they left), q (B, V) the draft distribution the candidate was drawn
#   from (one-hot at x for a point-mass draft), x (B,) candidate ids, u (B,) fp64 uniforms.
#   Greedy is the one-hot case p = delta(given.top): the walk then passes u = p = q = None (nothing
#   drawn, nothing materialised). residual: p for the next sibling where this one is rejected.
#   record: {"threshold": B floats, "inputs": B dicts, "prefer": (B,) optional} (a lossy rule's
#   features; "prefer" ranks accepted greedy siblings, highest first, where it differs from try
#   order). `exact`'s verdict beside a lossy rule's is the walk's, with the same u.
#
# Paths: "first" walks the tree depth by depth and takes the first accepted sibling (recursive
# rejection; greedy: the preferred accepted sibling); "longest" tests every reachable node against
# its parent's full p and keeps the longest accepted path (ties: the higher sum of log p(x)), then
# emits the target's argmax (Medusa's typical acceptance). A rule whose path is its own (K-SEQ's
# chains) walks itself and has no batched form.
# ---------------------------------------------------------------------------------------------


@dataclass
class Given:
    """What else the verify knows at each of B candidates, for the rules that read it (Form.reads)."""
    top: torch.Tensor | None = None      # (B,) the target's greedy token at the candidate's parent ("top"; greedy: always)
    soft: torch.Tensor | None = None     # (B, V) its softmax at T = 1 there, unwarped ("soft")
    h: torch.Tensor | None = None        # (B, C) the target's last-layer state at the candidate itself ("h")


@dataclass(frozen=True)
class Form:
    """What the shared walk needs of a rule (rules/base.py builds it from the rule's row)."""
    name: str
    test: Callable
    path: str = "first"                  # "first" or "longest" (see above)
    without_replacement: bool = False    # sibling j tested against q renormalised without the earlier ones (RSD)
    reads: tuple = ()                    # of "top", "soft", "h": the Given fields its test reads
    both: bool = False                   # record exact's verdict beside the rule's (a lossy rule)


@dataclass
class Verify:
    """One lane's verify as the walk reads it (see walk_tree for the fields)."""
    children: dict
    tokens: list
    q_at: dict
    p_at: Callable
    gen: torch.Generator | None
    draw: Callable
    argmax_at: Callable | None = None
    h_at: Callable | None = None         # node -> the target's last-layer state at the node's own position


def rowsum(x: torch.Tensor) -> torch.Tensor:
    """x.sum(-1) of (B, V), one row at a time on a CPU: a multi-row sum there reduces in another
    order than one row alone, and a lane of a batch must keep the bits of its run alone."""
    if x.device.type == "cpu" and x.shape[0] > 1:
        return torch.stack([r.sum() for r in x])
    return x.sum(-1)


def pick(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """p[b, x[b]] as fp64 (B,): the tests compare in double, as Python floats did."""
    return p.gather(-1, x[:, None])[:, 0].double()


def accept_mask(p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """u <= min(1, p(x)/q(x)) per candidate (fp64 (B,) each): never where p(x) = 0, always where
    q(x) = 0 < p(x) (a draft that emitted a token it gave no mass); `accepts`, batched."""
    a = torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-300)).clamp(max=1.0), torch.ones_like(p_x))
    a = torch.where(p_x > 0, a, torch.zeros_like(a))
    return (a > 0) & (u <= a)


def residual_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) per row (B, V); a row with nothing left keeps p (`residual`, batched)."""
    r = (p - q).clamp_min(0)
    total = rowsum(r)[:, None]
    return torch.where(total > 0, r / torch.where(total > 0, total, torch.ones_like(total)), p)


def speculative_test(p, q, x, u, params=None, given=None):
    """The exact rule's test: accept x with probability min(1, p(x)/q(x)) and hand on norm((p - q)+)
    (q one-hot: p without x). Greedy (u None): p = delta(top), so it accepts iff x = top."""
    if u is None:
        return x == given.top.to(x.device), p, {}
    ok = accept_mask(pick(p, x), pick(q, x), u)
    return ok, (p if bool(ok.all()) else residual_rows(p, q)), {}      # all accepted: no residual is read


def walk(form: Form, params, lanes: list[Verify], sampler: Sampler) -> list[tuple]:
    """Walk every lane's draft tree with the rule `form` (its test reading `params`), testing the
    lanes' candidates together. Returns, per lane, (accepted node path, emitted token, the
    distribution it was drawn from or None, tries in order): the host's record of the walk."""
    if form.path == "longest":
        return _walk_longest(form, params, lanes, sampler)
    return (_walk_greedy if sampler.greedy else _walk_sampled)(form, params, lanes, sampler)


def _top(v: Verify, node: int) -> int:
    return v.argmax_at(node) if v.argmax_at is not None else int(greedy_ids(v.p_at(node)))


def _given(form: Form, lanes, at: list[tuple[int, int, int]], tops: dict | None, soft: dict | None, dev) -> Given:
    """Given for candidates `at` = [(lane, parent node, candidate node)]."""
    g = Given()
    if tops is not None:
        g.top = torch.tensor([tops[i, n] for i, n, _ in at], device=dev)
    if soft is not None:
        g.soft = torch.stack([soft[i, n] for i, n, _ in at])
    if "h" in form.reads:
        if any(lanes[i].h_at is None for i, _, _ in at):
            raise ValueError(f"rule {form.name!r} reads the target's state at each draft token, which this method's "
                             "verify does not hand on: use rule='exact'")
        g.h = torch.stack([lanes[i].h_at(c) for i, _, c in at])
    return g


def _tried(form, c, ok, u, p_x, q_x, exact, rec, k) -> Tried:
    if not form.both:
        return Tried(c, ok, u, p_x, q_x)
    return Tried(c, ok, u, p_x, q_x, exact=bool(exact), inputs=rec["inputs"][k], threshold=float(rec["threshold"][k]))


def _walk_greedy(form, params, lanes, sampler):
    """Depth by depth, every live lane's candidates in one test; a lane stops where none passes."""
    node, path, tries = [-1] * len(lanes), [[] for _ in lanes], [[] for _ in lanes]
    out, live = [None] * len(lanes), list(range(len(lanes)))
    while live:
        at = [(i, node[i], c) for i in live for c in lanes[i].children.get(node[i], [])]
        tops = {(i, node[i]): _top(lanes[i], node[i]) for i in live}
        acc, rec, prefer = [], {}, None
        if at and form.test is speculative_test:    # exact's greedy test on host ints: x == top, no tensor a depth
            acc = exact = [lanes[i].tokens[c] == tops[i, n] for i, n, c in at]
        elif at:
            soft = ({(i, n): lanes[i].p_at(n).float().softmax(-1) for i, n in tops} if "soft" in form.reads else None)
            dev = next(iter(soft.values())).device if soft else "cpu"
            x = torch.tensor([lanes[i].tokens[c] for i, _, c in at], device=dev)
            g = _given(form, lanes, at, tops, soft, dev)
            ok, _, rec = form.test(None, None, x, None, params, g)
            acc, exact = ok.tolist(), (x == g.top).tolist()
            prefer = rec["prefer"].tolist() if "prefer" in rec else None
        nxt_live, k = [], 0
        for i in live:
            ks = [k + j for j in range(len(lanes[i].children.get(node[i], [])))]
            k += len(ks)
            passed = [j for j in ks if acc[j]]
            win = max(passed, key=lambda j: (prefer[j], -j)) if passed and prefer else (passed[0] if passed else None)
            for j in ks:
                tries[i].append(_tried(form, at[j][2], j == win, None, float("nan"), None, exact[j], rec, j))
                if j == win:
                    break
            if win is None:
                out[i] = (path[i], tops[i, node[i]], None, tries[i])
            else:
                node[i] = at[win][2]
                path[i].append(node[i])
                nxt_live.append(i)
        live = nxt_live
    return out


def _walk_sampled(form, params, lanes, sampler):
    """One sibling of every live lane per test, in try order; a rejection hands its residual to the
    next sibling, an acceptance moves the lane down; all rejected: a sample of the residual, a
    leaf accepted: the bonus from p after it. Each lane draws from its own generator, in the order
    a run alone does."""
    n = len(lanes)
    node, path, tries, out = [-1] * n, [[] for _ in lanes], [[] for _ in lanes], [None] * n
    P, Q, left, j = [None] * n, [None] * n, [None] * n, [0] * n

    def enter(i, nd):
        node[i], j[i] = nd, 0
        P[i], Q[i] = warp(lanes[i].p_at(nd), sampler), lanes[i].q_at.get(nd)       # (V,), (V,) or None
        left[i] = Q[i].clone() if Q[i] is not None and form.without_replacement else None
    for i in range(n):
        enter(i, -1)
    live = list(range(n))
    while live:
        step = []
        for i in live:
            kids = lanes[i].children.get(node[i], [])
            if j[i] < len(kids):
                step.append(i)
            else:
                out[i] = (path[i], int(sample(P[i], lanes[i].gen)), P[i], tries[i])
        if not step:
            break
        at = [(i, node[i], lanes[i].children[node[i]][j[i]]) for i in step]
        dev = P[step[0]].device
        x = torch.tensor([lanes[i].tokens[c] for i, _, c in at], device=dev)
        point = [Q[i] is None for i in step]
        qs = [torch.nn.functional.one_hot(x[k], P[i].shape[-1]).float() if point[k] else
              (left[i] / left[i].sum() if left[i] is not None else Q[i]) for k, i in enumerate(step)]
        p, q = torch.stack([P[i] for i in step]), torch.stack(qs)
        u = torch.tensor([lanes[i].draw() for i in step], dtype=torch.float64, device=dev)
        tops = {(i, node[i]): _top(lanes[i], node[i]) for i in step} if "top" in form.reads else None
        soft = {(i, node[i]): lanes[i].p_at(node[i]).float().softmax(-1) for i in step} if "soft" in form.reads else None
        ok, res, rec = form.test(p, q, x, u, params, _given(form, lanes, at, tops, soft, dev))
        p_x, q_x = pick(p, x), pick(q, x)
        exact = accept_mask(p_x, q_x, u).tolist() if form.both else [None] * len(step)
        ok, p_x, q_x, us = ok.tolist(), p_x.tolist(), q_x.tolist(), u.tolist()
        for k, i in enumerate(step):
            c = at[k][2]
            tries[i].append(_tried(form, c, ok[k], us[k], p_x[k], None if point[k] else q_x[k], exact[k], rec, k))
            if ok[k]:
                path[i].append(c)
                enter(i, c)
            else:
                P[i] = res[k]
                if left[i] is not None:
                    left[i][lanes[i].tokens[c]] = 0.0
                j[i] += 1
        live = step
    return out


def _walk_longest(form, params, lanes, sampler):
    """Every node reachable through accepted ones tested against its parent's full p, depth by
    depth over all lanes; per lane the longest accepted path (ties: the higher sum of log p(x),
    then the earlier sibling); then each sibling on the way gets its uniform, for exact's verdict,
    and the target's argmax after the path is emitted."""
    P, res = {}, {}                      # (lane, node) -> warped p; (lane, cand) -> (ok, p_x, q_x, k, rec)
    front = [(i, -1) for i in range(len(lanes))]
    while front:
        at = [(i, n, c) for i, n in front for c in lanes[i].children.get(n, [])]
        if not at:
            break
        for i, n in front:
            P[i, n] = warp(lanes[i].p_at(n), sampler)
        dev = P[front[0]].device
        x = torch.tensor([lanes[i].tokens[c] for i, _, c in at], device=dev)
        qd = [lanes[i].q_at.get(n) for i, n, _ in at]
        V = P[front[0]].shape[-1]
        q = torch.stack([torch.nn.functional.one_hot(x[k], V).float() if d is None else d for k, d in enumerate(qd)])
        p = torch.stack([P[i, n] for i, n, _ in at])
        tops = {(i, n): _top(lanes[i], n) for i, n in front} if "top" in form.reads else None
        soft = {(i, n): lanes[i].p_at(n).float().softmax(-1) for i, n in front} if "soft" in form.reads else None
        u = torch.full((len(at),), float("nan"), dtype=torch.float64, device=dev)
        ok, _, rec = form.test(p, q, x, u, params, _given(form, lanes, at, tops, soft, dev))
        ok, p_x, q_x = ok.tolist(), pick(p, x).tolist(), pick(q, x).tolist()
        for k, (i, _, c) in enumerate(at):
            res[i, c] = (ok[k], p_x[k], None if qd[k] is None else q_x[k], k, rec)
        front = [(i, c) for i, _, c in at if res[i, c][0]]
    out = []
    for i, v in enumerate(lanes):
        def best(nd):
            """(accepted length, sum of log p, node path) of the best accepted path below nd."""
            top = (0, 0.0, [])
            for c in v.children.get(nd, []):
                if res[i, c][0]:
                    m, ll, sub = best(c)
                    top = max(top, (m + 1, ll + math.log(res[i, c][1]), [c] + sub), key=lambda t: (t[0], t[1]))
            return top
        _, _, path = best(-1)
        tries, nd = [], -1
        for stepped in path + [None]:       # every sibling tested on the way, in try order
            for c in v.children.get(nd, []):
                ok_, p_x, q_x, k, rec = res[i, c]
                ex = accepts(v.draw(), p_x, q_x)
                t = _tried(form, c, c == stepped, None, p_x, q_x, ex, rec, k)
                tries.append(t)
            nd = stepped if stepped is not None else nd
        out.append((path, int(greedy_ids(v.p_at(nd))), None, tries))
    return out
