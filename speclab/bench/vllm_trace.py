"""A vLLM run as a summary-level speclab trace: its acceptance in speclab's views, beside speclab's runs.

What vLLM 0.32 exposes per request (`SamplingParams`-independent, engine option
`per_request_spec_decode_metrics="detailed"`, then `RequestOutput.spec_decode_metrics.to_dict()`):

  acceptance_histogram   count of verify steps by accepted draft tokens j = 0..k
  num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, num_spec_tokens (= k)
  per_step_accepted      accepted draft tokens of each verify step that HAD drafts, in order
  per_step_drafted       drafted tokens of those steps, in order ("detailed" only)

and, engine-wide, the counters vllm:spec_decode_num_drafts / _num_draft_tokens /
_num_accepted_tokens / _num_accepted_tokens_per_pos (Prometheus, via LLM.get_metrics()).

What speclab reconstructs from them: one Round per verify step with its drafted and accepted counts
(record level None: no draft tokens, no p / q, no tree). Steps without drafts (the prefill, and each
step where an n-gram or suffix drafter found nothing) are not in vLLM's lists, so where they fall in
the sequence is unknown: the token attribution (which output tokens each round committed) is exact
when every step after the prefill drafted (a draft model), and otherwise an assumption that the
drafted steps came first, said so in `params["attribution"]`. Counts, tau, alpha, per-position
acceptance and the accepted-length histogram are exact either way. Without per-step lists
("summary" level), only the histogram's multiset is known: rounds in histogram order.
"""
from __future__ import annotations

from speclab.trace import Round, Sampling, Totals, Trace


def vllm_rounds(output_ids: list[int], spec: dict | None) -> tuple[list[Round], str]:
    """Rounds of a vLLM request and how its tokens were attributed ("exact" or why not)."""
    ids = list(output_ids)
    if not spec:
        return [_round(ids[i:i + 1], 0) for i in range(len(ids))], "exact: no speculative decoding"
    acc = spec.get("per_step_accepted")
    drafted = spec.get("per_step_drafted")
    how = "in order"
    if acc is None:
        acc = [j for j, n in enumerate(spec["acceptance_histogram"]) for _ in range(n)]
        how = "histogram only: step order unknown"
    if drafted is None:
        drafted = [spec.get("num_spec_tokens", max(acc, default=0))] * len(acc)
    rounds = [_round(ids[:1], 0)] if ids else []                     # the prefill's token
    pos = len(rounds)
    for a, d in zip(acc, drafted):
        rounds.append(_round(ids[pos:pos + a + 1], d, a))
        pos += a + 1
    plain = len(ids) - pos
    for i in range(max(0, plain)):                                   # steps without drafts
        rounds.append(_round(ids[pos + i:pos + i + 1], 0))
    exact = how == "in order" and plain <= 0
    return rounds, ("exact" if exact else f"{how}; {max(0, plain)} steps without drafts placed last (their "
                    "positions are not in vLLM's metrics): counts exact, token attribution approximate")


def _round(tokens: list[int], drafted: int, accepted: int = 0) -> Round:
    """tokens: what the step committed (its accepted drafts, then the target's token), possibly cut
    by EOS / max_tokens."""
    n = min(accepted, len(tokens))
    path, rest = tokens[:n], tokens[n:]
    kind = "target" if not drafted else ("bonus" if accepted == drafted else "correction")
    return Round(accepted=list(range(n)), path_tokens=path, emitted=rest[0] if rest else -1,
                 emitted_kind=kind, kept=len(tokens), drafted=drafted)


def vllm_trace(output_ids: list[int], spec: dict | None, prompt_ids: list[int], tokenizer=None,
               method: str = "vllm", model: str = "vllm", wall_s: float = 0.0) -> Trace:
    """A summary-level Trace of one vLLM request. spec: `RequestOutput.spec_decode_metrics.to_dict()`
    (None for plain decoding)."""
    from speclab.trace import ModelInfo
    rounds, how = vllm_rounds(output_ids, spec)
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(len(r.accepted) for r in rounds)
    totals = Totals(wall_s=wall_s, target_forwards=len(rounds), new_tokens=len(output_ids),
                    drafted=drafted, accepted=accepted)
    text = {}
    if tokenizer is not None:
        from speclab.models.loading import token_table
        text = token_table(tokenizer, list(prompt_ids) + list(output_ids))
    return Trace(engine="speculative", method=method, params={"source": "vllm", "attribution": how},
                 models={"target": ModelInfo(name=model, params=0, dtype="", device="")},
                 sampling=Sampling(), record=None, prompt_ids=list(prompt_ids), output_ids=list(output_ids),
                 token_text=text, totals=totals, rounds=rounds)
