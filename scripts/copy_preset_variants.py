"""The dashboard's copy-heavy preset timed as Compare times it, for method variants Compare's form
does not name (`prompt-lookup[k=auto]`, `eagle[budget=auto]`): each method's run recording nothing,
its trace's wall time, the methods interleaved run after run, the speed-up the ratio of medians.

    SPECLAB_ISA=avx2 HF_HUB_OFFLINE=1 .venv/bin/python scripts/copy_preset_variants.py [--tokens 64] [--repeats 7] [--json out.json]

Prints each variant's speed-up over `ar` with the min-max of the per-run ratios, its median wall
time, and ar's prefill (its first round) beside its run: the ceiling every method shares.
BENCHMARKS.md ("Kernel paths") has a run.
"""
from __future__ import annotations

import argparse
import json
import statistics

VARIANTS = [("ar", {}), ("prompt-lookup", {}), ("prompt-lookup", {"k": "auto"}), ("eagle", {}),
            ("eagle", {"budget": "auto"}), ("draft-model", {"k": 4})]
DRAFTS = {"draft-model": "smollm2-draft", "eagle": "smollm2-eagle"}


def label(method: str, params: dict) -> str:
    return method + ("[" + ";".join(f"{k}={v}" for k, v in params.items()) + "]" if params else "")


def main():
    import speclab
    from speclab.apps.guide import COPY_TASK
    from speclab.models import zoo
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    target = zoo.load("smollm2-135m", dtype="bf16")

    def run(method, params):
        return speclab.generate(target, COPY_TASK[1], method, draft=DRAFTS.get(method), max_new_tokens=a.tokens,
                                record=None, chat=True, **params).trace
    for m, p in VARIANTS:                        # warm: models loaded, verify curves measured
        run(m, p)
    walls: dict[str, list[float]] = {label(m, p): [] for m, p in VARIANTS}
    prefill = []
    for _ in range(a.repeats):
        for m, p in VARIANTS:
            t = run(m, p)
            walls[label(m, p)].append(t.totals.wall_s)
            if m == "ar":
                prefill.append(t.rounds[0].verify_s)
    ar = walls["ar"]
    out = {}
    for name, w in walls.items():
        ratios = [x / y for x, y in zip(ar, w)]
        out[name] = dict(speedup=round(statistics.median(ar) / statistics.median(w), 3), lo=round(min(ratios), 3),
                         hi=round(max(ratios), 3), wall_ms=round(statistics.median(w) * 1e3, 1))
        print(f"{name:26s} {out[name]['speedup']:.2f}x ({out[name]['lo']:.2f}-{out[name]['hi']:.2f}), "
              f"{out[name]['wall_ms']} ms")
    pre = statistics.median(prefill)
    print(f"ar's prefill {pre * 1e3:.1f} ms of its {statistics.median(ar) * 1e3:.1f} ms: no method can beat "
          f"{statistics.median(ar) / pre:.1f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(variants=out, ar_prefill_ms=round(pre * 1e3, 1), tokens=a.tokens, repeats=a.repeats), f,
                      indent=1)


if __name__ == "__main__":
    main()
