"""The kernel's product alone, row count by row count: multiply-adds a second of one packed matrix
on each kernel path, its weights resident in a core's L2 or streamed from memory.

    .venv/bin/python scripts/kernel_products.py [--paths avx512bf16,avx2] [--shape 49152x576]
        [--rows 1,2,3,4,6,8] [--threads 2] [--copies 8] [--rounds 7]

--copies 1 keeps one matrix (a small one stays in L2, the LM head in L3); --copies 8 cycles through
8 of them, past every cache, as a forward streams its weights. The paths and row counts take turns
round by round and each number is the best round, so a drift of a shared machine falls on all
alike. Prints, per path, GMAC/s at each row count and the time of T rows over one row's.
docs/performance.md ("Where a 6-row AVX2 verify's time goes") has a run.
"""
from __future__ import annotations

import argparse
import time

import torch


def shape_rows(shape: str, rows: str) -> tuple[int, int, list[int]]:
    """--shape N x K and --rows 1,2,6, checked: ValueError saying what to give."""
    from speclab.models import kernels
    try:
        N, K = (int(v) for v in shape.lower().split("x"))
        Ts = [int(t) for t in rows.split(",")]
    except ValueError:
        raise ValueError(f"--shape is N x K (e.g. 49152x576) and --rows a list (1,2,6): got {shape!r}, {rows!r}")
    if N % kernels.BLOCK or K % 2 or min(Ts) < 1:
        raise ValueError(f"N must be a multiple of {kernels.BLOCK}, K even and every row count >= 1")
    return N, K, Ts


def main():
    from speclab.models import kernels
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", help="a comma list (default: every path this CPU runs but AMX)")
    ap.add_argument("--shape", default="49152x576", help="N x K of the matrix (SmolLM2's LM head by default)")
    ap.add_argument("--rows", default="1,2,3,4,6,8")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--copies", type=int, default=8, help="matrices cycled through (1: cache resident)")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    try:
        N, K, rows = shape_rows(a.shape, a.rows)
        paths = kernels.paths_asked(a.paths)
    except ValueError as e:
        raise SystemExit(f"kernel_products: {e}")
    torch.set_num_threads(a.threads)
    mods = {p: kernels.build(p) for p in paths}
    gen = torch.Generator().manual_seed(0)
    mats = [next(iter(mods.values())).pack((torch.randn(N, K, generator=gen) * 0.05).bfloat16()) for _ in range(a.copies)]
    xs = {T: torch.randn(T, K, generator=gen).bfloat16() for T in rows}
    best: dict = {}
    same: dict = {}                                              # the paths but AMX give the same bits
    for _ in range(a.rounds):
        for p, mod in mods.items():
            for T in rows:
                y = mod.linear(xs[T], mats[0])                   # warm, and the paths must agree
                if p != "amx":
                    assert torch.equal(same.setdefault(T, y), y), f"{p} gives other bits than {paths[0]} at {T} rows"
                n = max(1, int(2e8 // (T * N * K))) * len(mats)
                t0 = time.perf_counter()
                for i in range(n):
                    mod.linear(xs[T], mats[i % len(mats)])
                dt = (time.perf_counter() - t0) / n
                best[p, T] = min(best.get((p, T), dt), dt)
    where = "streamed" if a.copies > 1 else "one matrix, cache resident"
    print(f"{kernels.info()['cpu']}, {N} x {K} bf16 ({where}), {a.threads} threads; GMAC/s, and T rows / 1 row in time")
    for p in paths:
        one = best[p, 1] if 1 in rows else None
        print(f"{p:11s} " + "  ".join(f"T{T} {T * N * K / best[p, T] / 1e9:5.1f}" + (f" ({best[p, T] / one:.2f})" if one else "")
                                     for T in rows))


if __name__ == "__main__":
    main()
