"""The cost model's curve measured: `synthetic` runs at chosen acceptance beside `ar`.

    measure_point(target, prompt, alpha=..., k=..., profile=None, max_new_tokens=64, repeats=3)
        -> {"alpha", "k", "profile", "measured", "spread", "reliable", "expected", "tau", "c", ...}

`ar` and `synthetic[alpha, k]` (or a per-depth `profile`) run in turn, `repeats` times
(speclab.bench.timing.interleave, greedy, no recording): the speed-up is the median of the
per-repeat ratios with its range and the timing verdict; `expected` is the cost model's
(metrics.cost_model: the run's own tau over its own round cost c), so a measured point off the
drawn curve says the curve's c is not this machine's. The answer the drafter follows is `ar`'s
output, decoded once before the timed runs. What the alpha / k / c explorer's "run it" calls.
"""
from __future__ import annotations

from speclab import metrics
from speclab.bench.timing import interleave, speedup


def measure_point(target, prompt, alpha: float = 0.8, k: int = 4, profile=None, max_new_tokens: int = 64,
                  repeats: int = 3, chat: bool = False, progress=None) -> dict:
    """One measured point of the speed-up against acceptance at draft length k (see the module)."""
    import speclab
    from speclab.decoding.drafters.synthetic import parse_profile
    from speclab.models.loading import as_model
    rates = parse_profile(profile, alpha, None if profile is not None else k)    # bad input: one line, first
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    tgt = as_model(target, None, "auto")
    kw = dict(max_new_tokens=max_new_tokens, record="light", chat=chat)
    answer = speclab.generate(tgt, prompt, "ar", **kw).ids          # untimed: the warm-up and the answer
    params = dict(reference=answer, profile=list(rates))
    runs = interleave({"ar": lambda: speclab.generate(tgt, prompt, "ar", **kw),
                       "synthetic": lambda: speclab.generate(tgt, prompt, "synthetic", **kw, **params)},
                      repeats, wall=lambda r: r.trace.totals.wall_s, progress=progress)
    up = speedup(runs.walls["ar"], runs.walls["synthetic"], runs.busy)
    med = runs.median_result("synthetic").trace
    m = metrics.cost_model(med, runs.median_result("ar").trace)
    return {"alpha": alpha if profile is None else None, "k": len(rates), "profile": list(rates),
            "measured": up.ratios.median, "spread": (up.ratios.lo, up.ratios.hi), "reliable": up.reliable,
            "reasons": up.reasons, "expected": m["expected_speedup"] if m else None,
            "tau": med.totals.tau, "c": m["c"] if m else None,
            "given": m["per_depth"] if m else [], "identical": list(med.output_ids) == list(answer)}
