"""Where a bf16 `ar` token's time goes on speclab's CPU kernel: each native call timed.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/profile_ar.py [--prompts 4] [--threads 2]

Prints ms per token in the fused call of all the decoder layers and in the LM head, the rest (outside the
kernels), and each call's weight-read rate, beside the rates the bench's BandwidthProbe measures.
Needs an x86 CPU with AVX2 (where the kernel runs; SPECLAB_ISA picks its path). How to read it: docs/performance.md.
"""
import argparse
import time

import torch

import speclab
from speclab.bench.bandwidth import BandwidthProbe
from speclab.prompts import encode, load_prompts
from speclab.models import kernels, zoo


class Timed:
    """The kernel module with `layers` and `linear` timed (seconds, calls)."""

    def __init__(self, mod):
        self.mod, self.t = mod, {"layers": [0.0, 0], "linear": [0.0, 0]}

    def __getattr__(self, name):
        f = getattr(self.mod, name)
        if name not in self.t:
            return f

        def timed(*a):
            t0 = time.perf_counter()
            out = f(*a)
            self.t[name][0] += time.perf_counter() - t0
            self.t[name][1] += 1
            return out
        return timed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base, tok = zoo.load("smollm2-135m", dtype="bf16")
    if kernels.module() is None:
        raise SystemExit("speclab's CPU kernel does not run here (it needs an x86 CPU with AVX2: `speclab doctor` says why)")
    timed = kernels._module = Timed(kernels.module())
    items = load_prompts("chat", args.prompts)
    speclab.generate((base, tok), encode(tok, items[0], 16, None), "ar", max_new_tokens=16, record=None)  # warm-up
    for v in timed.t.values():
        v[:] = [0.0, 0]
    n, t0 = 0, time.perf_counter()
    for it in items:
        n += speclab.generate((base, tok), encode(tok, it, 128, None), "ar", max_new_tokens=128,
                              record=None).stats["new_tokens"]
    ms = (time.perf_counter() - t0) / n * 1e3
    layers_mb = sum(p.numel() * p.element_size() for p in base.model.layers.parameters()) / 1e6
    head_mb = base.lm_head.weight.numel() * base.lm_head.weight.element_size() / 1e6
    print(f"{n} tokens: {ms:.2f} ms a token")
    rest = ms
    for name, mb in (("layers", layers_mb), ("linear", head_mb)):
        s, c = timed.t[name]
        rest -= s / n * 1e3
        print(f"  {name:6} {c:6d} calls, {s / c * 1e3:.3f} ms a call ({mb:.2f} MB at {mb / (s / c) / 1e3:.1f} GB/s), "
              f"{s / n * 1e3:.2f} ms a token")
    print(f"  outside the kernels: {rest:.2f} ms a token")
    probe = BandwidthProbe()                 # the bench's own measure of the memory system
    probe.sample(5)
    rates = probe.summary()
    print(f"the bench's probe: a streaming read {rates['stream']['median']} GB/s, "
          f"a one-row product in the kernel {rates['gemv']['median']} GB/s (medians of 5)")


if __name__ == "__main__":
    main()
