"""`judge`: Judge decoding (Bachmann et al., ICLR 2025), lossy by design.

A linear probe reads the target's own last-layer state at each drafted token, from the verify that
scores it, and says whether the token is acceptable even where the target would have written
another; a token passes where the exact rule OR the judge accepts it:

    h_x     = the target's state after its last layer at x's own position (pre-norm), the verify's
    score   = sigmoid(w . standardise([h_x / rms(h_x), log p(x)]) + b)   (models/judge.py; log p(x)
              is speclab's addition to the paper's embedding-only head)
    greedy  accept x iff x == argmax p  or  score > threshold; among siblings the target's own
            token wins, then the highest score above the threshold; where the walk stops the
            target's argmax is emitted
    sampling accept x iff the exact test passes (u < p(x) / q(x), the same draw)  or  score > threshold;
            on a rejection the residual comes from p as the exact rule forms it

The paper states the OR and a linear head on "the embeddings" of the draft tokens; which position's
state it reads is not given: speclab reads x's own (the state that has seen x; the one before it
only knows p). Its labels are hand-made ("TokenCourt"); speclab's probe is trained on labels mined
as AutoJudge mines them (`speclab train judge`: a mismatch is acceptable where the target, having
read it, keeps writing its own continuation within a margin of NLL). Parameters: `judge` (a zoo name
or a directory; None: the zoo's probe for the target) and `threshold` (None: the probe's own, the
lowest whose training precision reached 0.8). Each test records the score, p(x), the target's
token and what `exact` decided, so a token accepted here and rejected there is one the judge
rescued. No `induced` hook: the score of a token the draft did not propose is never computed (it
would take a forward per candidate), so the bench has no TV column for this rule.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import Tried, accepts, greedy_ids, remove_token, residual, sample, warp
from speclab.decoding.rules.base import Rule, register_rule
from speclab.models.judge import judge_info, load_judge, resolve_judge


def make(params: dict, model=None):
    if model is None:
        raise ValueError("rule 'judge' reads a probe trained for the target: run it on a model")
    where = resolve_judge(params["judge"], model)
    probe = load_judge(where)
    if probe.hidden_size != model.config.hidden_size:
        raise ValueError(f"rule 'judge': the probe in {where} reads states of width {probe.hidden_size}, the target's "
                         f"are {model.config.hidden_size}: train one for this target with `speclab train judge`")
    thr = params["threshold"]
    thr = float(judge_info(where)["threshold"] if thr is None else thr)
    if not 0 < thr < 1:
        raise ValueError(f"rule 'judge' takes 0 < threshold < 1, got {thr}")

    def walk(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at=None, h_at=None):
        if h_at is None:
            raise ValueError("rule 'judge' reads the target's state at each draft token, which this method's verify "
                             "does not hand on: use rule='exact'")
        node, path, tries = -1, [], []
        while True:
            kids = children.get(node, [])
            logits = p_at(node)
            top = argmax_at(node) if argmax_at is not None else int(greedy_ids(logits))
            P = logits.float().softmax(-1) if sampler.greedy else warp(logits, sampler)
            q = q_at.get(node)
            p1 = P if sampler.greedy else logits.float().softmax(-1)   # the probe's p(x): T = 1, unwarped
            scores = probe.score(torch.stack([h_at(c) for c in kids]),
                                 p1[[tokens[c] for c in kids]]).tolist() if kids else []
            nxt = None
            if sampler.greedy:
                judged = [(s, c) for c, s in zip(kids, scores) if s > thr]
                nxt = next((c for c in kids if tokens[c] == top), max(judged)[1] if judged else None)
            for c, s in zip(kids, scores):
                x = tokens[c]
                p_x, q_x = float(P[x]), (float(q[x]) if q is not None else None)
                if sampler.greedy:
                    u, exact, ok = None, x == top, c == nxt
                else:
                    u = draw()
                    exact = accepts(u, p_x, q_x)
                    ok = exact or s > thr
                tries.append(Tried(c, ok, u, p_x, q_x, exact=exact, threshold=thr,
                                   inputs=dict(score=round(s, 4), p=round(p_x, 6), target_token=top)))
                if ok:
                    nxt = c
                    break
                if not sampler.greedy:
                    P = residual(P, q) if q is not None else remove_token(P, x)
            if nxt is None:
                if sampler.greedy:
                    return path, top, None, tries
                return path, int(sample(P, gen)), P, tries
            path.append(nxt)
            node = nxt
    return walk


JUDGE = register_rule(Rule(
    name="judge", guarantee="lossy", make=make, reads_hidden=True, params=dict(judge=None, threshold=None),
    summary="accept x where the exact rule or a linear probe on the target's own state at x says so; the probe "
            "trained on mismatches the target's continuation survives (Judge decoding, Bachmann et al. ICLR 2025; "
            "labels as AutoJudge mines them)"))
