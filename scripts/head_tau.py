"""tau (new tokens per target forward) of two drafters at the same tree on a prompt set, greedy,
every output checked against `ar`'s token for token; with the draft forwards a round costs each.
tau does not depend on the machine's load, so this runs beside other work; it times nothing.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_tau.py clover --prompts chat --limit 8 --tokens 64 \
        [--draft speclab-zoo/speclab_zoo/smollm2-clover] [--baseline smollm2-medusa]
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_tau.py falcon --draft DIR --prompts chat --limit 8 \
        --tokens 64 [--baseline smollm2-eagle]

clover against medusa: the same static rank patterns (a chain 3 deep; Medusa's default 16-node
pattern 4 deep), then each method's own default tree (medusa: the calibrated tree of its heads;
clover: its dynamic tree). falcon against eagle: EAGLE's default tree (5 nodes, width 3, 3 deep,
stop below 0.2), the same 4 deep, and a larger tree (10 nodes, 6 deep, no threshold).
"""
from __future__ import annotations

import argparse

import torch

import speclab
from speclab.decoding.drafters.heads import MEDUSA_PATHS
from speclab.models import zoo
from speclab.prompts import load_prompts

# method -> (the method it is measured against, the default drafts, the rows: (label, parameters))
PAIRS = {
    "clover": ("medusa", ("smollm2-clover", "smollm2-medusa"), [
        ("chain, depth 3", dict(paths=[[0], [0, 0], [0, 0, 0]])),
        ("Medusa's 16-node pattern, depth 4", dict(paths=MEDUSA_PATHS)),
        ("each method's default tree", dict())]),
    "falcon": ("eagle", (None, "smollm2-eagle"), [
        ("5 nodes, width 3, depth 3, threshold 0.2", dict(budget=5, width=3, depth=3, threshold=0.2)),
        ("5 nodes, width 3, depth 4, threshold 0.2", dict(budget=5, width=3, depth=4, threshold=0.2)),
        ("10 nodes, width 3, depth 6, no threshold", dict(budget=10, width=3, depth=6, threshold=None))]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("method", choices=sorted(PAIRS))
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", help="the method's draft: a directory or zoo name")
    ap.add_argument("--baseline", help="the draft of the method it is measured against")
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    base_method, (draft, base_draft), rows = PAIRS[args.method]
    draft, base_draft = args.draft or draft, args.baseline or base_draft
    if draft is None:
        ap.error(f"{args.method} ships no SmolLM2 draft: give --draft DIR")
    torch.set_num_threads(args.threads)
    target = zoo.load(args.target)
    drafts = {base_method: zoo.load(base_draft), args.method: zoo.load(draft)}
    prompts = load_prompts(args.prompts, limit=args.limit)

    def run(method, p, **kw):
        q, chat = (p["chat"], True) if isinstance(p, dict) else (p, False)
        return speclab.generate(target, q, method, chat=chat, max_new_tokens=args.tokens, record=None, **kw)
    refs = [run("ar", p).ids for p in prompts]
    print(f"{args.prompts}, first {len(prompts)} prompts, {args.tokens} tokens, greedy")
    for label, kw in rows:
        line = []
        for method in (base_method, args.method):
            new = fwd = dfwd = 0
            for p, ref in zip(prompts, refs):
                r = run(method, p, draft=drafts[method], **kw)
                assert r.ids == ref, f"{method} {kw} diverged from ar"
                t = r.trace.totals
                new, fwd, dfwd = new + t.new_tokens, fwd + t.target_forwards, dfwd + t.draft_forwards
            line.append(f"{method} tau {new / fwd:.3f} ({dfwd / fwd:.2f} draft forwards a round)")
        print(f"{label:<42}" + "   ".join(line), flush=True)


if __name__ == "__main__":
    main()
