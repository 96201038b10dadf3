"""Rounds and accuracy of dllm-ete against dllm-lowconf and dllm-threshold on digits-dllm, a
whole-canvas dLLM of the toy zoo: held-out ADD (exact sum) and SUM (six digits summing to s)
prompts, greedy, gen_length 8, as one canvas (block_length 8) and in four blocks of 2 (where ETE's
cross-block commits land in later blocks).

    HF_HUB_OFFLINE=1 nice -n 19 .venv/bin/python scripts/ete_rounds.py --n 30 --json benchmarks/2026-11-29-ete.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import speclab
from speclab.train import digits

POLICIES = [("dllm-lowconf", {}), ("dllm-threshold", {}), ("dllm-ete", {}), ("dllm-ete", {"cross_block": False})]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30, help="held-out prompts per task")
    ap.add_argument("--blocks", default="8,2", help="block lengths, comma-separated")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    model, tok = speclab.load("digits-dllm")
    prompts = digits.eval_prompts(a.n)
    rows = []
    for bl in [int(b) for b in a.blocks.split(",")]:
        for method, kw in POLICIES:
            ok, rounds, outside, t0 = {"ADD": 0, "SUM": 0}, 0, 0, time.perf_counter()
            for p in prompts:
                r = speclab.run((model, tok), p["prompt"], method, gen_length=digits.ANSWER_LEN, block_length=bl,
                                record="light", **kw)
                ok[p["task"]] += digits.check(p["prompt"], tok.decode(r.ids))
                rounds += r.trace.totals.target_forwards
                outside += sum(s.info.get("outside_block", 0) for s in r.trace.denoise)
            row = dict(method=method, params=kw, block_length=bl, add_exact=ok["ADD"] / a.n, sum_valid=ok["SUM"] / a.n,
                       rounds=rounds / len(prompts), outside_block_commits=outside / len(prompts),
                       wall_s=round(time.perf_counter() - t0, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        meta = {"target": "digits-dllm", "gen_length": digits.ANSWER_LEN, "n_per_task": a.n, "greedy": True,
                "machine": "busy shared CPU", "command": "scripts/ete_rounds.py " + " ".join(argv or sys.argv[1:])}
        Path(a.json).write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
