"""Every kernel path this CPU runs, side by side in one process: a one-row forward of smollm2-135m
in bf16, a 6-row verify in one-row forwards, and `ar` against the memory's streaming-read limit.

    SPECLAB_THREADS=2 .venv/bin/python scripts/kernel_paths.py [--paths avx512bf16,avx512,avx2] [--ctx 128] [--rounds 6]

The paths take turns (speclab.models.kernels.using), round by round, so a drift of the machine's
memory bandwidth (a shared VM's drifts by up to 2x in minutes) falls on all of them alike; each
number is the median over the rounds of 10 forwards. The paths but AMX give the same bits, so only
their speed differs. BENCHMARKS.md, "Kernel paths", has a run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main():
    from speclab.bench.bandwidth import weight_bytes_per_token
    from speclab.models import kernels
    from speclab.models.backends import make_lm
    from speclab.models.loading import as_model
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", help="a comma list (default: every path this CPU runs but AMX)")
    ap.add_argument("--ctx", type=int, default=128, help="context tokens before the timed forwards")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    try:
        paths = kernels.paths_asked(a.paths)
    except ValueError as e:
        raise SystemExit(f"kernel_paths: {e}")
    model, _ = as_model("smollm2-135m", None, "bf16")
    mods = {p: kernels.build(p) for p in paths}
    lm = make_lm(model, "cost", "auto")
    lm.reset()
    lm.forward(torch.arange(a.ctx) % 100 + 10)
    per_token = weight_bytes_per_token(model)
    buf = torch.ones(512 * 2 ** 20 // 2, dtype=torch.bfloat16)       # past the caches
    res = {p: {1: [], 6: [], "read": []} for p in paths}
    for _ in range(a.rounds):
        for p in paths:
            with kernels.using(p) as mod:
                for T in (1, 6):
                    ids = torch.arange(T) + 7
                    lm.forward(ids)
                    lm.keep(a.ctx)
                    t0 = time.perf_counter()
                    for _ in range(10):
                        lm.forward(ids)
                        lm.keep(a.ctx)
                    res[p][T].append((time.perf_counter() - t0) / 10)
                t0 = time.perf_counter()
                mod.stream_read(buf)
                res[p]["read"].append(buf.nbytes / (time.perf_counter() - t0))
    print(f"{kernels.info()['cpu']}, smollm2-135m bf16, context {a.ctx}, {torch.get_num_threads()} threads")
    for p in paths:
        one, six = statistics.median(res[p][1]), statistics.median(res[p][6])
        limit = statistics.median(res[p]["read"]) / per_token
        print(f"{p:11s} ar forward {one * 1e3:6.2f} ms  6-row verify {six / one:.2f} forwards  "
              f"ar at {1 / one / limit:.2f} of the streaming-read limit ({limit:.0f} tok/s)")


if __name__ == "__main__":
    main()
