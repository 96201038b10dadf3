"""The native kernel on a busy machine: one-row and verify forwards of smollm2-135m (bf16) on a quiet
machine and beside a one-core CPU hog, under the kernel's team sizes or its barriers.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/busy_bench.py [--compare teams|barriers] [--runs 300]
        [--rows 6] [--context 200] [--threads 2] [--phases quiet,hog] [--json out.json]

--compare teams (the default): a team of --threads, one thread, and "auto" (kernels.TeamSize, the
size chosen from the load, as the served dashboard runs it; one TeamSize kept across the phases, so
the hog phase shows how soon it moves), all with the sleeping barrier. --compare barriers: at
--threads, the barrier spinning (spin, then yield: the loop that the sleeping barrier replaced)
against spinning briefly then sleeping (futex).

Within a phase the modes alternate forward by forward, the order turning each round (a b c, b c a,
c a b, ...), so whatever else the machine does falls on all alike. The hog (`python -c "while True: pass"`) is started before its
phase and killed by its PID after it. Each cell: the median ms of --runs forwards with the
quartiles and the 90th percentile (a descheduled thread shows in the tail first); `busy` is other
processes' share of the CPUs during the phase (speclab.bench.timing.CpuMeter), the hog included: a
quiet machine reads near 0, a one-core hog on two cores near 0.5. On a machine that others share,
say so beside the numbers. Needs an x86 CPU with AVX2 (where the kernel runs; SPECLAB_ISA picks its path).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from speclab.bench.timing import CpuMeter
from speclab.models import kernels, zoo


def lean_lm(model):
    try:
        from speclab.models.lean.forward import LeanLM
    except ImportError:                                   # before models/ was split into lean/
        from speclab.models.fast_llama import LeanLM
    return LeanLM(model)


def quantiles(v: list[float]) -> dict:
    s = sorted(v)
    q = statistics.quantiles(s, n=10, method="inclusive")
    q4 = statistics.quantiles(s, n=4, method="inclusive")
    return {"median_ms": round(statistics.median(s) * 1e3, 3), "q1_ms": round(q4[0] * 1e3, 3),
            "q3_ms": round(q4[2] * 1e3, 3), "p90_ms": round(q[8] * 1e3, 3), "max_ms": round(s[-1] * 1e3, 3),
            "runs": len(s)}


def phase(lm, ids, context: int, rows: int, runs: int, modes: dict) -> dict:
    """Every forward kind under each mode (label -> a function that sets it up), interleaved;
    seconds per forward."""
    kinds = ("one-row", f"verify-{rows}")
    times = {(m, kind): [] for m in modes for kind in kinds}
    meter = CpuMeter().start()
    names = list(modes)
    for i in range(runs + 5):                             # the first 5 rounds warm up, untimed
        # the order turns each round: a forward right after a larger team's shares the machine with
        # that team's idle OpenMP threads still spinning, so no mode may always come after another
        for mode in names[i % len(names):] + names[:i % len(names)]:
            modes[mode]()
            for kind, x in zip(kinds, (ids[context:context + 1], ids[context:context + rows])):
                lm.keep(context)
                t0 = time.perf_counter()
                lm.forward(x)
                dt = time.perf_counter() - t0
                if i >= 5:
                    times[(mode, kind)].append(dt)
    busy = meter.busy()
    out = {"busy": None if busy is None else round(busy, 3), "cells": {}}
    for (mode, kind), v in times.items():
        out["cells"][f"{kind} {mode}"] = quantiles(v)
    first, *rest = modes
    for kind in kinds:
        for other in rest:
            out["cells"][f"{kind} {other}/{first}"] = round(
                statistics.median(times[(other, kind)]) / statistics.median(times[(first, kind)]), 3)
    return out


def team_modes(lm, threads: int, auto: kernels.TeamSize) -> dict:
    """A team of `threads`, one thread, and the size chosen from the load; the sleeping barrier."""
    fixed = {n: kernels.TeamSize(n) for n in (threads, 1)}

    def use(team):
        def setup():
            lm.team = team
        return setup
    kernels.set_barrier("sleep", kernels.SPIN_US)
    return {f"{threads} threads": use(fixed[threads]), "1 thread": use(fixed[1]), "auto": use(auto)}


def barrier_modes(lm, threads: int, spin_us: int) -> dict:
    lm.team = kernels.TeamSize(threads)

    def use(mode):
        return lambda: kernels.set_barrier(mode, spin_us)
    return {"spin": use("spin"), "sleep": use("sleep")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--rows", type=int, default=6, help="rows of the verify forward (k = rows - 1)")
    ap.add_argument("--context", type=int, default=200, help="tokens already in the KV cache")
    ap.add_argument("--threads", type=int, default=2, help="torch's thread count: the team's ceiling")
    ap.add_argument("--spin-us", type=int, default=kernels.SPIN_US)
    ap.add_argument("--phases", default="quiet,hog")
    ap.add_argument("--compare", choices=("teams", "barriers"), default="teams")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, _ = zoo.load("smollm2-135m", dtype="bf16")
    if kernels.module() is None:
        raise SystemExit("speclab's CPU kernel does not run here (it needs an x86 CPU with AVX2: `speclab doctor` says why)")
    lm = lean_lm(model)
    ids = torch.randint(0, model.config.vocab_size - 1, (a.context + a.rows,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        lm.keep(0)
        lm.forward(ids[:a.context])                        # the context, once: every timed forward keeps it
        res = {"compare": a.compare, "threads": a.threads, "context": a.context, "spin_us": a.spin_us,
               "cpu": cpu_name(), "phases": {}}
        auto = kernels.TeamSize("auto")
        for name in [p.strip() for p in a.phases.split(",") if p.strip()]:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if name == "hog" else None
            try:
                time.sleep(0.5 if hog else 0)
                modes = team_modes(lm, a.threads, auto) if a.compare == "teams" else barrier_modes(lm, a.threads, a.spin_us)
                used0 = dict(auto.used)
                res["phases"][name] = phase(lm, ids, a.context, a.rows, a.runs, modes)
                if a.compare == "teams":      # auto's forwards per size in this phase, its probes so far
                    res["phases"][name]["auto"] = {
                        "forwards_at": {str(k): v - used0.get(k, 0) for k, v in sorted(auto.used.items())},
                        "probes": auto.probes_run, "size_at_end": auto.size}
            finally:
                kernels.set_barrier("sleep", a.spin_us)
                if hog is not None:
                    hog.kill()
                    hog.wait()
            report(name, res["phases"][name])
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)


def report(name: str, p: dict) -> None:
    print(f"{name}: other processes used {p['busy']:.0%} of the CPUs" if p["busy"] is not None else name)
    for cell, v in p["cells"].items():
        if isinstance(v, dict):
            print(f"  {cell:<22} median {v['median_ms']:7.3f} ms  (q1 {v['q1_ms']:.3f}, q3 {v['q3_ms']:.3f}, "
                  f"p90 {v['p90_ms']:.3f}, max {v['max_ms']:.1f}; {v['runs']} runs)")
        else:
            print(f"  {cell:<22} {v:.3f} (ratio of the median times)")
    if "auto" in p:
        print(f"  auto: forwards per team size {p['auto']['forwards_at']}, {p['auto']['probes']} probes so far, "
              f"size {p['auto']['size_at_end']} at the end")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()
