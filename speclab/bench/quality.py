"""The bench's quality columns: what a row's text costs against `ar`'s, beside its speed.

Greedy (temperature 0), against `ar` on the same prompts:
    identical_tokens   share of generated tokens equal to ar's, position by position over the
                       common length of each pair of outputs
    first_divergence   mean position of the first differing token over the outputs that differ
                       from ar's (a shorter output that agrees up to its end differs at its end);
                       None where every output is identical
Sampling (temperature > 0), every row on the same seeds per prompt:
    tv_per_step        mean over the rounds of TV(the law of the round's first token under the rule,
                       the target's p there): 0 for a lossless row, analytic for a lossy rule with
                       an `induced` hook (decoding/rules/base.py) where every round's root holds at
                       most one candidate, None otherwise (a rule without the hook, a tree's several
                       root candidates, a lossy method, a peer); tv_slack bounds its error (lantern)
    nll                target negative log-likelihood per generated token (natural log, the target's
                       untempered distribution, one teacher-forced forward over prompt + text, fp32
                       log-softmax): token-weighted over the prompts, then averaged over the seeds
    distinct_1/_2      distinct n-grams / all n-grams of the row's samples (token ids, pooled over
                       prompts and seeds), beside ar's on the same seeds (distinct_1_ar, distinct_2_ar)
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import replace

import torch

from speclab.decoding.guarantees import LOSSLESS


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (the shorter one's end if one is a prefix of the
    other); None where they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_agreement(ref: list[list[int]], out: list[list[int]]) -> dict:
    """identical_tokens and first_divergence of outputs `out` against `ref` (see the module)."""
    same = sum(x == y for a, b in zip(ref, out) for x, y in zip(a, b))
    common = sum(min(len(a), len(b)) for a, b in zip(ref, out))
    firsts = [d for a, b in zip(ref, out) if (d := first_divergence(a, b)) is not None]
    return dict(identical_tokens=round(same / common, 4) if common else None,
                first_divergence=round(statistics.mean(firsts), 2) if firsts else None,
                diverged=len(firsts))


def distinct_n(samples: list[list[int]], n: int) -> float | None:
    """Distinct n-grams / all n-grams over the samples (n-grams never cross two samples); None
    where no sample is n tokens long."""
    grams = [tuple(s[i:i + n]) for s in samples for i in range(len(s) - n + 1)]
    return round(len(set(grams)) / len(grams), 4) if grams else None


@torch.no_grad()
def target_nll(model, prompt_ids: list[int], ids: list[int]) -> tuple[float, int]:
    """(summed negative log-likelihood, token count) of `ids` after `prompt_ids` under the target:
    one teacher-forced forward, its logits widened to fp32 before the log-softmax."""
    if not ids:
        return 0.0, 0
    dev = next(model.parameters()).device
    x = torch.tensor([list(prompt_ids) + list(ids)], device=dev)
    keep = len(ids) + 1                              # the rows that predict ids (and one spare)
    try:
        logits = model(x, logits_to_keep=keep).logits[0]
    except TypeError:                                # a model without logits_to_keep
        logits = model(x).logits[0]
    rows = logits[-keep:-1].float().log_softmax(-1)     # row j predicts ids[j]
    nll = -rows.gather(-1, torch.tensor(ids, device=dev)[:, None]).sum()
    return float(nll), len(ids)


@contextlib.contextmanager
def watching_roots(rule_name: str, sink: list):
    """While inside, every verify under `rule_name` appends (the target's logits at the round's
    root, the draft's q there or None, the root's candidate tokens) to sink, copied (a static
    runner reuses its buffers). The rule's row is swapped for the block only; its decisions are
    unchanged."""
    from speclab.decoding.rules import RULES
    rule = RULES[rule_name]

    def make(params, model=None):
        walk = rule.make(params, model)

        def watched(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at=None, **kw):
            q = q_at.get(-1)
            sink.append((p_at(-1).detach().clone(), None if q is None else q.detach().clone(),
                         [tokens[c] for c in children.get(-1, [])]))
            return walk(children, tokens, q_at, p_at, sampler, gen, draw, argmax_at, **kw)   # h_at, for a rule reading it
        return watched

    RULES[rule_name] = replace(rule, make=make)
    try:
        yield sink
    finally:
        RULES[rule_name] = rule


@torch.no_grad()
def induced_tv(rule_name: str, rule_params: dict, roots: list, sampler, model=None) -> tuple[list[float], float] | str:
    """Per round, TV(the rule's first-token law, the target's warped p) from watched roots, and the
    largest slack; where there is none, the reason (a rule without an `induced` hook, a root that
    held several candidates)."""
    from speclab.decoding.acceptance import warp
    from speclab.decoding.rules import get_rule, rule_params as resolve
    from speclab.decoding.rules.base import total_variation
    rule = get_rule(rule_name)
    if rule.induced is None:
        return f"rule {rule_name!r} gives no induced law"
    if any(len(toks) > 1 for _, _, toks in roots):
        return "a round's root held several candidates (the induced law is of one candidate)"
    params = resolve(rule_name, rule_params)
    tvs, slack = [], 0.0
    for logits, q, toks in roots:
        P = warp(logits, sampler)
        if toks and q is None:                       # a point-mass draft: q is one-hot on its token
            q = torch.nn.functional.one_hot(torch.tensor(toks[0], device=P.device), P.shape[-1]).float()
        dist, s = rule.induced(P, q if toks else None, params, model)
        tvs.append(total_variation(dist, P))
        slack = max(slack, s)
    return tvs, slack


def rule_of(spec) -> tuple[str, dict]:
    """The acceptance rule a bench spec runs (its `rule=`, else its method's own) and its parameters
    (`rule.NAME=value` in the spec)."""
    from speclab.decoding.registry import get_method
    params = {k.split(".", 1)[1]: v for k, v in spec.params.items() if k.startswith("rule.")}
    return spec.params.get("rule") or get_method(spec.method).rule, params


def greedy_columns(row: dict, ref_ids: list[list[int]], ids: list[list[int]]) -> None:
    row.update(token_agreement(ref_ids, ids))


def sampling_columns(row: dict, runs: list[dict], ar_runs: list[dict], prompt_ids: list[list[int]],
                     seeds: list[int], model, guarantee: str | None, causal: bool) -> None:
    """The sampling columns of one row from its first pass's runs (one per (seed, prompt) job, seed
    major; ar_runs: ar's on the same jobs). tv comes from each run's "tv" (induced_tv), if any."""
    n = len(prompt_ids)
    row["tv_per_step"], row["tv_slack"], row["tv_note"] = None, None, None
    if guarantee in LOSSLESS:
        row["tv_per_step"], row["tv_slack"], row["tv_note"] = 0.0, 0.0, f"{guarantee}: the target's law"
    elif guarantee is None:
        row["tv_note"] = "a peer: no rule to read"
    else:
        tvs = [r.get("tv") for r in runs]
        why = next((t for t in tvs if isinstance(t, str)), None)
        if why is not None or not tvs or any(t is None for t in tvs):
            row["tv_note"] = why or "no induced law for this row (its rule has none, or it is not speculative)"
        else:
            steps = [x for t, _ in tvs for x in t]
            row["tv_per_step"] = round(statistics.mean(steps), 5) if steps else None
            row["tv_slack"] = round(max(s for _, s in tvs), 6)
    if causal:
        per_seed = []
        for j in range(len(seeds)):
            tot = [target_nll(model, prompt_ids[i], runs[j * n + i]["ids"]) for i in range(n)]
            count = sum(c for _, c in tot)
            if count:
                per_seed.append(sum(s for s, _ in tot) / count)
        row["nll"] = round(statistics.mean(per_seed), 4) if per_seed else None
    else:
        row["nll"] = None                          # a diffusion LM has no causal likelihood to read
    for k in (1, 2):
        row[f"distinct_{k}"] = distinct_n([r["ids"] for r in runs], k)
        row[f"distinct_{k}_ar"] = distinct_n([r["ids"] for r in ar_runs], k)
