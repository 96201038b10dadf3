"""tau (new tokens per target forward) of `clover` against `medusa` on a prompt set, greedy, every
output checked against `ar`'s token for token. tau does not depend on the machine's load, so this
runs beside other work; it times nothing.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/clover_tau.py --prompts chat --limit 8 --tokens 64 \
        [--clover speclab/zoo/smollm2-clover] [--medusa smollm2-medusa]

Rows: both methods with the same static rank patterns (a chain 3 deep; Medusa's default 16-node
pattern 4 deep), then each method's own default tree (medusa: the calibrated tree of its heads;
clover: its dynamic tree).
"""
from __future__ import annotations

import argparse

import torch

import speclab
from speclab.decoding.drafters.heads import MEDUSA_PATHS
from speclab.models import zoo
from speclab.prompts import load_prompts

ROWS = [("chain, depth 3", dict(paths=[[0], [0, 0], [0, 0, 0]])),
        ("Medusa's 16-node pattern, depth 4", dict(paths=MEDUSA_PATHS)),
        ("each method's default tree", dict())]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--clover", default="smollm2-clover")
    ap.add_argument("--medusa", default="smollm2-medusa")
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = zoo.load(args.target)
    drafts = {"medusa": zoo.load(args.medusa), "clover": zoo.load(args.clover)}
    prompts = load_prompts(args.prompts, limit=args.limit)

    def run(method, p, **kw):
        q, chat = (p["chat"], True) if isinstance(p, dict) else (p, False)
        return speclab.generate(target, q, method, chat=chat, max_new_tokens=args.tokens, record=None, **kw)
    refs = [run("ar", p).ids for p in prompts]
    print(f"{args.prompts}, first {len(prompts)} prompts, {args.tokens} tokens, greedy")
    for label, kw in ROWS:
        line = []
        for method in ("medusa", "clover"):
            new = fwd = 0
            for p, ref in zip(prompts, refs):
                r = run(method, p, draft=drafts[method], **kw)
                assert r.ids == ref, f"{method} {kw} diverged from ar"
                new, fwd = new + r.trace.totals.new_tokens, fwd + r.trace.totals.target_forwards
            line.append(f"{method} tau {new / fwd:.3f}")
        print(f"{label:<36}" + "   ".join(line), flush=True)


if __name__ == "__main__":
    main()
