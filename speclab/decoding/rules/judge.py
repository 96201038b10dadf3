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

from speclab.decoding.acceptance import accept_mask, pick, residual_rows
from speclab.decoding.rules.base import Rule, register_rule
from speclab.models.judge import judge_info, load_judge, resolve_judge


def prepare(params: dict, model=None) -> dict:
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
    return dict(probe=probe, threshold=thr)


def test(p, q, x, u, params, given):
    """The exact verdict OR the probe's score on (h_x, p(x) at T = 1) above the threshold. Greedy
    (u None): exact is x == the target's token, which is preferred among accepted siblings, then
    the highest score; sampling: the speculative-sampling test with u, the residual from p."""
    thr, top = params["threshold"], given.top.to(x.device)
    soft_x = given.soft.gather(-1, x[:, None])[:, 0]                              # the probe's p(x): T = 1, unwarped
    score = params["probe"].score(given.h, soft_x).double().to(x.device)           # (B,)
    if u is None:
        exact, p_x, res = x == top, soft_x.double(), p
    else:
        p_x = pick(p, x)
        exact, res = accept_mask(p_x, pick(q, x), u), residual_rows(p, q)
    ok = exact | (score > thr)
    inputs = [dict(score=round(s_, 4), p=round(a, 6), target_token=t)
              for s_, a, t in zip(score.tolist(), p_x.tolist(), top.tolist())]
    return ok, res, dict(threshold=[thr] * len(inputs), inputs=inputs,
                         prefer=torch.where(exact, torch.full_like(score, 2.0), score))


JUDGE = register_rule(Rule(
    name="judge", guarantee="lossy", test=test, prepare=prepare, reads=("top", "soft"), reads_hidden=True, params=dict(judge=None, threshold=None),
    summary="accept x where the exact rule or a linear probe on the target's own state at x says so; the probe "
            "trained on mismatches the target's continuation survives (Judge decoding, Bachmann et al. ICLR 2025; "
            "labels as AutoJudge mines them)"))
