"""tau (new tokens per target forward) of `falcon` against `eagle` at the same tree budget on a
prompt set, greedy, every output checked against `ar`'s token for token; with the head forwards a
round costs each. tau does not depend on the machine's load, so this runs beside other work; it
times nothing.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/falcon_tau.py --falcon DIR --prompts chat --limit 8 \
        --tokens 64 [--eagle smollm2-eagle]

Rows: EAGLE's default tree (5 nodes, width 3, 3 deep, stop below 0.2), the same 4 deep, and a
larger tree (10 nodes, 6 deep, no threshold), each the same for both methods.
"""
from __future__ import annotations

import argparse

import torch

import speclab
from speclab.models import zoo
from speclab.prompts import load_prompts

ROWS = [("5 nodes, width 3, depth 3, threshold 0.2", dict(budget=5, width=3, depth=3, threshold=0.2)),
        ("5 nodes, width 3, depth 4, threshold 0.2", dict(budget=5, width=3, depth=4, threshold=0.2)),
        ("10 nodes, width 3, depth 6, no threshold", dict(budget=10, width=3, depth=6, threshold=None))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--falcon", required=True, help="a Falcon head directory or zoo name")
    ap.add_argument("--eagle", default="smollm2-eagle")
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = zoo.load(args.target)
    drafts = {"eagle": zoo.load(args.eagle), "falcon": zoo.load(args.falcon)}
    prompts = load_prompts(args.prompts, limit=args.limit)

    def run(method, p, **kw):
        q, chat = (p["chat"], True) if isinstance(p, dict) else (p, False)
        return speclab.generate(target, q, method, chat=chat, max_new_tokens=args.tokens, record=None, **kw)
    refs = [run("ar", p).ids for p in prompts]
    print(f"{args.prompts}, first {len(prompts)} prompts, {args.tokens} tokens, greedy")
    for label, kw in ROWS:
        line = []
        for method in ("eagle", "falcon"):
            new = fwd = dfwd = 0
            for p, ref in zip(prompts, refs):
                r = run(method, p, draft=drafts[method], **kw)
                assert r.ids == ref, f"{method} {kw} diverged from ar"
                t = r.trace.totals
                new, fwd, dfwd = new + t.new_tokens, fwd + t.target_forwards, dfwd + t.draft_forwards
            line.append(f"{method} tau {new / fwd:.3f} ({dfwd / fwd:.2f} head forwards a round)")
        print(f"{label:<42}" + "   ".join(line), flush=True)


if __name__ == "__main__":
    main()
