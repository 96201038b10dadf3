"""Where a speculative round's time goes on the real model: every stage timed, native calls apart.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/profile_round.py "eagle[lookup=6]" --prompts code-edit --limit 10

Prints ms per round of each stage (the verify's forward, its layers and head; drafting and the
draft's own forwards; reading the target's features; accepting and booking) and how much of each
ran in speclab's native kernel; the rest is Python and torch's small ops. Wraps the stages in
place (this process only), so it costs a little time of its own. How to read it: docs/performance.md.
"""
import argparse
import collections
import time

import torch

import speclab
from speclab.prompts import encode, load_prompts
from speclab.bench.runner import parse_methods
from speclab.decoding import speculative
import speclab.decoding.drafters.heads  # noqa: F401  (every drafter class defined before they are wrapped)
import speclab.decoding.drafters.lookahead  # noqa: F401
import speclab.decoding.drafters.recycling  # noqa: F401
import speclab.decoding.drafters.trees  # noqa: F401
from speclab.models import kernels, zoo
from speclab.models.lean.forward import LeanLM

DRAFTS = {"eagle": "smollm2-eagle", "eagle-chain": "smollm2-eagle", "medusa": "smollm2-medusa",
          "draft-model": "smollm2-draft"}


class Profile:
    def __init__(self):
        self.stack = ["outside"]
        self.wall, self.native = collections.Counter(), collections.Counter()

    def wrap(self, owner, name, label):
        f = getattr(owner, name)

        def timed(*a, **k):
            lab = label() if callable(label) else label
            if lab == self.stack[-1]:           # a subclass's stage calling its base's: counted once
                return f(*a, **k)
            self.stack.append(lab)
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.wall[lab] += time.perf_counter() - t0
                self.stack.pop()
        setattr(owner, name, timed)

    def kernel(self, mod):
        prof = self

        class Timed:                    # the kernel module with its two heavy calls timed
            def __getattr__(self, name):
                f = getattr(mod, name)
                if name not in ("layers", "linear"):
                    return f

                def timed(*a):
                    t0 = time.perf_counter()
                    out = f(*a)
                    prof.native[prof.stack[-1]] += time.perf_counter() - t0
                    return out
                return timed
        return Timed()


def drafters(cls) -> set:
    """Every drafter class speclab defines (their own propose / observe are timed)."""
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | drafters(sub)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("method", help='a bench method spec, e.g. "eagle" or "draft-model[k=2]"')
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    spec = parse_methods(args.method)[0]
    target = zoo.load_shared("smollm2-135m", dtype="bf16")
    draft = zoo.load_shared(DRAFTS[spec.method], dtype="bf16") if spec.method in DRAFTS else None
    if kernels.module() is None:
        raise SystemExit("speclab's CPU kernel does not run here (it needs an x86 CPU with AVX2: `speclab doctor` says why)")
    items = load_prompts(args.prompts, args.limit)

    def run():
        rounds = 0
        for it in items:
            r = speclab.generate(target, encode(target[1], it, args.max_new_tokens, None), spec.method, draft=draft,
                                 max_new_tokens=args.max_new_tokens, record=None, **spec.params)
            rounds += r.stats["target_forwards"]
        return rounds
    run()                                               # warm-up: the kernel built, caches filled

    p = Profile()
    below = lambda suffix: lambda: p.stack[-1] + suffix
    p.wrap(LeanLM, "forward", lambda: "verify" if p.stack[-1] == "round" else p.stack[-1] + ": forward")
    p.wrap(LeanLM, "_fused_layers", below(": layers"))
    p.wrap(LeanLM, "final_norm_head", below(": head"))
    for cls in drafters(speculative.Drafter):
        for name in ("propose", "observe"):
            if name in cls.__dict__:
                p.wrap(cls, name, "draft" if name == "propose" else "read features")
    p.wrap(speculative, "speculative_round", "round")
    kernels._module = p.kernel(kernels.module())
    t0 = time.perf_counter()
    rounds = run()
    total = time.perf_counter() - t0
    print(f"{args.method} on {args.prompts} ({len(items)} prompts): {rounds} rounds, {total / rounds * 1e3:.2f} ms a round")
    print(f"  {'stage':30s} {'ms a round':>10s} {'native':>8s}")
    for k in sorted(p.wall, key=lambda k: -p.wall[k]):
        print(f"  {k:30s} {p.wall[k] / rounds * 1e3:10.3f} {p.native[k] / rounds * 1e3:8.3f}")
    rest = p.wall["round"] - sum(p.wall[k] for k in ("verify", "draft", "read features"))
    print(f"  {'the round outside those':30s} {rest / rounds * 1e3:10.3f}")
    print(f"  {'outside the rounds':30s} {(total - p.wall['round']) / rounds * 1e3:10.3f}")


if __name__ == "__main__":
    main()
